"""Agent-loop benchmark: rnixfs agents vs a plain httpx client, and `stat`
latency on the mount while the agents run.

    python bench/agents.py [--quick] [--agents N] [--out bench/results-agents.json]
    python bench/run.py --agents [--quick]          # the same, from run.py

1. Agent-loop overhead. N agents (default 1000, --quick 100), each 5
   tool-using steps (a Read of a 200-byte workspace file) + 1 final answer,
   so 6 chat completions per agent, through a real rnixfs mount against a
   scripted OpenAI server (zero latency) whose reply is derived from the
   request (``DerivedServer``: fewer than 5 tool results in the conversation
   → a Read tool call, else a final text). Compared in the same run, in
   interleaved rounds (R P S, then S P R), with a plain httpx client
   replaying the request bodies rnixfs sent (captured by the server) and
   reading the same file where a tool call came back: P = 50 agents at a
   time, each with its own client (one keep-alive connection); S = one
   shared client with httpx's default pool, as rnixfs has, 100 at a time.
2. `stat` latency: a separate process stats proc/new and a process's status
   file every millisecond (os.stat, plus every 5th iteration a statx with
   AT_STATX_FORCE_SYNC, which always reaches the daemon) on the idle mount,
   while the plain clients run (mount idle, machine busy) and while the
   agents run.

Prints a table, then the JSON (also written to --out). See bench/README.md.
The subcommands ``serve`` and ``statloop`` are the helper processes.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
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
for p in (str(REPO), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

import run as bench_run  # noqa: E402  (bench/run.py: mounts, cleanup by PID, helpers)

STEPS = 5  # tool-using steps per agent; + 1 final answer
FILE = "small.txt"
FILE_TEXT = ("rnixfs agent benchmark: a small workspace file that every agent reads five times.\n" * 3)[:200]


# -- the scripted server, replies derived from the request ------------------------------


FAST = "FAST-EXIT"  # in an intent: a final answer at once, no delay (fills proc/ quickly)


def derived_reply(messages: list, steps: int = STEPS) -> dict:
    """Fewer than `steps` tool results so far → one Read tool call, else a
    final text; at once if the intent holds FAST."""
    done = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
    intent = next((m.get("content") for m in messages
                   if isinstance(m, dict) and m.get("role") == "user"), "") or ""
    if FAST in intent:
        return {"content": "done", "fast": True}
    if done < steps:
        return {"content": "", "tool_calls": [{"id": f"call_{done + 1}", "type": "function", "function": {
            "name": "Read", "arguments": json.dumps({"path": FILE})}}]}
    return {"content": f"done after {done} reads: {intent}"}


def make_server(**kw):
    from tests.scripted_server import ScriptedServer, _Handler, words
    from http.server import ThreadingHTTPServer

    class DerivedServer(ScriptedServer):
        """ScriptedServer whose reply is computed from the conversation: no
        queue to scan, so 6000 requests cost the same as 6. Counts requests
        in flight (the client's effective concurrency)."""

        def __init__(self, *a, steps: int = STEPS, delay: float = 0.0, **k):
            super().__init__(*a, **k)
            self.steps = steps
            self.delay = delay  # seconds before each reply's first byte (not for FAST)
            self.inflight = 0
            self.max_inflight = 0

        def _plan(self, body, headers):
            messages = body.get("messages") or []
            with self._lock:
                self._requests.append(body)
            plan = derived_reply(messages, self.steps)
            if not plan.pop("fast", False) and self.delay:
                plan["delay"] = self.delay
            plan["fault"] = None
            plan["prompt_tokens"] = sum(words(m.get("content")) for m in messages if isinstance(m, dict))
            return plan

        def start(self):
            server = self

            class Handler(_Handler):
                owner = server
                # TCP_NODELAY, as real servers do: without it each reply (headers,
                # then the body, then the last chunk: three writes) waits on
                # Nagle + the client's delayed ACK, ~40 ms per request.
                disable_nagle_algorithm = True

                def do_POST(self):
                    with server._lock:
                        server.inflight += 1
                        server.max_inflight = max(server.max_inflight, server.inflight)
                    try:
                        super().do_POST()
                    finally:
                        with server._lock:
                            server.inflight -= 1

            class HTTPServer(ThreadingHTTPServer):
                request_queue_size = 1024  # listen backlog: 50+ clients connect at once

            self._stopping.clear()
            self._httpd = HTTPServer((self.host, self.port), Handler)
            self._httpd.daemon_threads = True
            self.port = self._httpd.server_address[1]
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"derived-server:{self.port}", daemon=True)
            self._thread.start()
            return self

        def stats(self) -> dict:
            with self._lock:
                return {"requests": len(self._requests), "connections": self.connections,
                        "max_inflight": self.max_inflight}

        def reset_counters(self) -> None:
            with self._lock:
                self._requests.clear()
                self._headers.clear()
                self.connections = 0
                self.max_inflight = self.inflight

    return DerivedServer(**kw)


def cmd_serve(args) -> int:
    """Helper process: the derived-reply server; commands on stdin, one per
    line: `stats` → JSON; `dump PATH` → request bodies as JSON lines to PATH;
    `reset` → forget requests and counters. EOF stops it."""
    srv = make_server(host="127.0.0.1", port=args.port, zero_latency=not args.delay, delay=args.delay).start()
    print(f"listening on {srv.url}", flush=True)
    try:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "stats":
                print(json.dumps(srv.stats()), flush=True)
            elif cmd == "dump":
                with open(arg, "w") as f:
                    for body in srv.requests:
                        f.write(json.dumps(body, ensure_ascii=False) + "\n")
                print("ok", flush=True)
            elif cmd == "reset":
                srv.reset_counters()
                print("ok", flush=True)
            else:
                print(f"error: unknown command {cmd!r}", flush=True)
    finally:
        srv.stop()
    return 0


class Server:
    """The serve helper, driven from the benchmark process."""

    def __init__(self, res: bench_run.Resources, delay: float = 0.0):
        self.p = subprocess.Popen([sys.executable, str(BENCH / "agents.py"), "serve", "--port", "0",
                                   "--delay", str(delay)],
                                  cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        res.add_proc(self.p)
        line = self.p.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"derived server did not start: {line!r}")
        self.url = line.split()[-1]
        self.pid = self.p.pid

    def ask(self, cmd: str) -> str:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        if out.startswith("error") or not out:
            raise RuntimeError(f"server: {cmd}: {out!r}")
        return out

    def stats(self) -> dict:
        return json.loads(self.ask("stats"))

    def dump(self, path: Path) -> list[dict]:
        self.ask(f"dump {path}")
        with open(path) as f:
            return [json.loads(line) for line in f]

    def reset(self) -> None:
        self.ask("reset")


# -- the stat loop (its own process) ------------------------------------------------------

AT_FDCWD = -100
AT_STATX_FORCE_SYNC = 0x2000
STATX_BASIC_STATS = 0x7FF


def cmd_statloop(args) -> int:
    """Helper process: every `interval` s, os.stat each path; every
    `force_every`th iteration also statx(AT_STATX_FORCE_SYNC) each path (a
    FUSE GETATTR every time, never the kernel's attribute cache). Prints
    `ready`, runs until a line (or EOF) on stdin, writes {name: [ns…]} to --out."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(256)
    paths = [(name, path, path.encode()) for name, path in (x.split("=", 1) for x in args.paths)]
    samples: dict[str, list[int]] = {}
    for name, _, _ in paths:
        samples[name] = []
        samples[name + "_forced"] = []
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    clock, stat, statx = time.perf_counter_ns, os.stat, libc.statx
    i = 0
    errors = 0
    while not stop.is_set():
        for name, path, bpath in paths:
            t0 = clock()
            stat(path)
            samples[name].append(clock() - t0)
        if i % args.force_every == 0:
            for name, path, bpath in paths:
                t0 = clock()
                rc = statx(AT_FDCWD, bpath, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, buf)
                samples[name + "_forced"].append(clock() - t0)
                errors += rc != 0
        if i == 0:
            print("ready", flush=True)
        i += 1
        time.sleep(args.interval)
    samples["errors"] = [errors]
    Path(args.out).write_text(json.dumps(samples))
    return 0


class StatLoop:
    """Runs the statloop helper around one phase of the benchmark."""

    def __init__(self, res: bench_run.Resources, paths: dict[str, Path], out: Path, force_every: int = 5):
        self.out = out
        self.p = subprocess.Popen([sys.executable, str(BENCH / "agents.py"), "statloop", "--out", str(out),
                                   "--force-every", str(force_every), *(f"{k}={v}" for k, v in paths.items())],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        res.add_proc(self.p)
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError("statloop did not start")

    def stop(self) -> dict[str, list[int]]:
        self.p.stdin.write("stop\n")
        self.p.stdin.flush()
        self.p.wait(30)
        if self.p.returncode != 0:
            raise RuntimeError(f"statloop exited {self.p.returncode}")
        data = json.loads(self.out.read_text())
        if data.pop("errors", [0])[0]:
            raise RuntimeError("statx failed in the stat loop")
        return data


def pct(samples: list[int]) -> dict:
    s = sorted(samples)
    if not s:
        return {"n": 0}
    q = lambda p: round(s[min(len(s) - 1, int(p * len(s)))] / 1000, 1)
    return {"p50_us": q(0.50), "p90_us": q(0.90), "p99_us": q(0.99), "p99_9_us": q(0.999),
            "max_us": round(s[-1] / 1000, 1), "over_1ms": sum(1 for x in s if x > 1_000_000), "n": len(s)}


# -- rnixfs agents ---------------------------------------------------------------------------


def spawn_agents(mnt: Path, n: int, tag: str) -> list[int]:
    """n JSON spawn requests through one O_RDWR handle on proc/new."""
    fd = os.open(mnt / "proc" / "new", os.O_RDWR)
    try:
        for i in range(n):
            os.write(fd, json.dumps({"intent": f"bench agent {tag}-{i}, read {FILE} {STEPS} times"}).encode())
        out = b""
        while chunk := os.read(fd, 65536):
            out += chunk
    finally:
        os.close(fd)
    pids = [int(x) for x in out.split()]
    if len(pids) != n:
        raise RuntimeError(f"spawned {n}, read back {len(pids)} PIDs")
    return pids


def verify_agents(mnt: Path, pids: list[int]) -> None:
    bad = {}
    for pid in pids:
        st = json.loads((mnt / "proc" / str(pid) / "status").read_bytes())
        if st["state"] != "zombie" or st["exit_code"] != 0 or st["steps"] != STEPS + 1:
            bad[pid] = (st["state"], st["exit_code"], st["steps"], st.get("error"))
    if bad:
        raise RuntimeError(f"{len(bad)} agents did not finish cleanly, e.g. {list(bad.items())[:3]}")


def rnixfs_phase(mnt: Path, dpid: int, srv: Server, n: int, tag: str, zombies_before: int) -> dict:
    """n agents spawned at once (one handle, n writes); done when all are zombies."""
    live: list[int] = []
    done = threading.Event()

    def sample_live():  # agents alive (created or running), 4 times a second
        while not done.wait(0.25):
            c = bench_run.counts(mnt)
            live.append(c.get("created", 0) + c.get("running", 0))
            meter.sample()

    meter = bench_run.DaemonCpu(dpid)  # the daemon and its worker processes
    cpu_d, cpu_s = meter.sample(), bench_run.cpu(srv.pid)
    sampler = threading.Thread(target=sample_live, daemon=True)
    t0 = time.perf_counter()
    sampler.start()
    try:
        pids = spawn_agents(mnt, n, tag)
        t_spawned = time.perf_counter()
        t_end = bench_run.wait_all_zombie(mnt, zombies_before + n, timeout=max(300.0, n * 1.0), last_pid=max(pids))
    finally:
        done.set()
        sampler.join(10)
    cpu_d, cpu_s = meter.sample() - cpu_d, bench_run.cpu(srv.pid) - cpu_s
    st = srv.stats()
    verify_agents(mnt, pids)
    if st["requests"] != n * (STEPS + 1):
        raise RuntimeError(f"rnixfs phase {tag}: {st['requests']} requests, expected {n * (STEPS + 1)}")
    return {"side": "rnixfs", "tag": tag, "agents": n, "wall_s": t_end - t0, "spawn_writes_s": t_spawned - t0,
            "live_agents_max": max(live, default=0),
            "live_agents_median": statistics.median(live) if live else 0,
            "client_cpu_s": cpu_d, "server_cpu_s": cpu_s, **st, "pids": pids}


def agent_bodies(bodies: list[dict], strict: bool = True) -> list[list[dict]]:
    """Request bodies grouped by agent (its intent), in conversation order;
    with strict=False an agent that did not make its 6 requests is left out."""
    by: dict[str, list[dict]] = {}
    for b in bodies:
        by.setdefault(b["messages"][1]["content"], []).append(b)
    out = []
    for intent, seq in by.items():
        seq.sort(key=lambda b: len(b["messages"]))
        if [len(b["messages"]) for b in seq] != [2 + 2 * i for i in range(STEPS + 1)]:
            if not strict:
                continue
            raise RuntimeError(f"unexpected conversation shape for {intent!r}: "
                               f"{[len(b['messages']) for b in seq]}")
        out.append(seq)
    return out


# -- the plain httpx client -----------------------------------------------------------------


async def plain_agents(url: str, agents: list[list[dict]], concurrency: int, workspace: Path,
                       shared: bool = False) -> int:
    """Replay each agent's requests in order (streamed, SSE parsed, tool calls
    assembled; the file read where a Read came back), `concurrency` agents
    at a time. Each worker has its own httpx.AsyncClient (one keep-alive
    connection), or with `shared` all use one client with httpx's default
    pool (100 connections, 20 kept alive), built like rnixfs's."""
    import httpx
    import trio

    endpoint = f"{url}/chat/completions"
    steps = 0
    todo = iter(agents)

    ssl_context = httpx.create_ssl_context()  # ~30 ms each: build it once, not per client

    def new_client():
        return httpx.AsyncClient(headers={"Accept": "text/event-stream"}, verify=ssl_context,
                                 timeout=httpx.Timeout(10.0, connect=10.0, pool=None))

    async def worker(client):
        nonlocal steps
        for seq in todo:
            for i, body in enumerate(seq):
                text, calls = await one(client, body)
                steps += 1
                if i < STEPS:
                    if len(calls) != 1 or calls[0]["name"] != "Read":
                        raise RuntimeError(f"step {i}: expected a Read call, got {calls!r}")
                    args = json.loads(calls[0]["arguments"])
                    (workspace / args["path"]).read_bytes()
                elif calls or not text:
                    raise RuntimeError(f"last step: expected a final text, got {text!r} {calls!r}")

    async def own_client():
        async with new_client() as client:
            await worker(client)

    async def one(client, body: dict) -> tuple[str, list[dict]]:
        text, calls = [], {}
        async with client.stream("POST", endpoint, json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue  # read to the end: the connection goes back to the pool
                obj = json.loads(data)
                for ch in obj.get("choices") or ():
                    delta = ch.get("delta") or {}
                    text.append(delta.get("content") or "")
                    for d in delta.get("tool_calls") or ():
                        c = calls.setdefault(d.get("index", 0), {"name": "", "arguments": ""})
                        fn = d.get("function") or {}
                        c["name"] += fn.get("name") or ""
                        c["arguments"] += fn.get("arguments") or ""
        return "".join(text), [calls[i] for i in sorted(calls)]

    if shared:
        async with new_client() as client, trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker, client)
    else:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(own_client)
    return steps

def plain_phase(srv: Server, agents: list[list[dict]], concurrency: int, workspace: Path, tag: str,
                shared: bool = False) -> dict:
    import trio

    me = psutil.Process()
    t = me.cpu_times()
    cpu_c, cpu_s = t.user + t.system, bench_run.cpu(srv.pid)
    t0 = time.perf_counter()
    steps = trio.run(plain_agents, srv.url, agents, concurrency, workspace, shared)
    wall = time.perf_counter() - t0
    t = me.cpu_times()
    cpu_c, cpu_s = t.user + t.system - cpu_c, bench_run.cpu(srv.pid) - cpu_s
    st = srv.stats()
    if steps != len(agents) * (STEPS + 1) or st["requests"] != steps:
        raise RuntimeError(f"plain phase {tag}: {steps} steps, {st['requests']} requests")
    return {"side": "plain_shared" if shared else "plain", "tag": tag, "agents": len(agents), "wall_s": wall,
            "client_cpu_s": cpu_c, "server_cpu_s": cpu_s, **st}


# -- the run ---------------------------------------------------------------------------------

SIDES = ("rnixfs", "plain", "plain_shared")
RUNNING = {"rnixfs": "agents_running", "plain": "plain_running", "plain_shared": "plain_shared_running"}


def side_total(phases: list[dict], side: str) -> dict:
    ph = [p for p in phases if p["side"] == side]
    agents = sum(p["agents"] for p in ph)
    steps = agents * (STEPS + 1)
    wall = sum(p["wall_s"] for p in ph)
    ccpu = sum(p["client_cpu_s"] for p in ph)
    scpu = sum(p["server_cpu_s"] for p in ph)
    out = {"agents": agents, "steps": steps, "wall_s": round(wall, 3),
           "steps_per_s": round(steps / wall, 1), "agents_per_s": round(agents / wall, 1),
           "wall_ms_per_step": round(wall * 1000 / steps, 4),
           "client_cpu_s": round(ccpu, 3), "client_cpu_ms_per_step": round(ccpu * 1000 / steps, 4),
           "server_cpu_ms_per_step": round(scpu * 1000 / steps, 4),
           "connections": sum(p["connections"] for p in ph),
           "max_inflight": max(p["max_inflight"] for p in ph)}
    if side == "rnixfs":
        out["spawn_writes_per_s"] = round(agents / sum(p["spawn_writes_s"] for p in ph), 1)
        out["live_agents_max"] = max(p["live_agents_max"] for p in ph)
    return out


def run(args) -> dict:
    n = args.agents or (100 if args.quick else 1000)
    rounds = args.rounds or 2
    if n % rounds:
        raise SystemExit(f"--agents {n} is not a multiple of --rounds {rounds}")
    per = n // rounds
    sides = [x for x in SIDES if x != "plain_shared" or args.shared_concurrency > 0]
    shared_conc = min(args.shared_concurrency, per)
    idle_s = 2.0 if args.quick else 5.0
    out: dict = {"meta": {
        "quick": args.quick, "python": platform.python_version(), "machine": platform.machine(),
        "kernel": platform.release(), "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip()},
        "config": {"agents_per_side": n, "tool_steps": STEPS, "requests_per_agent": STEPS + 1,
                   "rounds": rounds, "agents_per_round": per, "plain_concurrency": args.plain_concurrency,
                   "plain_shared_concurrency": shared_conc, "file_bytes": len(FILE_TEXT.encode())}}
    res = bench_run.Resources()
    tmp = Path(tempfile.mkdtemp(prefix="rnixfs-bench-agents-"))
    try:
        srv = Server(res, delay=args.delay)
        mnt, dpid = bench_run.mount_rnixfs(res, tmp, srv.url, linger=10 ** 7)
        workspace = tmp / "project"
        (workspace / FILE).write_text(FILE_TEXT)
        bench_run.log(f"rnixfs at {mnt} (daemon {dpid}), derived-reply server {srv.url} (pid {srv.pid})")

        # Warm-up of every side (HTTP clients, PID blocks, the workspace path);
        # its request bodies feed the first plain phases.
        warm = max(10, per // 20)
        w = rnixfs_phase(mnt, dpid, srv, warm, "warm", 0)
        zombies = warm
        bodies = agent_bodies(srv.dump(tmp / "bodies.jsonl"))
        srv.reset()
        for shared in (False, "plain_shared" in sides)[:1 + ("plain_shared" in sides)]:
            plain_phase(srv, bodies, min(args.plain_concurrency, warm), workspace, "warm", shared)
            srv.reset()
        sizes = [len(json.dumps(b)) for b in bodies[0]]
        out["config"]["request_body_bytes"] = sizes
        bench_run.log(f"warm-up: {warm} agents in {w['wall_s']:.2f} s; request bodies {sizes} bytes")
        bodies = [bodies[i % len(bodies)] for i in range(per)]  # until the first rnixfs round

        stat_paths = {"new": mnt / "proc" / "new", "status": mnt / "proc" / str(w["pids"][0]) / "status"}
        stat: dict[str, dict[str, list[int]]] = {"idle": {}, **{RUNNING[x]: {} for x in sides}}

        def collect(label: str, loop: StatLoop) -> None:
            for k, v in loop.stop().items():
                stat[label].setdefault(k, []).extend(v)

        def idle(label: str) -> None:
            bench_run.log(f"stat loop on the idle mount, {idle_s:.0f} s ({label})")
            loop = StatLoop(res, stat_paths, tmp / "stat.json")
            time.sleep(idle_s)
            collect("idle", loop)

        idle("before")
        phases: list[dict] = []
        for r in range(rounds):
            tag = f"r{r + 1}"
            for side in (sides if r % 2 == 0 else sides[::-1]):
                loop = StatLoop(res, stat_paths, tmp / "stat.json")
                if side == "rnixfs":
                    bench_run.log(f"round {r + 1}: {per} rnixfs agents × {STEPS + 1} requests, all at once")
                    p = rnixfs_phase(mnt, dpid, srv, per, tag, zombies)
                    zombies += per
                    p.pop("pids")
                elif side == "plain":
                    bench_run.log(f"round {r + 1}: {len(bodies)} plain httpx agents × {STEPS + 1} requests, "
                          f"{args.plain_concurrency} at a time, one client each")
                    p = plain_phase(srv, bodies, args.plain_concurrency, workspace, tag)
                else:
                    bench_run.log(f"round {r + 1}: {len(bodies)} plain httpx agents × {STEPS + 1} requests, "
                          f"{shared_conc} at a time, one shared client")
                    p = plain_phase(srv, bodies, shared_conc, workspace, tag, shared=True)
                collect(RUNNING[side], loop)
                if side == "rnixfs":
                    bodies = agent_bodies(srv.dump(tmp / "bodies.jsonl"))
                srv.reset()
                bench_run.log(f"  {side}: {p['wall_s']:.2f} s, client CPU {p['client_cpu_s']:.2f} s, "
                      f"server CPU {p['server_cpu_s']:.2f} s, {p['connections']} connections, "
                      f"max {p['max_inflight']} in flight" + (
                          f"; spawn writes took {p['spawn_writes_s']:.1f} s, at most "
                          f"{p['live_agents_max']} agents alive" if side == "rnixfs" else ""))
                phases.append({k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()})
        idle("after")

        loop_out: dict = {x: side_total(phases, x) for x in sides}
        rn = loop_out["rnixfs"]
        for x in sides[1:]:
            b = loop_out[x]
            per_round = []
            for r in range(rounds):
                pa = next(p for p in phases if p["side"] == "rnixfs" and p["tag"] == f"r{r + 1}")
                pb = next(p for p in phases if p["side"] == x and p["tag"] == f"r{r + 1}")
                per_round.append(round(pa["wall_s"] / pb["wall_s"], 2))
            loop_out[f"vs_{x}"] = {
                "ratio_wall": round(rn["wall_s"] / b["wall_s"], 2),
                "ratio_wall_per_round": per_round,
                "overhead_wall_ms_per_step": round(rn["wall_ms_per_step"] - b["wall_ms_per_step"], 4),
                "ratio_client_cpu": round(rn["client_cpu_s"] / b["client_cpu_s"], 2),
                "overhead_cpu_ms_per_step": round(rn["client_cpu_ms_per_step"] - b["client_cpu_ms_per_step"], 4),
            }
        loop_out["phases"] = phases
        out["agent_loop"] = loop_out
        out["stat_latency"] = {label: {k: pct(v) for k, v in d.items()} for label, d in stat.items()}
        out["stat_latency"]["paths"] = {k: str(v.relative_to(mnt)) for k, v in stat_paths.items()}
        threads = sorted((t.user_time + t.system_time for t in psutil.Process(dpid).threads()), reverse=True)
        out["daemon_final"] = {"rss_bytes": bench_run.rss(dpid), "counts": bench_run.counts(mnt),
                               "cpu_s": round(bench_run.cpu(dpid), 2), "threads_cpu_s": [round(x, 2) for x in threads]}
    finally:
        res.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def table(r: dict) -> str:
    a = r["agent_loop"]
    sides = [x for x in SIDES if x in a]
    names = {"rnixfs": "rnixfs agents", "plain": f"plain httpx ({r['config']['plain_concurrency']} at a time)",
             "plain_shared": f"plain httpx, 1 shared client ({r['config']['plain_shared_concurrency']} at a time)"}
    rows = [("agent loop", *(names[x] for x in sides))]
    cols = {x: a[x] for x in sides}
    rows.append(("agents × requests", *(f"{c['agents']} × {STEPS + 1}" for c in cols.values())))
    rows.append(("total wall time", *(f"{c['wall_s']:.2f} s" for c in cols.values())))
    rows.append(("throughput", *(f"{c['steps_per_s']:.0f} steps/s, {c['agents_per_s']:.1f} agents/s"
                                 for c in cols.values())))
    rows.append(("wall per step", *(f"{c['wall_ms_per_step']:.3f} ms" for c in cols.values())))
    rows.append(("client CPU per step (rnixfs: daemon)", *(f"{c['client_cpu_ms_per_step']:.3f} ms" for c in cols.values())))
    rows.append(("server CPU per step", *(f"{c['server_cpu_ms_per_step']:.3f} ms" for c in cols.values())))
    rn = a["rnixfs"]
    rows.append(("rnixfs: spawn writes / agents alive", f"{rn['spawn_writes_per_s']:.0f} /s / max {rn['live_agents_max']}"))
    rows.append(("TCP connections / max in flight",
                 *(f"{c['connections']} / {c['max_inflight']}" for c in cols.values())))
    vs = [a[f"vs_{x}"] for x in sides[1:]]
    rows.append(("rnixfs / this, wall time", "", *(f"{v['ratio_wall']:.2f}x (rounds: "
                 f"{', '.join(f'{y:.2f}' for y in v['ratio_wall_per_round'])})" for v in vs)))
    rows.append(("rnixfs - this, wall per step", "", *(f"{v['overhead_wall_ms_per_step']:+.3f} ms" for v in vs)))
    rows.append(("rnixfs / this, client CPU", "", *(f"{v['ratio_client_cpu']:.2f}x" for v in vs)))
    rows.append(("rnixfs - this, CPU per step", "", *(f"{v['overhead_cpu_ms_per_step']:+.3f} ms" for v in vs)))
    st = r["stat_latency"]
    labels = [x for x in ("idle", "plain_running", "plain_shared_running", "agents_running") if x in st]
    rows.append(("",))
    rows.append(("stat p50 / p99 / max (µs)",
                 *({"idle": "idle mount", "plain_running": "plain running (mount idle)",
                    "plain_shared_running": "plain shared running (mount idle)",
                    "agents_running": "rnixfs agents running"}[l] for l in labels)))
    for key, label in (("new", "os.stat proc/new"), ("status", "os.stat proc/<pid>/status"),
                       ("new_forced", "statx FORCE_SYNC proc/new"), ("status_forced", "statx FORCE_SYNC status")):
        rows.append((label, *(f"{st[l][key]['p50_us']:.0f} / {st[l][key]['p99_us']:.0f} / {st[l][key]['max_us']:.0f}"
                              for l in labels)))
    ncol = max(len(x) for x in rows)
    rows = [tuple(x) + ("",) * (ncol - len(x)) for x in rows]
    widths = [max(len(x[i]) for x in rows) for i in range(ncol)]
    fmt = lambda row: "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip()
    lines = []
    for i, row in enumerate(rows):
        lines.append(fmt(row))
        if i == 0 or row[0] == "stat p50 / p99 / max (µs)":
            lines.append(fmt(tuple("-" * w for w in widths)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rnixfs agent-loop benchmark (see bench/README.md)")
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="(helper) the derived-reply scripted server")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--delay", type=float, default=0.0, help="seconds before each reply (0: zero latency)")
    s = sub.add_parser("statloop", help="(helper) the stat loop")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.001)
    s.add_argument("--force-every", type=int, default=5)
    s.add_argument("paths", nargs="+", help="NAME=PATH")
    ap.add_argument("--quick", action="store_true", help="100 agents instead of 1000")
    ap.add_argument("--agents", type=int, help="agents per side (default 1000, --quick 100)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds, R P then P R … (default 2)")
    ap.add_argument("--plain-concurrency", type=int, default=50, help="agents at a time on the plain side")
    ap.add_argument("--shared-concurrency", type=int, default=100,
                    help="agents at a time on the plain side with one shared client (0: skip that side)")
    ap.add_argument("--delay", type=float, default=0.0,
                    help="server reply delay in s (default 0; bench/table.py's load uses 1)")
    ap.add_argument("--out", default=str(BENCH / "results-agents.json"))
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return cmd_serve(args)
    if args.cmd == "statloop":
        return cmd_statloop(args)
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
