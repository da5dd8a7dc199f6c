"""Spawn-burst benchmark: how fast ONE `proc/new` handle takes spawn
requests while agents run.

    python bench/spawns.py [--quick] [--spawns N] [--background N] [--delay S]
                           [--out bench/results-spawns.json] [--profile DIR]

1. A real rnixfs mount against a derived-reply OpenAI server in its own
   process (the one bench/agents.py uses) that answers each request after
   `--delay` seconds (default 1 s), so agents overlap and stay alive.
2. `--background` agents (default 200) are spawned first and left running
   (6 model requests each).
3. Then one process opens `proc/new` once and writes `--spawns` requests
   (default 1000, --quick 200), one request per write(2), timing the
   writes; then reads back the PIDs from the same handle and checks that
   each request got its own PID.
4. Optionally (`--profile DIR`) `py-spy record` samples the daemon during
   the burst and writes its collapsed stacks to DIR/spawns.txt (py-spy must
   be installed; `py-spy record -f flamegraph` draws the same as an SVG).

Reported: spawn writes per second, the daemon's CPU time per spawn, and
whether every agent (background and burst) exited 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for p in (str(REPO), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

import run as bench_run  # noqa: E402  (mounts, cleanup by PID, helpers)
import agents as bench_agents  # noqa: E402  (the derived-reply server)

PROVIDER_TIMEOUT = 10.0  # what bench/run.py's providers.yaml gives the scripted provider


def cmd_serve(args) -> int:
    """Helper process: the derived-reply server, each reply after `delay` s.
    `stats` on stdin prints the counters; EOF stops it."""
    srv = bench_agents.make_server(host="127.0.0.1", port=0)
    plan = srv._plan

    def delayed(body, headers):
        out = plan(body, headers)
        out["delay"] = args.delay
        return out

    srv._plan = delayed
    srv.start()
    print(f"listening on {srv.url}", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps(srv.stats()), flush=True)
            else:
                print("error: unknown command", flush=True)
    finally:
        srv.stop()
    return 0


def spawn_burst(mnt: Path, n: int, tag: str) -> tuple[list[int], float]:
    """n plain-text requests through one O_RDWR handle; the seconds the
    writes took, then the PIDs read back."""
    fd = os.open(mnt / "proc" / "new", os.O_RDWR)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            os.write(fd, f"spawn burst {tag}-{i}, read {bench_agents.FILE}".encode())
        took = time.perf_counter() - t0
        out = b""
        while chunk := os.read(fd, 65536):
            out += chunk
    finally:
        os.close(fd)
    return [int(x) for x in out.split()], took


def run(args) -> dict:
    n = args.spawns or (200 if args.quick else 1000)
    out: dict = {"meta": {
        "quick": args.quick, "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip()},
        "config": {"spawns": n, "background_agents": args.background, "reply_delay_s": args.delay,
                   "requests_per_agent": bench_agents.STEPS + 1}}
    res = bench_run.Resources()
    tmp = Path(tempfile.mkdtemp(prefix="rnixfs-bench-spawns-"))
    try:
        srv = subprocess.Popen([sys.executable, str(BENCH / "spawns.py"), "serve", "--delay", str(args.delay)],
                               cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        res.add_proc(srv)
        line = srv.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"server did not start: {line!r}")
        mnt, dpid = bench_run.mount_rnixfs(res, tmp, line.split()[-1], linger=10 ** 7)
        (tmp / "project" / bench_agents.FILE).write_text(bench_agents.FILE_TEXT)
        bench_run.log(f"rnixfs at {mnt} (daemon {dpid})")
        warm, _ = spawn_burst(mnt, 10, "warm")
        bench_run.wait_all_zombie(mnt, 10, timeout=120, last_pid=max(warm))
        background = []
        if args.background:
            background, took = spawn_burst(mnt, args.background, "background")
            bench_run.log(f"{len(background)} background agents spawned in {took:.2f} s")
        live = bench_run.counts(mnt)
        prof = None
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            prof = subprocess.Popen(["py-spy", "record", "-p", str(dpid), "-r", "200", "-f", "raw", "-o",
                                     str(Path(args.profile) / "spawns.txt")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            res.add_proc(prof)
            time.sleep(1.0)
        meter = bench_run.DaemonCpu(dpid)  # the daemon and its worker processes
        cpu0 = meter.sample()
        pids, took = spawn_burst(mnt, n, "burst")
        cpu = meter.sample() - cpu0
        if prof is not None:
            prof.send_signal(2)
            prof.wait(60)
        bench_run.log(f"{n} spawn writes on one handle: {took:.2f} s, {n / took:.0f}/s "
                      f"({live.get('running', 0) + live.get('created', 0)} agents alive at the start)")
        if len(pids) != n or len(set(pids)) != n:
            raise RuntimeError(f"{n} writes, {len(pids)} PIDs read back, {len(set(pids))} distinct")
        every = warm + background + pids
        bench_run.wait_all_zombie(mnt, len(every), timeout=max(300.0, len(every) * 0.5), last_pid=max(every))
        bad = [p for p in every
               if json.loads((mnt / "proc" / str(p) / "status").read_bytes())["exit_code"] != 0]
        out["spawn_burst"] = {
            "writes": n, "seconds": round(took, 3), "writes_per_s": round(n / took, 1),
            "daemon_cpu_ms_per_spawn": round(cpu / n * 1000, 3),
            "agents_alive_at_start": live.get("running", 0) + live.get("created", 0),
            "distinct_pids": len(set(pids)), "agents_not_exited_0": len(bad)}
    finally:
        res.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rnixfs spawn-burst benchmark (see the module docstring)")
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="200 spawns instead of 1000")
    ap.add_argument("--spawns", type=int, help="spawn writes in the burst")
    ap.add_argument("--background", type=int, default=200, help="agents running during the burst")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds before each model reply")
    ap.add_argument("--profile", help="directory for a py-spy flame graph of the daemon during the burst")
    ap.add_argument("--out", default=str(BENCH / "results-spawns.json"))
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return cmd_serve(args)
    if not 0 <= args.delay < PROVIDER_TIMEOUT:
        ap.error(f"--delay must be below the provider's timeout ({PROVIDER_TIMEOUT:g} s, bench/run.py)")
    result = run(args)
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
