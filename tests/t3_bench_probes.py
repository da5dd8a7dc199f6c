"""The benchmark's own probes measure what they claim (bench/README.md).

- bench/cache_policy.py tells direct_io, keep_cache and page_cache apart on
  the real minimal pyfuse3 mount (bench/minimal_fs.py), so the idle-status
  row compares rnixfs with the minimal file of the same policy;
- bench/run.py's DaemonCpu (used by table.py, agents.py, spawns.py) sums the CPU of a process and of its
  `python -m rnixfs.worker` descendants (also after a worker exited, until
  it is reaped) and leaves any other child out (agents' commands).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from mountutil import have_fuse, wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import cache_policy  # noqa: E402
import run as bench_run  # noqa: E402
import table as bench_table  # noqa: E402


@pytest.fixture
def minimal(tmp_path):
    if not have_fuse():
        pytest.skip("needs /dev/fuse and fusermount3")
    res = bench_run.Resources()
    try:
        yield bench_run.mount_minimal(res, tmp_path, "minimal", 3, 900)
    finally:
        res.close()
    assert not bench_run.mounted(tmp_path / "minimal")


def test_cache_policy_probe_tells_the_three_apart(minimal):
    assert cache_policy.policy(str(minimal / "file")) == "page_cache"
    assert cache_policy.policy(str(minimal / "file_keep_cache")) == "keep_cache"
    assert cache_policy.policy(str(minimal / "file_direct_io")) == "direct_io"
    # all three serve the same bytes
    data = {(minimal / f).read_bytes() for f in bench_table.MINIMAL_FILE.values()}
    assert len(data) == 1 and len(data.pop()) == 900


def test_cache_policy_probe_refuses_an_empty_file(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        cache_policy.policy(str(tmp_path / "empty"))


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_daemon_cpu_counts_workers_not_other_children(tmp_path):
    # A stand-in daemon: two `python -m rnixfs.worker` children (a fake
    # package first on their PYTHONPATH) burning 0.4 s of CPU each, and one
    # other child (an agent's command) burning 1.0 s. The parent reaps
    # them only when told, so exited workers stay zombies meanwhile.
    pkg = tmp_path / "fake" / "rnixfs" / "worker"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(BURN.format(s=0.4))
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""\
        import subprocess, sys
        kids = [subprocess.Popen([sys.executable, "-m", "rnixfs.worker"]) for _ in range(2)]
        kids.append(subprocess.Popen([sys.executable, "-c", {BURN.format(s=1.0)!r}]))
        print(" ".join(str(k.pid) for k in kids), flush=True)
        sys.stdin.readline()
        for k in kids:
            k.wait()
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    p = subprocess.Popen([sys.executable, str(parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env, cwd=tmp_path)  # not the repo: `-m` looks in cwd first
    try:
        kids = [int(x) for x in p.stdout.readline().split()]
        meter = bench_run.DaemonCpu(p.pid)
        start = meter.sample()

        def all_exited():
            meter.sample()
            return all(psutil.Process(k).status() == psutil.STATUS_ZOMBIE for k in kids)

        wait_for(all_exited, timeout=120, interval=0.1, what="the children to exit")
        used = meter.sample() - start
        assert meter.workers_max == 2
        assert meter.workers_now == 0  # zombies are not running workers
        # 0.8 s of the workers, plus what they had used before `start` and
        # the parent's little; the other child's 1.0 s is not in it
        assert 0.5 <= used < 1.5, used
    finally:
        p.stdin.close()
        p.wait(30)
