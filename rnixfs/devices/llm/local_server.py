"""Serve the embedded GGUF model over OpenAI-compatible HTTP on 127.0.0.1.

Runs as its own process (``python -m rnixfs.devices.llm.local_server``) so a
crash or a memory spike in llama.cpp cannot take the FUSE daemon down, and so
the daemon can always reclaim the ~300 MB by killing it. Exits on SIGTERM or
SIGINT, and when its parent dies (no orphans after a daemon crash): with
``--watch-stdin`` on EOF of stdin (a pipe only the parent holds), and with
``--parent-pid`` when it is reparented. Not PR_SET_PDEATHSIG: that fires when
the parent *thread* that forked exits, and trio forks from a worker thread.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path


def _watch_stdin(stop: threading.Event) -> None:
    """Set ``stop`` when stdin reaches EOF (the parent closed it or died)."""
    def run() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()
    threading.Thread(target=run, name="stdin-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rnixfs.devices.llm.local_server")
    ap.add_argument("--model", required=True, type=Path, help="path to the GGUF file")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ready-file", type=Path,
                    help="write the listening address here once serving")
    ap.add_argument("--parent-pid", type=int, help="exit if this process goes away")
    ap.add_argument("--watch-stdin", action="store_true", help="exit on EOF of stdin")
    args = ap.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.watch_stdin:
        _watch_stdin(stop)
    if args.parent_pid and os.getppid() != args.parent_pid:
        return 1  # the parent is already gone

    try:
        import xllamacpp
    except ImportError as e:
        print(f"local_server: xllamacpp is not installed ({e})", file=sys.stderr)
        return 2
    if not args.model.is_file():
        print(f"local_server: no model file at {args.model}", file=sys.stderr)
        return 2

    p = xllamacpp.CommonParams()
    p.model.path = str(args.model)
    p.hostnames = ["127.0.0.1"]
    p.port = args.port
    p.n_ctx = args.ctx
    p.n_parallel = args.parallel
    p.use_jinja = True
    p.verbosity = 0  # errors and the startup banner only
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(p)  # loads the model and starts serving
    address = server.listening_address
    print(f"listening on {address}/v1", flush=True)
    if args.ready_file:
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(address + "\n")
        tmp.replace(args.ready_file)

    while not stop.wait(0.5):
        if args.parent_pid and os.getppid() != args.parent_pid:
            print("local_server: parent is gone", flush=True)
            break
    print("local_server: stopping", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # llama.cpp's server threads are not joinable from Python; the model is
    # read-only, so leaving without destructors loses nothing.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
