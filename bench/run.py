"""rnixfs benchmarks: ratios against a minimal pyfuse3 filesystem, measured
side by side in the same run (so noise on a shared machine cancels).

    python bench/run.py [--quick] [--out bench/results.json]
    python bench/run.py --agents [--quick]   # the agent-loop benchmark, bench/agents.py
    python bench/table.py [--quick]          # the load table in one run (bench/README.md)

1. `cat proc/<pid>/status`: open+read-to-EOF+close, in-process and as a
   `cat` process, vs a same-size file on bench/minimal_fs.py (A/B rounds).
2. Spawn rate: 1000 writes through one open proc/new handle, then 1000
   `echo … > proc/new` (bash loop), against the scripted OpenAI server in
   zero-latency mode; time until every one of them is a zombie.
3. `ls proc` with 10 000 processes vs a minimal pyfuse3 directory with the
   same number of entries (os.listdir, `ls`, `ls -l`; A/B rounds).
4. Daemon RSS per zombie process.

Prints a table, then the JSON (also written to --out). See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
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

REPO = Path(__file__).resolve().parent.parent
FUSERMOUNT = shutil.which("fusermount3") or "fusermount3"
XATTR = "user.rnixfs.daemon"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- lifecycle: everything started is stopped by its PID --------------------------------


class Resources:
    """Mounts and processes this run started; torn down in reverse order."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, object]] = []

    def add_mount(self, path: Path, pid: int | None) -> None:
        self.stack.append(("mount", (path, pid)))

    def add_proc(self, proc: subprocess.Popen) -> None:
        self.stack.append(("proc", proc))

    def close(self) -> None:
        while self.stack:
            kind, obj = self.stack.pop()
            try:
                if kind == "mount":
                    path, pid = obj
                    unmount(path)
                    if pid:
                        wait_gone(pid, 20)
                else:
                    stop_proc(obj)
            except Exception as exc:  # keep tearing down the rest
                log(f"cleanup of {kind} failed: {exc!r}")


def mounted(path: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def unmount(path: Path) -> None:
    if not mounted(path):
        return
    res = subprocess.run([FUSERMOUNT, "-u", str(path)], capture_output=True, text=True)
    if res.returncode != 0 and mounted(path):
        log(f"fusermount3 -u {path}: {res.stderr.strip()}; lazy unmount")
        subprocess.run([FUSERMOUNT, "-u", "-z", str(path)], capture_output=True)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if not alive(pid):
            return
        log(f"pid {pid} still alive; sending {sig.name}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def stop_proc(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


# -- daemon CPU: its own process and its workers ---------------------------------------


def is_worker(p: psutil.Process) -> bool:
    """A worker process of the daemon: `python -m rnixfs.worker …` (or its
    __main__.py by path), not an agent's shell command."""
    try:
        argv = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return any(a == "rnixfs.worker" or a.startswith("rnixfs.worker ")
               or a.endswith(("rnixfs/worker/__main__.py", "rnixfs/worker.py")) for a in argv[:6])


class DaemonCpu:
    """User+system CPU seconds of the daemon and of each worker descendant.

    A worker that exits between samples keeps the CPU it had at its last
    sample (psutil cannot read a reaped process), so sample often while
    workers may come and go; zero workers (agent loops inline) is fine."""

    def __init__(self, dpid: int):
        self.dpid = dpid
        self.seen: dict[tuple[int, float], float] = {}  # (pid, create_time) → CPU s
        self.workers_now = 0
        self.workers_max = 0
        self.lock = threading.Lock()

    def sample(self) -> float:
        procs = []
        try:
            daemon = psutil.Process(self.dpid)
            procs.append(daemon)
            procs += daemon.children(recursive=True)
        except psutil.NoSuchProcess:
            pass  # gone: keep what was seen
        got = {}
        live = 0
        for p in procs:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    # a worker that exited is a zombie until reaped: its cmdline
                    # is empty then, but its final CPU is still readable
                    if p.pid != self.dpid and key not in self.seen and not is_worker(p):
                        continue
                    t = p.cpu_times()
                    got[key] = t.user + t.system
                    live += p.pid != self.dpid and p.status() != psutil.STATUS_ZOMBIE
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        with self.lock:
            self.seen.update(got)
            self.workers_now = live
            self.workers_max = max(self.workers_max, self.workers_now)
            return sum(self.seen.values())


# -- the three parties -------------------------------------------------------------------


def start_scripted_server(res: Resources) -> str:
    p = subprocess.Popen([sys.executable, "-m", "tests.scripted_server", "--port", "0", "--zero-latency"],
                         cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    res.add_proc(p)
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        raise RuntimeError(f"scripted server did not start: {line!r}")
    return line.split()[-1]


def mount_rnixfs(res: Resources, tmp: Path, url: str, linger: float) -> tuple[Path, int]:
    mnt, project, state, config = (tmp / n for n in ("rnixfs", "project", "state", "config"))
    for d in (mnt, project, state, config):
        d.mkdir()
    (config / "providers.yaml").write_text(
        "default: scripted\nproviders:\n"
        f"  scripted: {{type: openai, base_url: {url}, model: m, timeout: 10, max_retries: 2,"
        " retry_initial: 0.01, retry_max: 0.05}\n")
    res.add_mount(mnt, None)  # unmount even if the xattr below fails
    r = subprocess.run([sys.executable, "-m", "rnixfs.cli", "mount", str(mnt), "--project", str(project),
                        "--state-dir", str(state), "--config-dir", str(config), "--linger", str(linger)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"rnixfs mount failed: {r.stderr.strip()}")
    pid = daemon_info(mnt)["pid"]
    res.stack[-1] = ("mount", (mnt, pid))
    return mnt, pid


def daemon_info(mnt: Path) -> dict:
    return json.loads(os.getxattr(mnt, XATTR))


def mount_minimal(res: Resources, tmp: Path, name: str, entries: int, size: int,
                  script: str = "minimal_fs.py", flags: tuple[str, ...] = ()) -> Path:
    """bench/minimal_fs.py (or a variant of it, e.g. minimal_variants.py --flush)."""
    mnt = tmp / name
    mnt.mkdir()
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / script), str(mnt), *flags,
                          "--entries", str(entries), "--size", str(size)],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    res.add_proc(p)
    res.add_mount(mnt, None)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        raise RuntimeError(f"minimal_fs did not start: {line!r}")
    return mnt


# -- measuring ---------------------------------------------------------------------------


def orc(path: str) -> int:
    """open + read to EOF + close (what cat does), in ns."""
    t0 = time.perf_counter_ns()
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 131072):
        pass
    os.close(fd)
    return time.perf_counter_ns() - t0


def ab_rounds(fn_a, fn_b, rounds: int, per_round: int) -> tuple[list[float], list[float], list[float]]:
    """Interleave A and B in rounds (ABAB, alternating who goes first) and
    return both sample lists and the per-round ratio of medians."""
    a_all: list[float] = []
    b_all: list[float] = []
    ratios: list[float] = []
    for r in range(rounds):
        order = ((fn_a, True), (fn_b, False)) if r % 2 == 0 else ((fn_b, False), (fn_a, True))
        got = {}
        for fn, is_a in order:
            got[is_a] = [fn() for _ in range(per_round)]
        a_all += got[True]
        b_all += got[False]
        ratios.append(statistics.median(got[True]) / statistics.median(got[False]))
    return a_all, b_all, ratios


def summary(samples_ns: list[float]) -> dict:
    s = sorted(samples_ns)
    q = lambda p: s[min(len(s) - 1, int(p * len(s)))] / 1000
    return {"median_us": round(statistics.median(s) / 1000, 2), "p10_us": round(q(0.10), 2),
            "p90_us": round(q(0.90), 2), "n": len(s)}


def compare(name: str, fn_a, fn_b, rounds: int, per_round: int) -> dict:
    for _ in range(max(3, per_round // 10)):  # warm the dentry/attr caches
        fn_a(), fn_b()
    gc.disable()
    try:
        a, b, ratios = ab_rounds(fn_a, fn_b, rounds, per_round)
    finally:
        gc.enable()
    sa, sb = summary(a), summary(b)
    return {"name": name, "rnixfs": sa, "minimal": sb,
            "ratio": round(sa["median_us"] / sb["median_us"], 2),
            "ratio_per_round_median": round(statistics.median(ratios), 2),
            "rounds": rounds, "per_round": per_round}


def timed_subprocess(argv: list[str]) -> int:
    t0 = time.perf_counter_ns()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter_ns() - t0


def cat_loop(path: str, n: int):
    """One bash running `cat path` n times: per-cat ns (fork+exec included)."""
    script = f'for ((i=0;i<{n};i++)); do cat "$F"; done >/dev/null'

    def run() -> int:
        t0 = time.perf_counter_ns()
        subprocess.run(["bash", "-c", script], env={**os.environ, "F": path}, check=True)
        return (time.perf_counter_ns() - t0) // n

    return run


def listdir_ns(path: str, expect: int):
    def run() -> int:
        t0 = time.perf_counter_ns()
        n = len(os.listdir(path))
        dt = time.perf_counter_ns() - t0
        if n != expect:
            raise RuntimeError(f"{path}: {n} entries, expected {expect}")
        return dt

    return run


# -- spawning ------------------------------------------------------------------------------


def counts(mnt: Path) -> dict:
    return daemon_info(mnt)["processes"]


def read_wait(mnt: Path, pid: int) -> str:
    """`cat proc/<pid>/wait`: blocks (in the daemon, no polling) until exit."""
    return (mnt / "proc" / str(pid) / "wait").read_text()


def wait_all_zombie(mnt: Path, total: int, timeout: float, last_pid: int | None = None) -> float:
    """Block on the newest process's `wait` file, then poll the daemon's
    process counts (one xattr; it walks the table, so not too often) until
    there are `total` zombies."""
    if last_pid is not None:
        read_wait(mnt, last_pid)
    deadline = time.monotonic() + timeout
    while True:
        c = counts(mnt)
        if c.get("zombie", 0) >= total:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {total} zombies: {c}")
        time.sleep(0.02)


def spawn_handle(mnt: Path, n: int, tag: str) -> tuple[list[int], float]:
    """n spawn requests through one O_RDWR handle; PIDs read back after."""
    fd = os.open(mnt / "proc" / "new", os.O_RDWR)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            os.write(fd, f"{tag} {i}".encode())
        t1 = time.perf_counter()
        out = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    pids = [int(x) for x in out.split()]
    if len(pids) != n:
        raise RuntimeError(f"spawned {n}, read back {len(pids)} PIDs")
    return pids, t1 - t0


def spawn_echo(mnt: Path, n: int, tag: str) -> float:
    """n `echo "…" > proc/new` in one bash (builtin echo: open, trunc, write, close)."""
    script = f'for ((i=0;i<{n};i++)); do echo "{tag} $i" > "$M/proc/new" || exit 1; done'
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", script], env={**os.environ, "M": str(mnt)}, check=True, timeout=3600)
    return time.perf_counter() - t0


def verify_zombies(mnt: Path, pids: list[int]) -> dict:
    bad = {}
    for pid in pids:
        st = json.loads((mnt / "proc" / str(pid) / "status").read_bytes())
        if st["state"] != "zombie" or st["exit_code"] != 0:
            bad[pid] = (st["state"], st["exit_code"], st.get("error"))
    if bad:
        raise RuntimeError(f"{len(bad)} processes not clean zombies, e.g. {list(bad.items())[:3]}")
    return {"checked": len(pids), "all_zombie_exit0": True}


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def spawn_phase(mnt: Path, dpid: int, n: int, how: str, already: int) -> tuple[dict, list[int]]:
    meter = DaemonCpu(dpid)  # the daemon and its worker processes
    cpu0 = meter.sample()
    t0 = time.perf_counter()
    if how == "handle":
        pids, write_s = spawn_handle(mnt, n, "bench handle")
    else:
        write_s = spawn_echo(mnt, n, "bench echo")
        # echo gives no PIDs back: they are the newest n in proc/
        pids = sorted(int(x) for x in os.listdir(mnt / "proc") if x.isdigit())[-n:]
    t_done = wait_all_zombie(mnt, already + n, timeout=max(120.0, n * 0.5), last_pid=max(pids))
    total_s = t_done - t0
    cpu1 = meter.sample()
    res = {"how": how, "spawns": n, "write_s": round(write_s, 3),
           "write_spawns_per_s": round(n / write_s, 1),
           "all_zombie_s": round(total_s, 3), "end_to_end_per_s": round(n / total_s, 1),
           "daemon_cpu_s": round(cpu1 - cpu0, 3),
           "daemon_cpu_ms_per_spawn": round((cpu1 - cpu0) * 1000 / n, 3)}
    return res, pids


# -- the run -------------------------------------------------------------------------------


def run(args) -> dict:
    quick = args.quick
    target = 1000 if quick else 10_000  # processes in proc/ for the ls benchmark
    rounds, per_round = (10, 200) if quick else (20, 500)
    cat_rounds, cat_n = (4, 50) if quick else (20, 50)
    ls_rounds = 5 if quick else 10
    out: dict = {"meta": {
        "quick": quick, "python": platform.python_version(), "machine": platform.machine(),
        "kernel": platform.release(), "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip()}}
    res = Resources()
    tmp = Path(tempfile.mkdtemp(prefix="rnixfs-bench-"))
    try:
        url = start_scripted_server(res)
        mnt, dpid = mount_rnixfs(res, tmp, url, linger=10 ** 7)
        log(f"rnixfs at {mnt} (daemon {dpid}), scripted server {url}")

        # Warm-up: one process (loads the HTTP client, the store's PID block).
        pids, _ = spawn_handle(mnt, 1, "warm-up")
        wait_all_zombie(mnt, 1, 60, last_pid=pids[0])
        total = 1
        status = str(mnt / "proc" / str(pids[0]) / "status")
        size = len(Path(status).read_bytes())
        small = mount_minimal(res, tmp, "minimal-small", 16, size)
        mfile = str(small / "file")

        # 1. status latency.
        log("1. cat status vs minimal file")
        lat = {"status_bytes": size, "processes_in_table": total}
        lat["in_process"] = compare("open+read+close", lambda: orc(status), lambda: orc(mfile),
                                    rounds, per_round)
        lat["cat"] = compare("cat (fork+exec)", cat_loop(status, cat_n), cat_loop(mfile, cat_n),
                             cat_rounds, 1)
        out["status_latency"] = lat

        # 4 (baseline) + 2. spawn rate, RSS.
        rss0 = rss(dpid)
        out["rss"] = {"baseline_bytes": rss0, "baseline_zombies": total, "points": []}
        spawn = []
        log("2. 1000 spawns through one proc/new handle")
        r, pids = spawn_phase(mnt, dpid, 1000, "handle", total)
        total += 1000
        r["verify"] = verify_zombies(mnt, pids)
        spawn.append(r)
        rss1 = rss(dpid)
        out["rss"]["points"].append({"zombies": total, "rss_bytes": rss1,
                                     "per_zombie_bytes": round((rss1 - rss0) / (total - 1))})
        n_echo = 200 if quick else 1000
        log(f"2. {n_echo} spawns with echo > proc/new")
        r, pids = spawn_phase(mnt, dpid, n_echo, "echo", total)
        total += n_echo
        r["verify"] = verify_zombies(mnt, pids)
        spawn.append(r)
        out["spawn"] = spawn

        # Top up to the ls target.
        more = target - total
        if more > 0:
            log(f"topping up: {more} more spawns (handle) to {target} processes")
            r, pids = spawn_phase(mnt, dpid, more, "handle", total)
            total += more
            r["verify"] = verify_zombies(mnt, pids)
            spawn.append(r)
        rss2 = rss(dpid)
        if total - 1 > 1000:
            out["rss"]["points"].append({"zombies": total, "rss_bytes": rss2,
                                         "per_zombie_bytes": round((rss2 - rss0) / (total - 1))})
        out["rss"]["per_zombie_bytes"] = out["rss"]["points"][-1]["per_zombie_bytes"]

        # 3. ls proc.
        proc_dir = str(mnt / "proc")
        entries = len(os.listdir(proc_dir))  # PIDs + "new"
        log(f"3. ls proc ({total} processes, {entries} entries) vs minimal dir of {entries}")
        big = mount_minimal(res, tmp, "minimal-big", entries, size)
        mdir = str(big / "dir")
        ls: dict = {"processes": total, "entries": entries}
        ls["listdir"] = compare("os.listdir", listdir_ns(proc_dir, entries), listdir_ns(mdir, entries),
                                ls_rounds, 5)
        ls["ls"] = compare("ls", lambda: timed_subprocess(["ls", proc_dir]),
                           lambda: timed_subprocess(["ls", mdir]), ls_rounds, 3)
        ls["ls_l"] = compare("ls -l", lambda: timed_subprocess(["ls", "-l", proc_dir]),
                             lambda: timed_subprocess(["ls", "-l", mdir]), ls_rounds, 3)
        out["ls_proc"] = ls

        # 1 again, with the full process table: status must not depend on it.
        log(f"1b. cat status again with {total} processes in the table")
        status_new = str(mnt / "proc" / str(max(pids)) / "status")
        lat2 = {"processes_in_table": total}
        lat2["in_process"] = compare("open+read+close", lambda: orc(status_new),
                                     lambda: orc(str(big / "file")), rounds, per_round)
        out["status_latency_full_table"] = lat2
        out["daemon_final"] = {"rss_bytes": rss(dpid), "counts": counts(mnt)}
    finally:
        res.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def table(r: dict) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def add(name, a, b="", ratio=""):
        rows.append((name, a, b, ratio))

    lat = r["status_latency"]
    for key in ("in_process", "cat"):
        c = lat[key]
        add(f"cat status: {c['name']}", f"{c['rnixfs']['median_us']:.1f} µs",
            f"{c['minimal']['median_us']:.1f} µs", f"{c['ratio']:.2f}x")
    c = r["status_latency_full_table"]["in_process"]
    add(f"  same, {r['status_latency_full_table']['processes_in_table']} procs in table",
        f"{c['rnixfs']['median_us']:.1f} µs", f"{c['minimal']['median_us']:.1f} µs", f"{c['ratio']:.2f}x")
    for s in r["spawn"]:
        add(f"spawn {s['spawns']} via {s['how']}: writes", f"{s['write_spawns_per_s']:.0f} /s")
        add(f"spawn {s['spawns']} via {s['how']}: all zombie", f"{s['all_zombie_s']:.2f} s",
            "", f"{s['end_to_end_per_s']:.0f} /s")
        add("  daemon CPU per spawn", f"{s['daemon_cpu_ms_per_spawn']:.2f} ms")
    ls = r["ls_proc"]
    for key in ("listdir", "ls", "ls_l"):
        c = ls[key]
        add(f"{c['name']} proc ({ls['entries']} entries)", f"{c['rnixfs']['median_us'] / 1000:.1f} ms",
            f"{c['minimal']['median_us'] / 1000:.1f} ms", f"{c['ratio']:.2f}x")
    for p in r["rss"]["points"]:
        add(f"RSS per zombie ({p['zombies']} zombies)", f"{p['per_zombie_bytes'] / 1024:.1f} KiB",
            "", f"RSS {p['rss_bytes'] / 2**20:.0f} MiB")
    head = ("benchmark", "rnixfs", "minimal pyfuse3", "ratio / note")
    widths = [max(len(x[i]) for x in rows + [head]) for i in range(4)]
    fmt = lambda row: "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip()
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(x) for x in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description="rnixfs benchmarks (see bench/README.md)")
    ap.add_argument("--quick", action="store_true", help="1000 processes for ls, fewer rounds")
    ap.add_argument("--out", help="default bench/results.json (bench/results-agents.json with --agents)")
    ap.add_argument("--agents", action="store_true",
                    help="run the agent-loop benchmark instead (bench/agents.py; see bench/README.md)")
    args = ap.parse_args()
    if args.agents:
        import agents  # bench/agents.py, next to this file

        return agents.main(["--quick"] * args.quick + (["--out", args.out] if args.out else []))
    args.out = args.out or str(REPO / "bench" / "results.json")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        print("bench: needs /dev/fuse and fusermount3", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    r = run(args)
    r["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    print(table(r))
    text = json.dumps(r, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
