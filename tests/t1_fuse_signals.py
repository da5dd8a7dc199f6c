"""Finding a blocked reader's descendants (rnixfs/fuse/signals.py): from
the kernel's per-thread children lists, the same as a scan of the host."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rnixfs.fuse import signals


@pytest.fixture
def family():
    """A child that runs a grandchild: python -> sleep."""
    code = "import subprocess, sys; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); p.wait()"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        yield child.pid, grandchild
    finally:
        child.kill()
        child.wait()
        try:
            os.kill(grandchild, 9)
        except (ProcessLookupError, UnboundLocalError):
            pass


@pytest.mark.skipif(not signals._CHILDREN_FILES, reason="kernel without /proc/<pid>/task/<tid>/children")
def test_children_match_a_scan_of_the_host(family):
    child, grandchild = family
    assert child in signals._children(os.getpid())
    assert signals._children(child) == [grandchild]
    signals._tree_at = 0.0  # a fresh scan
    tree = signals._children_map()
    assert sorted(tree.get(child, [])) == sorted(signals._children(child))
    assert signals._children(2 ** 22 + 7) == []  # no such process: no children, no error


def test_a_quiet_family_waits_but_a_gone_opener_is_an_interrupt(family):
    child, grandchild = family
    assert not signals.reader_interrupted(child)
    os.kill(child, 9)
    deadline = time.monotonic() + 10
    while not signals.reader_interrupted(child):  # a zombie or gone: nobody waits any more
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_without_children_files_the_scan_answers(family, monkeypatch):
    child, grandchild = family
    monkeypatch.setattr(signals, "_CHILDREN_FILES", False)
    signals._tree_at = 0.0
    assert signals._children(child) == [grandchild]
