"""Fail a test on WARNING-or-worse log lines it did not expect.

Two sources are watched: records logged in the test process itself (the
kernel, drivers and adapter run in-process in tiers t1/t2), and the
``daemon.log`` of every mount a test made (tier t3). A test declares what
it expects with ``@pytest.mark.expect_log("regex", ...)`` (on the test,
its class or the module's ``pytestmark``); each regex is searched in the
line. Modelled on s3ql's ``pytest_checklogs``. See docs/architecture.md,
"Tests".
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

LEVEL = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ")
# Every test's project is a fresh directory nobody trusted: the daemon rightly
# warns when its skills load. That is the fixture's doing, not the test's.
FIXTURE_EXPECTED = [re.compile(r'untrusted project "[^"]*": \d+ skill root')]
_watched: dict[Path, int] = {}  # daemon.log -> bytes already checked


def watch_daemon_log(path: Path) -> None:
    """Called when a mount is made: its log is checked after every test."""
    _watched.setdefault(Path(path), 0)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")
        except Exception:  # a record that cannot format is itself worth failing on
            self.lines.append(f"{record.levelname} {record.name}: {record.msg!r}")


def _new_daemon_lines() -> list[str]:
    out: list[str] = []
    for path, done in list(_watched.items()):
        try:
            with open(path, "rb") as f:
                f.seek(done)
                data = f.read()
        except FileNotFoundError:
            continue
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next check
        _watched[path] = done + end
        lines = data[:end].decode("utf-8", "replace").splitlines()
        logged = False  # a traceback right after a logged record belongs to it
        for line in lines:
            if LEVEL.match(line):
                out.append(line)
                logged = True
            elif line.startswith("Traceback") and not logged:
                out.append(line)  # printed bare: nothing logged it, so nothing expected it
            elif line[:4].isdigit():
                logged = False  # another record (INFO or DEBUG) began
    return out


def _expected(item) -> list[re.Pattern]:
    pats: list[re.Pattern] = []
    for mark in item.iter_markers("expect_log"):
        pats += [re.compile(p) for p in mark.args]
    return pats


@pytest.fixture(autouse=True)
def _check_logs(request):
    collector = _Collector()
    root = logging.getLogger()
    root.addHandler(collector)
    try:
        yield
    finally:
        root.removeHandler(collector)
    lines = collector.lines + _new_daemon_lines()
    pats = _expected(request.node) + FIXTURE_EXPECTED
    unexpected = [line for line in lines if not any(p.search(line) for p in pats)]
    if unexpected:
        shown = "\n".join(unexpected[:20])
        pytest.fail(f"unexpected log lines (declare them with @pytest.mark.expect_log):\n{shown}",
                    pytrace=False)
