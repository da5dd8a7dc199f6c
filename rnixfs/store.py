"""The state store: one SQLite file, written in batches by one thread.

Why a writer thread: SQLite calls block, and the FUSE loop must never wait
on a disk commit. Everything a reader can see (trace lines, events, exit
records) is handed back to the kernel only after its batch has committed,
so a daemon crash never loses something a reader already saw.
"""
from __future__ import annotations

import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS processes (
    pid INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,
    ppid INTEGER NOT NULL,
    state TEXT NOT NULL,
    daemon TEXT NOT NULL,
    intent TEXT NOT NULL,
    created REAL NOT NULL,
    exited REAL,
    exit_code INTEGER,
    result TEXT,
    status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS processes_state ON processes(state);
CREATE TABLE IF NOT EXISTS events (
    pid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    line TEXT NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (pid, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    daemon TEXT NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""

LIVE_STATES = ("created", "running", "zombie")
_STOP = object()


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    else:
        conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
        conn.executescript(SCHEMA)
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.row_factory = sqlite3.Row
    return conn


class Store:
    """Batched writes through one thread; short synchronous calls for setup.

    ``on_commit`` is called (from the writer thread) with the list of
    committed operations' callbacks; the daemon routes it into trio with
    ``TrioToken.run_sync_soon``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = connect(self.path)
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.dispatch: Callable[[list[Callable[[], None]]], None] = run_all
        self.failed: BaseException | None = None

    # -- synchronous setup calls (run via trio.to_thread) --------------------
    def reserve_pids(self, count: int) -> range:
        """Reserve a block of PIDs; the counter survives restarts."""
        with self._lock_conn() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key='next_pid'").fetchone()
            start = int(row[0]) if row else 1
            top = conn.execute("SELECT MAX(pid) FROM processes").fetchone()[0] or 0
            start = max(start, top + 1)
            conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('next_pid', ?)",
                (str(start + count),),
            )
        return range(start, start + count)

    def recover(self, daemon_id: str) -> int:
        """Mark processes left live by an earlier daemon as dead."""
        now = time.time()
        with self._lock_conn() as conn:
            rows = conn.execute(
                "SELECT pid, state, status FROM processes WHERE daemon != ? AND state IN (?,?,?)",
                (daemon_id, *LIVE_STATES),
            ).fetchall()
            for row in rows:
                status = json.loads(row["status"])
                if row["state"] != "zombie":
                    status["exit_code"] = 137
                    status["exited"] = status.get("exited") or now
                    status["error"] = {
                        "code": "INTERNAL",
                        "syscall": "Exit",
                        "pid": row["pid"],
                        "device": "",
                        "cause": "the daemon stopped before the process exited",
                    }
                status["state"] = "dead"
                status["paused"] = False  # nothing runs any more: no flag, no open descriptor
                status["fds"] = {}
                conn.execute(
                    "UPDATE processes SET state='dead', exit_code=?, exited=?, status=? WHERE pid=?",
                    (status["exit_code"], status["exited"], json.dumps(status), row["pid"]),
                )
        return len(rows)

    @contextlib.contextmanager
    def _lock_conn(self):
        """A short-lived connection in one IMMEDIATE transaction.

        The writer thread owns ``self._conn``; setup calls use their own.
        """
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    # -- the writer thread ------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._writer, name="rnixfs-store", daemon=True)
        self._thread.start()

    def put_event(self, pid: int, seq: int, line: str, js: str, on_commit=None) -> None:
        self._queue.put(("event", (pid, seq, line, js), on_commit))

    def put_process(self, status: dict, result: str | None, on_commit=None) -> None:
        row = (
            status["pid"], status["uuid"], status["ppid"], status["state"],
            status["daemon"], status["intent"], status["created"], status["exited"],
            status["exit_code"], result, json.dumps(status),
        )
        self._queue.put(("process", row, on_commit))

    def put_audit(self, daemon: str, action: str, detail: dict, on_commit=None) -> None:
        self._queue.put(("audit", (time.time(), daemon, action, json.dumps(detail)), on_commit))

    def put_barrier(self, on_commit) -> None:
        self._queue.put(("barrier", None, on_commit))

    def stop(self) -> None:
        """Commit what is queued and stop the writer (blocking)."""
        if self._thread is not None:
            self._queue.put((_STOP, None, None))
            self._thread.join()
            self._thread = None
        self._conn.close()

    def _writer(self) -> None:
        while True:
            batch = [self._queue.get()]
            try:
                while len(batch) < 2000:
                    batch.append(self._queue.get_nowait())
            except queue.Empty:
                pass
            stop = any(op is _STOP for op, _, _ in batch)
            if not self._commit_retrying(batch, stop):
                return  # given up at shutdown: nothing unsaved is shown
            callbacks = [cb for _, _, cb in batch if cb is not None]
            if callbacks:
                try:
                    self.dispatch(callbacks)
                except Exception:  # trio already gone during shutdown
                    log.debug("commit callbacks dropped", exc_info=True)
            if stop:
                return

    def _commit_retrying(self, batch: list, stopping: bool) -> bool:
        """Commit, retrying with backoff (a full disk, a locked file) until it
        works; only then may readers see the batch. At shutdown, give up after
        a few tries rather than hang."""
        delay = 0.05
        for attempt in range(1, 1_000_000):
            try:
                self._commit(batch)
                self.failed = None
                return True
            except Exception as exc:
                self.failed = exc
                log.error("store commit failed (attempt %d): %s", attempt, exc)
                if stopping and attempt >= 5:
                    log.error("giving up: %d operations not saved", len(batch))
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return False

    def _commit(self, batch: list) -> None:
        events = [row for op, row, _ in batch if op == "event"]
        procs = [row for op, row, _ in batch if op == "process"]
        audits = [row for op, row, _ in batch if op == "audit"]
        with self._conn:
            if events:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO events(pid, seq, line, json) VALUES (?,?,?,?)", events
                )
            if procs:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO processes(pid, uuid, ppid, state, daemon, intent,"
                    " created, exited, exit_code, result, status) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    procs,
                )
            if audits:
                self._conn.executemany(
                    "INSERT INTO audit(ts, daemon, action, detail) VALUES (?,?,?,?)", audits
                )


def run_all(callbacks: Iterable[Callable[[], None]]) -> None:
    for cb in callbacks:
        cb()


# -- read side, used by the CLI without a daemon ------------------------------
class StoreReader:
    """Read-only queries for `rnixfs ps --all` and `rnixfs show`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._conn = connect(self.path, readonly=True)

    def close(self) -> None:
        self._conn.close()

    def processes(self, *, include_dead: bool = True, limit: int | None = None) -> list[dict]:
        sql = "SELECT status FROM processes"
        if not include_dead:
            sql += " WHERE state != 'dead'"
        sql += " ORDER BY pid"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [json.loads(r[0]) for r in self._conn.execute(sql)]

    def process(self, pid: int) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT status, result FROM processes WHERE pid=?", (pid,)).fetchone()
        if row is None:
            return None
        status = json.loads(row["status"])
        status["result"] = row["result"]
        return status

    def trace(self, pid: int) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT line FROM events WHERE pid=? ORDER BY seq", (pid,))]

    def events(self, pid: int) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT json FROM events WHERE pid=? ORDER BY seq", (pid,))]

    def counts(self, daemon: str | None = None) -> dict[str, int]:
        sql = "SELECT state, COUNT(*) FROM processes"
        args: tuple = ()
        if daemon:
            sql += " WHERE daemon=?"
            args = (daemon,)
        sql += " GROUP BY state"
        return {r[0]: r[1] for r in self._conn.execute(sql, args)}
