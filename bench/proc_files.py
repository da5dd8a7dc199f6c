"""proc/ file costs against a minimal pyfuse3 filesystem, side by side.

    python bench/proc_files.py [--procs 10000] [--rounds 10] [--per-round 300]

Measures (A/B rounds, ratios of medians; see bench/README.md for the method):

1. idle status: open+read+close of a zombie's ``proc/<pid>/status`` (it
   never changes, so the page cache may answer) vs the minimal file;
2. live status: the same on a running process's ``status`` (direct_io);
3. ``ls -l proc`` with ``--procs`` processes vs the minimal ``dir/``;
4. ``getfattr -d`` on a proc/<pid> directory (one query per entry).

Reuses bench/run.py's lifecycle helpers: everything started is stopped by PID.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402  (bench/run.py)


def mount_variant(res, tmp: Path, name: str, entries: int, size: int, flag: str) -> Path:
    """bench/minimal_variants.py: the minimal plus xattrs or flush."""
    mnt = tmp / name
    mnt.mkdir()
    p = subprocess.Popen([sys.executable, str(bench.REPO / "bench" / "minimal_variants.py"), str(mnt), flag,
                          "--entries", str(entries), "--size", str(size)],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    res.add_proc(p)
    res.add_mount(mnt, None)
    if not p.stdout.readline().startswith("ready"):
        raise RuntimeError(f"{name} did not start")
    return mnt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    res = bench.Resources()
    out: dict = {"procs": args.procs}
    tmp = Path(tempfile.mkdtemp(prefix="rnixfs-procfiles-"))
    try:
        if True:
            url = bench.start_scripted_server(res)
            mnt, dpid = bench.mount_rnixfs(res, tmp, url, linger=1e7)
            bench.log(f"spawning {args.procs}")
            pids: list[int] = []
            while len(pids) < args.procs:
                got, _ = bench.spawn_handle(mnt, min(1000, args.procs - len(pids)), "bench")
                pids += got
            bench.wait_all_zombie(mnt, len(pids), timeout=3600, last_pid=max(pids))
            live_fd = os.open(mnt / "proc" / "new", os.O_RDWR)
            os.write(live_fd, b'{"intent": "[[delay:600]] live", "step_timeout": 0}')
            live = int(os.read(live_fd, 100))
            os.close(live_fd)
            zombie_status = str(mnt / "proc" / str(pids[0]) / "status")
            live_status = str(mnt / "proc" / str(live) / "status")
            size = len(Path(zombie_status).read_bytes())
            small = bench.mount_minimal(res, tmp, "minimal-small", 16, size)
            mfile = str(small / "file")
            ffile = str(mount_variant(res, tmp, "minimal-flush", 16, size, "--flush") / "file")
            r, n = args.rounds, args.per_round
            bench.log("settling: the daemon commits the last records")
            bench.compare("warm-up", lambda: bench.orc(zombie_status), lambda: bench.orc(mfile), 2, n)
            bench.log("idle (zombie) status")
            out["idle_status"] = bench.compare("open+read+close", lambda: bench.orc(zombie_status),
                                               lambda: bench.orc(mfile), r, n)
            out["idle_status_vs_flush"] = bench.compare("open+read+close", lambda: bench.orc(zombie_status),
                                                        lambda: bench.orc(ffile), r, n)
            bench.log("live status")
            out["live_status"] = bench.compare("open+read+close", lambda: bench.orc(live_status),
                                               lambda: bench.orc(mfile), r, n)
            entries = len(os.listdir(mnt / "proc"))
            big = bench.mount_minimal(res, tmp, "minimal-big", entries, size)
            bench.log(f"ls -l proc ({entries} entries)")
            proc_dir, mdir = str(mnt / "proc"), str(big / "dir")
            out["ls_l"] = bench.compare("ls -l", lambda: bench.timed_subprocess(["ls", "-l", proc_dir]),
                                        lambda: bench.timed_subprocess(["ls", "-l", mdir]), max(3, r // 2), 1)
            xdir = str(mount_variant(res, tmp, "minimal-xattrs", entries, size, "--xattrs") / "dir")
            out["ls_l_vs_xattrs"] = bench.compare(
                "ls -l", lambda: bench.timed_subprocess(["ls", "-l", proc_dir]),
                lambda: bench.timed_subprocess(["ls", "-l", xdir]), max(3, r // 2), 1)
            pdir = str(mnt / "proc" / str(pids[0]))
            out["getfattr"] = {"median_us": bench.summary(
                [bench.timed_subprocess(["getfattr", "-d", pdir]) for _ in range(20)])["median_us"]}
            out["daemon_pid"] = dpid
    finally:
        bench.Resources.close(res)
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for key in ("idle_status", "idle_status_vs_flush", "live_status", "ls_l", "ls_l_vs_xattrs"):
        print(f"{key:12} ratio {out[key]['ratio']}  rnixfs {out[key]['rnixfs']['median_us']} us"
              f"  minimal {out[key]['minimal']['median_us']} us", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
