"""Every row of the load table, in one run, each side by side with its baseline.

    python bench/table.py [--quick] [--out bench/results-table.json]
    python bench/table.py --profile bench/profile.txt   # py-spy during the load, then stop

1. Idle `status`: open+read+close of a zombie's proc/<pid>/status vs the
   minimal pyfuse3 file (bench/minimal_fs.py) of the same cache policy
   (probed from outside, bench/cache_policy.py), and vs pyfuse3's default
   page-cached file; interleaved A/B rounds.
2. Load: N agents (default 1000, --quick 100) of 6 model requests each
   (5 `Read` tool steps + a final answer) against a loopback
   OpenAI-compatible server answering after --delay s (default 1, so the
   agents overlap), all spawned at once through ONE proc/new handle; then a
   plain trio + httpx client making the same requests (the very bodies
   rnixfs sent), all agents at once, each with its own client. Measured:
   - the spawn writes on that handle, while the agents already spawned run;
   - `statx(AT_STATX_FORCE_SYNC)` (always a GETATTR to the daemon) and plain
     `stat` (what `ls` does) of proc/new and a status file, in a separate
     process, on the idle mount, during the plain side and during the load;
   - CPU per model request: the daemon's own process plus every descendant
     whose command line is a worker (`python -m rnixfs.worker`), not the
     server and not agents' shell commands; vs the plain client's process;
   - every agent checked: zombie, exit 0, 6 steps (failures counted).
3. Fill proc/ to --processes (default 10 000, --quick 1000) with agents that
   answer at once, then `ls -l proc` vs a minimal directory of as many
   entries (and os.listdir), interleaved rounds.

Prints one table (absolute numbers, ratios, the goal of each row), then the
JSON (also written to --out). See bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _p in (str(REPO), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import agents as bench_agents  # noqa: E402  (bench/agents.py: server, stat loop, plain client)
import cache_policy  # noqa: E402
import run as bench_run  # noqa: E402  (bench/run.py: mounts, cleanup by PID, A/B rounds)

REQUESTS = bench_agents.STEPS + 1  # model requests per agent
MINIMAL_FILE = {"page_cache": "file", "keep_cache": "file_keep_cache", "direct_io": "file_direct_io"}
GOALS = {  # the targets; "checked" is the bar the held-back run applies, where stricter
    "statx_new_p99_ms": 10.0, "statx_new_max_ms": 50.0, "stat_max_ms": 50.0, "cpu_ratio": 1.3,
    "spawn_writes_per_s": 500.0, "ls_l_ratio": 3.0, "status_ratio": 1.5, "status_ratio_checked": 1.3,
}


# -- py-spy ------------------------------------------------------------------------------------


class Profiler:
    """`py-spy record` of the daemon (and its worker subprocesses) in raw
    (collapsed stack) format, only samples holding the GIL (Python at work,
    not the idle threads of trio's thread cache); stopped by its PID with SIGINT."""

    def __init__(self, res: bench_run.Resources, dpid: int, out: Path, rate: int):
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not os.access(exe, os.X_OK):
            raise SystemExit("bench: --profile needs py-spy (pip install py-spy)")
        self.out = out
        self.p = subprocess.Popen([exe, "record", "-p", str(dpid), "--subprocesses", "--gil", "--nolineno", "--format", "raw",
                                   "--rate", str(rate), "-o", str(out)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        res.add_proc(self.p)
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> dict:
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)
        return summarize_profile(self.out)


def summarize_profile(path: Path, top: int = 25) -> dict:
    """Top frames of a py-spy raw profile: by own samples (the leaf) and by
    samples with the frame anywhere on the stack (inclusive)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    files: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        total += n
        frames = [f for f in stack.split(";") if not f.startswith("process ")]  # --subprocesses label
        if not frames:
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
        for f in {f.rpartition("(")[2].rstrip(")") for f in frames}:
            files[f] = files.get(f, 0) + n
    pct = lambda d: [{"frame": f, "samples": c, "pct": round(100 * c / total, 1)}
                     for f, c in sorted(d.items(), key=lambda x: -x[1])[:top]]
    return {"samples": total, "own": pct(own), "inclusive": pct(incl), "files_inclusive": pct(files)}


# -- the load: rnixfs side --------------------------------------------------------------------


def spawn_agents_timed(mnt: Path, n: int, tag: str, fast: bool = False) -> tuple[list[int], list[int], float]:
    """n JSON spawn requests, one write(2) each, through ONE O_RDWR handle on
    proc/new; PIDs read back after. Returns (pids, ns per write, seconds)."""
    per: list[int] = []
    clock = time.perf_counter_ns
    fd = os.open(mnt / "proc" / "new", os.O_RDWR)
    try:
        t0 = clock()
        for i in range(n):
            intent = (f"{bench_agents.FAST} {tag}-{i}" if fast else
                      f"bench agent {tag}-{i}, read {bench_agents.FILE} {bench_agents.STEPS} times")
            data = json.dumps({"intent": intent}).encode()
            t = clock()
            os.write(fd, data)
            per.append(clock() - t)
        secs = (clock() - t0) / 1e9
        out = b""
        while chunk := os.read(fd, 65536):
            out += chunk
    finally:
        os.close(fd)
    pids = [int(x) for x in out.split()]
    if len(pids) != n:
        raise RuntimeError(f"spawned {n}, read back {len(pids)} PIDs")
    return pids, per, secs


def check_agents(mnt: Path, pids: list[int], steps: int) -> dict:
    """Every agent a zombie with exit 0 and `steps` model steps; count the rest."""
    bad = {}
    for pid in pids:
        try:
            st = json.loads((mnt / "proc" / str(pid) / "status").read_bytes())
        except (OSError, ValueError) as exc:
            st = {"error": f"status unreadable: {exc!r}"}
        if st.get("state") != "zombie" or st.get("exit_code") != 0 or st.get("steps") != steps:
            bad[pid] = {"state": st.get("state"), "exit_code": st.get("exit_code"), "steps": st.get("steps"),
                        "error": st.get("error")}
    codes: dict[str, int] = {}
    for b in bad.values():
        codes[str(b["exit_code"])] = codes.get(str(b["exit_code"]), 0) + 1
    return {"checked": len(pids), "not_clean": len(bad), "exit_codes_not_clean": codes,
            "examples": dict(list(bad.items())[:5])}


def compare_many(fn_a, baselines: dict, rounds: int, per_round: int) -> dict:
    """Like run.py's compare(), with several baselines in the same rounds (the
    order rotates each round), so a disturbance on the machine hits every
    side: {name: {rnixfs, minimal, ratio, ratio_per_round_median}}, all
    ratios against the same rnixfs samples."""
    import gc

    sides = [("rnixfs", fn_a), *baselines.items()]
    for _ in range(max(3, per_round // 10)):  # warm the dentry/attr/page caches
        for _, fn in sides:
            fn()
    got: dict[str, list[float]] = {name: [] for name, _ in sides}
    per_round_ratios: dict[str, list[float]] = {name: [] for name in baselines}
    gc.disable()
    try:
        for r in range(rounds):
            k = r % len(sides)
            this = {}
            for name, fn in sides[k:] + sides[:k]:
                this[name] = [fn() for _ in range(per_round)]
                got[name] += this[name]
            for name in baselines:
                per_round_ratios[name].append(statistics.median(this["rnixfs"]) / statistics.median(this[name]))
    finally:
        gc.enable()
    a = bench_run.summary(got["rnixfs"])
    out = {}
    for name in baselines:
        b = bench_run.summary(got[name])
        out[name] = {"name": f"open+read+close vs minimal {name}", "rnixfs": a, "minimal": b,
                     "ratio": round(a["median_us"] / b["median_us"], 2),
                     "ratio_per_round_median": round(statistics.median(per_round_ratios[name]), 2),
                     "rounds": rounds, "per_round": per_round}
    return out


def ms_pct(ns: list[int]) -> dict:
    s = sorted(ns)
    if not s:
        return {"n": 0}
    q = lambda p: round(s[min(len(s) - 1, int(p * len(s)))] / 1e6, 3)
    return {"p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": round(s[-1] / 1e6, 3), "n": len(s)}


def rnixfs_load(mnt: Path, dpid: int, srv: bench_agents.Server, n: int, lead: int, tag: str,
                zombies_before: int, profile: Profiler | None = None) -> dict:
    """`lead` agents spawned first (their own handle); once their first
    requests reached the server, n more spawned at once through ONE handle
    (the timed spawn writes); done when all are zombies."""
    meter = bench_run.DaemonCpu(dpid)
    live: list[int] = []
    done = threading.Event()

    def sampler():  # agents alive and the CPU of workers that may exit, 4 times a second
        while not done.wait(0.25):
            c = bench_run.counts(mnt)
            live.append(c.get("created", 0) + c.get("running", 0))
            meter.sample()

    srv.reset()
    cpu_d, cpu_s = meter.sample(), bench_run.cpu(srv.pid)
    th = threading.Thread(target=sampler, daemon=True)
    t0 = time.perf_counter()
    th.start()
    try:
        lead_pids: list[int] = []
        if lead:
            lead_pids, _, _ = spawn_agents_timed(mnt, lead, f"{tag}-lead")
            deadline = time.monotonic() + 60
            while srv.stats()["requests"] < lead and time.monotonic() < deadline:
                time.sleep(0.05)
        c = bench_run.counts(mnt)
        alive_at_burst = c.get("created", 0) + c.get("running", 0)
        pids, writes, write_s = spawn_agents_timed(mnt, n, tag)
        pids = lead_pids + pids
        t_end = bench_run.wait_all_zombie(mnt, zombies_before + len(pids), timeout=max(600.0, len(pids) * 1.0),
                                          last_pid=max(pids))
    finally:
        done.set()
        th.join(10)
    cpu_d, cpu_s = meter.sample() - cpu_d, bench_run.cpu(srv.pid) - cpu_s
    prof = profile.stop() if profile else None
    st = srv.stats()
    out = {"side": "rnixfs", "tag": tag, "agents": len(pids), "wall_s": round(t_end - t0, 3),
           "lead_agents": lead, "spawn_writes": n, "agents_alive_at_burst": alive_at_burst,
           "spawn_writes_s": round(write_s, 3), "spawn_writes_per_s": round(n / write_s, 1),
           "spawn_write_latency": ms_pct(writes),
           "live_agents_max": max(live, default=0),
           "workers_max": meter.workers_max,
           "cpu_s": round(cpu_d, 3), "server_cpu_s": round(cpu_s, 3), **st,
           "cpu_ms_per_request": round(cpu_d * 1000 / max(1, st["requests"]), 4),
           "agents_check": check_agents(mnt, pids, REQUESTS), "pids": pids}
    if prof:
        out["profile"] = prof
    return out


# -- the load: plain side -----------------------------------------------------------------


def plain_load(srv: bench_agents.Server, bodies: list[list[dict]], workspace: Path, tag: str) -> dict:
    """The same requests from a plain trio + httpx client in this process,
    every agent at once, each with its own client (one connection)."""
    import trio

    srv.reset()
    me = psutil.Process()
    t = me.cpu_times()
    cpu_c, cpu_s = t.user + t.system, bench_run.cpu(srv.pid)
    t0 = time.perf_counter()
    steps = trio.run(bench_agents.plain_agents, srv.url, bodies, len(bodies), workspace, False)
    wall = time.perf_counter() - t0
    t = me.cpu_times()
    cpu_c, cpu_s = t.user + t.system - cpu_c, bench_run.cpu(srv.pid) - cpu_s
    st = srv.stats()
    if steps != len(bodies) * REQUESTS or st["requests"] != steps:
        raise RuntimeError(f"plain side {tag}: {steps} steps, {st['requests']} requests")
    return {"side": "plain", "tag": tag, "agents": len(bodies), "wall_s": round(wall, 3),
            "cpu_s": round(cpu_c, 3), "server_cpu_s": round(cpu_s, 3), **st,
            "cpu_ms_per_request": round(cpu_c * 1000 / st["requests"], 4)}


# -- the run --------------------------------------------------------------------------------


def fill_proc(mnt: Path, dpid: int, target: int, zombies: int) -> tuple[dict, int]:
    """Fast agents (one model request, no delay) through one handle, 2000 a
    handle, until proc/ holds `target` processes."""
    more = target - zombies
    spawned = max(0, more)
    t0 = time.perf_counter()
    write_s = 0.0
    while more > 0:
        k = min(2000, more)
        pids, _, s = spawn_agents_timed(mnt, k, f"fill{zombies}", fast=True)
        write_s += s
        zombies += k
        more -= k
        bench_run.wait_all_zombie(mnt, zombies, timeout=max(300.0, k * 0.5), last_pid=max(pids))
    wall = time.perf_counter() - t0
    return {"processes": zombies, "spawned": spawned, "wall_s": round(wall, 2), "write_s": round(write_s, 3),
            "spawn_writes_per_s": round(spawned / write_s, 1) if write_s else None}, zombies


def run(args) -> dict:
    quick = args.quick
    n = args.agents or (100 if quick else 1000)
    lead = n // 5 if args.lead is None else args.lead
    target = args.processes or (1000 if quick else 10_000)
    rounds, per_round = (10, 200) if quick else (20, 500)
    ls_rounds = 3 if quick else 4
    idle_s = 2.0 if quick else 5.0
    out: dict = {"meta": {
        "quick": quick, "python": platform.python_version(), "machine": platform.machine(),
        "kernel": platform.release(), "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.gmtime()),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip(),
        "rnixfs_commit": subprocess.run(["git", "log", "-1", "--format=%h", "--", "rnixfs"], cwd=REPO,
                                        capture_output=True, text=True).stdout.strip(),
        "dirty": bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                     capture_output=True, text=True).stdout.strip())},
        "config": {"agents": n + lead, "spawn_burst": n, "lead_agents": lead, "requests_per_agent": REQUESTS, "server_delay_s": args.delay,
                   "processes_for_ls": target, "profiled": bool(args.profile)}}
    res = bench_run.Resources()
    tmp = Path(tempfile.mkdtemp(prefix="rnixfs-bench-table-"))
    try:
        srv = bench_agents.Server(res, delay=args.delay)
        mnt, dpid = bench_run.mount_rnixfs(res, tmp, srv.url, linger=10 ** 7)
        workspace = tmp / "project"
        (workspace / bench_agents.FILE).write_text(bench_agents.FILE_TEXT)
        bench_run.log(f"rnixfs at {mnt} (daemon {dpid}), server {srv.url} (pid {srv.pid}, "
                      f"{args.delay:g} s replies)")

        # Warm-up: fast processes (HTTP client, PID blocks), then a few full
        # agents, whose request bodies feed a plain side that runs first.
        pids, _, _ = spawn_agents_timed(mnt, 20, "warm", fast=True)
        bench_run.wait_all_zombie(mnt, 20, 120, last_pid=max(pids))
        warm = 5
        srv.reset()
        wpids, _, _ = spawn_agents_timed(mnt, warm, "warm-agent")
        bench_run.wait_all_zombie(mnt, 20 + warm, 300, last_pid=max(wpids))
        zombies = 20 + warm
        bodies = bench_agents.agent_bodies(srv.dump(tmp / "bodies.jsonl"), strict=False)
        out["warm_up"] = check_agents(mnt, wpids, REQUESTS)

        # 1. idle status vs the minimal file of the same cache policy.
        status = mnt / "proc" / str(pids[0]) / "status"
        size = len(status.read_bytes())
        small = bench_run.mount_minimal(res, tmp, "minimal-small", 16, size)
        policy = cache_policy.policy(str(status))
        bench_run.log(f"1. idle status ({size} bytes, served as {policy}) vs minimal files")
        st_out: dict = {"status_bytes": size, "rnixfs_policy": policy,
                        "minimal_policies": {k: cache_policy.policy(str(small / f)) for k, f in MINIMAL_FILE.items()}}
        # also the minimal of the same policy answering FLUSH, which rnixfs must (proc/new
        # needs it): the plain minimal answers ENOSYS once and the kernel stops sending it
        flush = bench_run.mount_minimal(res, tmp, "minimal-flush", 16, size, "minimal_variants.py", ("--flush",))
        files = {pol: str(small / fname) for pol, fname in MINIMAL_FILE.items()}
        files["flush_same_policy"] = str(flush / MINIMAL_FILE[policy])
        st_out.update(compare_many(lambda: bench_run.orc(str(status)),
                                   {k: (lambda f=f: bench_run.orc(f)) for k, f in files.items()},
                                   rounds, per_round))
        st_out["ratio_same_policy"] = st_out[policy]["ratio"]
        st_out["ratio_vs_page_cache"] = st_out["page_cache"]["ratio"]
        st_out["ratio_vs_flush_same_policy"] = st_out["flush_same_policy"]["ratio"]
        out["idle_status"] = st_out

        # 2. the load, with the stat loop running throughout.
        stat_paths = {"new": mnt / "proc" / "new", "status": status}
        stat: dict[str, dict[str, list[int]]] = {"idle": {}, "plain_running": {}, "agents_running": {}}

        def stat_loop() -> bench_agents.StatLoop:
            return bench_agents.StatLoop(res, stat_paths, tmp / "stat.json", force_every=1)

        def collect(label: str, loop: bench_agents.StatLoop) -> None:
            for k, v in loop.stop().items():
                stat[label].setdefault(k, []).extend(v)

        bench_run.log(f"stat loop on the idle mount, {idle_s:.0f} s")
        loop = stat_loop()
        time.sleep(idle_s)
        collect("idle", loop)

        phases: list[dict] = []
        for r in range(args.rounds):
            tag = f"r{r + 1}"
            for side in (("rnixfs", "plain") if r % 2 == 0 else ("plain", "rnixfs")):
                loop = stat_loop()
                if side == "rnixfs":
                    prof = Profiler(res, dpid, Path(args.profile), args.profile_rate) if args.profile else None
                    bench_run.log(f"round {r + 1}: {lead} rnixfs agents, then {n} more on one handle, "
                                  f"× {REQUESTS} requests")
                    p = rnixfs_load(mnt, dpid, srv, n, lead, tag, zombies, prof)
                    zombies += n + lead
                    p.pop("pids")
                    bodies = bench_agents.agent_bodies(srv.dump(tmp / "bodies.jsonl"), strict=False)
                    collect("agents_running", loop)
                    bench_run.log(f"  rnixfs: {p['wall_s']:.1f} s, CPU {p['cpu_s']:.2f} s "
                                  f"({p['cpu_ms_per_request']:.2f} ms/request, {p['workers_max']} workers), "
                                  f"spawn writes {p['spawn_writes_per_s']:.0f}/s, "
                                  f"{p['agents_check']['not_clean']} agents not clean")
                else:
                    if not bodies:
                        raise RuntimeError("no complete agent conversation to replay")
                    replay = [bodies[i % len(bodies)] for i in range(n + lead)]
                    bench_run.log(f"round {r + 1}: {n + lead} plain httpx agents × {REQUESTS} requests, "
                                  "all at once")
                    p = plain_load(srv, replay, workspace, tag)
                    collect("plain_running", loop)
                    bench_run.log(f"  plain: {p['wall_s']:.1f} s, CPU {p['cpu_s']:.2f} s "
                                  f"({p['cpu_ms_per_request']:.2f} ms/request)")
                phases.append(p)
            if args.profile:
                break
        out["load"] = summarize_load(phases)
        out["stat_latency"] = {label: {k: bench_agents.pct(v) for k, v in d.items()} for label, d in stat.items()}
        out["stat_latency"]["paths"] = {k: str(v.relative_to(mnt)) for k, v in stat_paths.items()}

        if not args.profile:
            # 3. ls -l proc with `target` processes.
            bench_run.log(f"filling proc/ to {target} processes")
            fill, zombies = fill_proc(mnt, dpid, target, zombies)
            proc_dir = str(mnt / "proc")
            entries = len(os.listdir(proc_dir))
            big = bench_run.mount_minimal(res, tmp, "minimal-big", entries, size)
            mdir = str(big / "dir")
            bench_run.log(f"3. ls -l proc ({zombies} processes, {entries} entries) vs minimal dir")
            ls: dict = {"processes": zombies, "entries": entries, "fill": fill}
            ls["ls_l"] = bench_run.compare("ls -l", lambda: bench_run.timed_subprocess(["ls", "-l", proc_dir]),
                                           lambda: bench_run.timed_subprocess(["ls", "-l", mdir]), ls_rounds, 2)
            ls["listdir"] = bench_run.compare("os.listdir", bench_run.listdir_ns(proc_dir, entries),
                                              bench_run.listdir_ns(mdir, entries), ls_rounds, 3)
            out["ls_proc"] = ls
        meter = bench_run.DaemonCpu(dpid)
        meter.sample()
        out["daemon_final"] = {"rss_bytes": bench_run.rss(dpid), "counts": bench_run.counts(mnt),
                               "workers": meter.workers_now}
    finally:
        res.close()
        shutil.rmtree(tmp, ignore_errors=True)
    out["summary"] = summary(out)
    return out


def summarize_load(phases: list[dict]) -> dict:
    sides = {}
    for side in ("rnixfs", "plain"):
        ph = [p for p in phases if p["side"] == side]
        if not ph:
            continue
        req = sum(p["requests"] for p in ph)
        cpu = sum(p["cpu_s"] for p in ph)
        sides[side] = {"agents": sum(p["agents"] for p in ph), "requests": req,
                       "wall_s": round(sum(p["wall_s"] for p in ph), 3), "cpu_s": round(cpu, 3),
                       "cpu_ms_per_request": round(cpu * 1000 / max(1, req), 4),
                       "connections": sum(p["connections"] for p in ph),
                       "max_inflight": max(p["max_inflight"] for p in ph)}
    out = {"sides": sides, "phases": phases}
    if len(sides) == 2:
        out["cpu_ratio"] = round(sides["rnixfs"]["cpu_ms_per_request"] / sides["plain"]["cpu_ms_per_request"], 2)
        out["wall_ratio"] = round(sides["rnixfs"]["wall_s"] / sides["plain"]["wall_s"], 2)
    rn = [p for p in phases if p["side"] == "rnixfs"]
    out["spawn_writes_per_s"] = round(sum(p["spawn_writes"] for p in rn) / sum(p["spawn_writes_s"] for p in rn), 1)
    out["agents_not_clean"] = sum(p["agents_check"]["not_clean"] for p in rn)
    out["workers_max"] = max(p["workers_max"] for p in rn)
    return out


def summary(r: dict) -> dict:
    """The issue's rows: value, baseline, ratio, goal, met."""
    ld, st = r["load"], r["stat_latency"]
    rows = {}
    ms = lambda d, k: d[k] / 1000
    forced = st["agents_running"].get("new_forced", {})
    if forced.get("n"):
        rows["statx_force_sync_new"] = {
            "p50_ms": ms(forced, "p50_us"), "p99_ms": ms(forced, "p99_us"), "max_ms": ms(forced, "max_us"),
            "n": forced["n"], "baseline_plain_running": {k: ms(st["plain_running"]["new_forced"], k + "_us")
                                                          for k in ("p50", "p99", "max")},
            "goal": f"p99 <= {GOALS['statx_new_p99_ms']:g} ms, max <= {GOALS['statx_new_max_ms']:g} ms",
            "met": ms(forced, "p99_us") <= GOALS["statx_new_p99_ms"] and ms(forced, "max_us") <= GOALS["statx_new_max_ms"]}
    plain_max = max(ms(st["agents_running"][k], "max_us") for k in ("new", "status"))
    rows["stat_max"] = {"max_ms": plain_max,
                        "by_path_ms": {k: ms(st["agents_running"][k], "max_us") for k in ("new", "status")},
                        "baseline_plain_running_ms": max(ms(st["plain_running"][k], "max_us") for k in ("new", "status")),
                        "goal": f"<= {GOALS['stat_max_ms']:g} ms", "met": plain_max <= GOALS["stat_max_ms"]}
    if "cpu_ratio" in ld:
        rows["cpu_per_request"] = {"rnixfs_ms": ld["sides"]["rnixfs"]["cpu_ms_per_request"],
                                   "plain_ms": ld["sides"]["plain"]["cpu_ms_per_request"], "ratio": ld["cpu_ratio"],
                                   "goal": f"<= {GOALS['cpu_ratio']:g}x plain", "met": ld["cpu_ratio"] <= GOALS["cpu_ratio"]}
    rn = [p for p in ld["phases"] if p["side"] == "rnixfs"]
    rows["spawn_writes"] = {"per_s": ld["spawn_writes_per_s"], "writes": sum(p["spawn_writes"] for p in rn),
                            "agents_alive_at_burst": min(p["agents_alive_at_burst"] for p in rn),
                            "goal": f">= {GOALS['spawn_writes_per_s']:g} /s",
                            "met": ld["spawn_writes_per_s"] >= GOALS["spawn_writes_per_s"]}
    if "ls_proc" in r:
        c = r["ls_proc"]["ls_l"]
        rows["ls_l_proc"] = {"rnixfs_ms": c["rnixfs"]["median_us"] / 1000, "minimal_ms": c["minimal"]["median_us"] / 1000,
                             "ratio": c["ratio"], "entries": r["ls_proc"]["entries"],
                             "goal": f"<= {GOALS['ls_l_ratio']:g}x", "met": c["ratio"] <= GOALS["ls_l_ratio"]}
    s = r["idle_status"]
    same = s[s["rnixfs_policy"]]
    rows["idle_status"] = {"policy": s["rnixfs_policy"], "rnixfs_us": same["rnixfs"]["median_us"],
                           "minimal_us": same["minimal"]["median_us"], "ratio": s["ratio_same_policy"],
                           "ratio_vs_page_cache": s["ratio_vs_page_cache"],
                           "ratio_vs_flush_same_policy": s.get("ratio_vs_flush_same_policy"),
                           "goal": f"<= {GOALS['status_ratio']:g}x (checked: {GOALS['status_ratio_checked']:g}x)",
                           "met": s["ratio_same_policy"] <= GOALS["status_ratio"],
                           "met_checked": s["ratio_same_policy"] <= GOALS["status_ratio_checked"]}
    rows["agents_exit_0"] = {"agents": ld["sides"]["rnixfs"]["agents"], "not_clean": ld["agents_not_clean"],
                             "goal": "all", "met": ld["agents_not_clean"] == 0}
    return rows


def table(r: dict) -> str:
    s, ld = r["summary"], r["load"]
    yes = lambda row: "yes" if row["met"] else "NO"
    rows = [("measure", "rnixfs", "baseline (same run)", "ratio", "goal", "met")]
    if "statx_force_sync_new" in s:
        x = s["statx_force_sync_new"]
        b = x["baseline_plain_running"]
        rows.append(("statx FORCE_SYNC proc/new, p50 / p99 / max", f"{x['p50_ms']:.2f} / {x['p99_ms']:.1f} / "
                     f"{x['max_ms']:.1f} ms", f"{b['p50']:.2f} / {b['p99']:.1f} / {b['max']:.1f} ms (plain running)",
                     "", x["goal"], yes(x)))
    x = s["stat_max"]
    rows.append(("plain stat max (proc/new, status)", f"{x['max_ms']:.1f} ms",
                 f"{x['baseline_plain_running_ms']:.1f} ms (plain running)", "", x["goal"], yes(x)))
    if "cpu_per_request" in s:
        x = s["cpu_per_request"]
        rows.append(("CPU per model request (daemon + workers)", f"{x['rnixfs_ms']:.2f} ms",
                     f"{x['plain_ms']:.2f} ms (plain httpx)", f"{x['ratio']:.2f}x", x["goal"], yes(x)))
    x = s["spawn_writes"]
    rows.append((f"{x['writes']} spawn writes, one proc/new handle, {x['agents_alive_at_burst']} agents running",
                 f"{x['per_s']:.0f} /s",
                 "", "", x["goal"], yes(x)))
    if "ls_l_proc" in s:
        x = s["ls_l_proc"]
        rows.append((f"ls -l proc, {x['entries']} entries", f"{x['rnixfs_ms']:.0f} ms",
                     f"{x['minimal_ms']:.0f} ms (minimal pyfuse3 dir)", f"{x['ratio']:.2f}x", x["goal"], yes(x)))
    x = s["idle_status"]
    rows.append(("idle status open+read+close", f"{x['rnixfs_us']:.0f} µs",
                 f"{x['minimal_us']:.0f} µs (minimal, {x['policy']})", f"{x['ratio']:.2f}x", x["goal"],
                 yes(x) + ("" if x["met_checked"] else " (not 1.3x)")))
    rows.append(("  same vs minimal page-cached (pyfuse3 default)", "", "",
                 f"{x['ratio_vs_page_cache']:.2f}x", "", ""))
    if x.get("ratio_vs_flush_same_policy") is not None:
        rows.append((f"  same vs minimal {x['policy']} answering FLUSH", "", "",
                     f"{x['ratio_vs_flush_same_policy']:.2f}x", "", ""))
    x = s["agents_exit_0"]
    rows.append(("agents exiting 0 (zombie, 6 steps)", f"{x['agents'] - x['not_clean']} of {x['agents']}",
                 "", "", x["goal"], yes(x)))
    sides = ld["sides"]
    if "plain" in sides:
        rows.append(("load wall time", f"{sides['rnixfs']['wall_s']:.1f} s", f"{sides['plain']['wall_s']:.1f} s",
                     f"{ld['wall_ratio']:.2f}x", "", ""))
    rows.append(("TCP connections / most requests in flight",
                 f"{sides['rnixfs']['connections']} / {sides['rnixfs']['max_inflight']}",
                 *([f"{sides['plain']['connections']} / {sides['plain']['max_inflight']}"] if "plain" in sides else [""]),
                 "", "", ""))
    rows.append(("worker processes seen (max)", str(ld["workers_max"]), "", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    fmt = lambda row: "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip()
    return "\n".join([fmt(rows[0]), fmt(tuple("-" * w for w in widths))] + [fmt(x) for x in rows[1:]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rnixfs: the whole load table in one run (see bench/README.md)")
    ap.add_argument("--quick", action="store_true", help="100 agents, 1000 processes for ls, fewer rounds")
    ap.add_argument("--agents", type=int, help="agents in the load (default 1000, --quick 100)")
    ap.add_argument("--lead", type=int, help="agents spawned (and running) before the timed burst of "
                                             "--agents spawn writes (default: a fifth of --agents)")
    ap.add_argument("--processes", type=int, help="processes in proc/ for ls -l (default 10 000, --quick 1000)")
    ap.add_argument("--delay", type=float, default=1.0, help="server reply delay in s (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="load rounds, rnixfs/plain then plain/rnixfs … (default 1)")
    ap.add_argument("--profile", help="py-spy raw profile of the daemon during the (first) load; "
                                      "the run stops after the load")
    ap.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--out", help="JSON output (default bench/results-table.json, --quick: "
                                  "bench/results-table-quick.json)")
    args = ap.parse_args(argv)
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        print("bench: needs /dev/fuse and fusermount3", file=sys.stderr)
        return 2
    out = Path(args.out or BENCH / ("results-table-quick.json" if args.quick else "results-table.json"))
    t0 = time.monotonic()
    r = run(args)
    r["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    r["meta"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(table(r))
    text = json.dumps(r, indent=2)
    print(text)
    out.write_text(text + "\n")
    bench_run.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
