"""The state store: one SQLite file, written in batches by one thread.

Why a writer thread: SQLite calls block, and the FUSE loop must never wait
on a disk commit. Everything a reader can see (trace lines, events, exit
records) is handed back to the kernel only after its batch has committed,
so a daemon crash never loses something a reader already saw.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from .kernel.errors import Code, SyscallError

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
RETRY_WINDOW = 8.0  # seconds a failing commit is retried before the store degrades
MAX_BATCH = 2000  # operations per transaction
# Once woken, the writer waits this long for more operations, so a busy
# daemon commits (and hands results back) once per batch, not per event.
BATCH_LINGER = 0.002
MAX_PID = 2**53  # PIDs stay exact in JSON numbers


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def is_disk_full(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "disk is full" in str(exc) or (
        isinstance(exc, OSError) and exc.errno == errno.ENOSPC)


def unavailable(reason: str, *, disk_full: bool) -> SyscallError:
    """The error a spawn gets while the store cannot take writes."""
    return SyscallError(Code.NO_SPACE if disk_full else Code.READ_ONLY,
                        f"the state store cannot be written ({reason}); the mount is read-only"
                        " until it is remounted", syscall="Spawn", device="/proc/new")


def parse_status(text: Any) -> dict | None:
    """A status column as a dict, or None when the row is damaged (not JSON,
    not an object, or missing what `ps` shows)."""
    try:
        status = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(status, dict):
        return None
    tokens = status.get("tokens")
    ok = (isinstance(status.get("pid"), int) and isinstance(status.get("ppid"), int)
          and isinstance(status.get("state"), str) and isinstance(status.get("intent"), str)
          and isinstance(status.get("agent"), str) and isinstance(status.get("steps"), int)
          and (status.get("exit_code") is None or isinstance(status.get("exit_code"), int))
          and isinstance(tokens, dict) and isinstance(tokens.get("in"), int)
          and isinstance(tokens.get("out"), int))
    return status if ok else None


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

    Operations queue in a deque; the first one of a batch wakes the writer
    (later ones do not touch a lock), which gathers what comes within
    ``BATCH_LINGER``, commits it in one transaction and then hands all its
    callbacks over at once: ``dispatch`` is called (from the writer thread)
    with the list; the daemon routes it into trio with one
    ``TrioToken.run_sync_soon``. Several status checkpoints of one process
    in a batch are written once (the last one wins).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = connect(self.path)
        self._ops: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._signalled = False  # the writer has been woken for what is queued
        self.commits = 0  # transactions committed (tests)
        self._thread: threading.Thread | None = None
        self.dispatch: Callable[[list[Callable[[], None]]], None] = run_all
        self.failed: BaseException | None = None  # the last commit error, while retrying
        # Set once commits failed for RETRY_WINDOW: from then on nothing is
        # written, spawns are refused, and what runs goes on in memory only.
        self.degraded: str | None = None
        self.degraded_disk_full = False

    def check_writable(self) -> None:
        """Raise the errno a spawn gets when the store no longer takes writes."""
        if self.degraded:
            raise unavailable(self.degraded, disk_full=self.degraded_disk_full)

    # -- synchronous setup calls (run via trio.to_thread) --------------------
    def reserve_pids(self, count: int) -> range:
        """Reserve a block of PIDs; the counter survives restarts."""
        self.check_writable()
        try:
            with self._lock_conn() as conn:
                row = conn.execute("SELECT value FROM meta WHERE key='next_pid'").fetchone()
                start = _pid_counter(row[0]) if row else 1   # a new store has no counter yet
                top = conn.execute("SELECT MAX(pid) FROM processes").fetchone()[0] or 0
                start = max(start, _pid_counter(top) + 1 if top else 1)
                if start + count > MAX_PID:
                    raise sqlite3.DataError(f"PIDs exhausted (next would be {start})")
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('next_pid', ?)",
                    (str(start + count),),
                )
        except (sqlite3.Error, OSError) as exc:
            log.error("reserving PIDs failed: %s", exc)
            raise unavailable(describe_error(exc), disk_full=is_disk_full(exc)) from None
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
                status = parse_status(row["status"])
                if status is None:  # damaged: retire it, keep the text as evidence
                    log.warning("process %s: status is damaged; marked dead as it is", row["pid"])
                    conn.execute("UPDATE processes SET state='dead' WHERE pid=?", (row["pid"],))
                    continue
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

    def _put(self, op) -> None:
        self._ops.append(op)
        if not self._signalled:  # the writer resets it before it takes the queue
            self._signalled = True
            self._wake.set()

    def put_event(self, pid: int, seq: int, line: str, js: str, on_commit=None) -> None:
        self._put(("event", (pid, seq, line, js), on_commit))

    def put_process(self, status: dict, result: str | None, on_commit=None) -> None:
        """Queue a status snapshot; ``status`` must be a fresh dict nobody
        changes afterwards (it is serialized on the writer thread)."""
        self._put(("process", (status, result), on_commit))

    def put_audit(self, daemon: str, action: str, detail: dict, on_commit=None) -> None:
        self._put(("audit", (time.time(), daemon, action, json.dumps(detail)), on_commit))

    def put_barrier(self, on_commit) -> None:
        self._put(("barrier", None, on_commit))

    def stop(self) -> None:
        """Commit what is queued and stop the writer (blocking)."""
        if self._thread is not None:
            self._put((_STOP, None, None))
            self._thread.join()
            self._thread = None
        try:
            self._conn.close()
        except sqlite3.Error as exc:
            log.error("closing the store: %s", exc)

    def _take(self) -> list:
        """The next batch: wait for the first operation, then a moment for more."""
        if not self._ops:
            self._wake.wait()
        time.sleep(BATCH_LINGER)
        self._wake.clear()
        self._signalled = False  # from here on a new operation wakes the writer again
        batch = []
        while self._ops and len(batch) < MAX_BATCH:
            batch.append(self._ops.popleft())
        return batch

    def _writer(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                continue
            stop = any(op is _STOP for op, _, _ in batch)
            if self.degraded is None and not self._commit_retrying(batch, stop):
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
        """Commit, retrying with backoff (a locked file, a disk about to be
        freed); only then may readers see the batch. A failure that outlasts
        RETRY_WINDOW degrades the store (see ``degraded``): the batch is
        dropped but handed on, so nothing waits forever on a commit and
        unmount still ends the daemon. At shutdown, give up sooner."""
        delay = 0.05
        deadline = time.monotonic() + RETRY_WINDOW
        attempt = 0
        while True:
            attempt += 1
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
                if time.monotonic() + delay > deadline:
                    self._degrade(exc, len(batch))
                    return True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _degrade(self, exc: BaseException, lost: int) -> None:
        self.degraded_disk_full = is_disk_full(exc)
        self.degraded = describe_error(exc)
        log.error("state store degraded to read-only after %.0fs of failures: %s; %d operations"
                  " not saved; new spawns are refused until the daemon is remounted",
                  RETRY_WINDOW, self.degraded, lost)

    def _commit(self, batch: list) -> None:
        events = [row for op, row, _ in batch if op == "event"]
        latest = {status["pid"]: (status, result) for op, (status, result), _ in
                  (x for x in batch if x[0] == "process")}  # the last checkpoint of each wins
        # default=str: a value JSON cannot encode must not fail the whole batch
        procs = [(status["pid"], status["uuid"], status["ppid"], status["state"], status["daemon"],
                  status["intent"], status["created"], status["exited"], status["exit_code"], result,
                  json.dumps(status, default=str)) for status, result in latest.values()]
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
        self.commits += 1


def _pid_counter(value: Any) -> int:
    """The stored PID counter, or 1 when it is not a sane number (it is
    then raised above the highest PID in use)."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        log.warning("meta.next_pid %r is not a number; using the highest PID instead", value)
        return 1
    if not 1 <= n <= MAX_PID:
        log.warning("meta.next_pid %r is out of range; using the highest PID instead", value)
        return 1
    return n


def run_all(callbacks: Iterable[Callable[[], None]]) -> None:
    for cb in callbacks:
        cb()


# -- read side, used by the CLI without a daemon ------------------------------
class StoreReader:
    """Read-only queries for `rnixfs ps --all` and `rnixfs show`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._conn = connect(self.path, readonly=True)
        self.skipped: list[str] = []  # damaged rows left out, one reason each

    def close(self) -> None:
        self._conn.close()

    def processes(self, *, include_dead: bool = True, limit: int | None = None) -> list[dict]:
        """Status dicts; damaged rows are left out and described in ``skipped``."""
        sql = "SELECT pid, status FROM processes"
        if not include_dead:
            sql += " WHERE state != 'dead'"
        sql += " ORDER BY pid"
        if limit:
            sql += f" LIMIT {int(limit)}"
        out = []
        for pid, text in self._conn.execute(sql):
            status = parse_status(text)
            if status is None:
                self.skipped.append(f"process {pid}: damaged record skipped (status is not a valid status)")
            else:
                out.append(status)
        return out

    def process(self, pid: int) -> dict[str, Any] | None:
        """One record; raises ValueError when it is damaged."""
        row = self._conn.execute("SELECT status, result FROM processes WHERE pid=?", (pid,)).fetchone()
        if row is None:
            return None
        status = parse_status(row["status"])
        if status is None:
            raise ValueError(f"process {pid}: the record in {self.path} is damaged (status is not a valid status)")
        result = row["result"]
        status["result"] = result if result is None or isinstance(result, str) else str(result)
        return status

    def trace(self, pid: int) -> list[str]:
        return [r[0] if isinstance(r[0], str) else str(r[0])
                for r in self._conn.execute("SELECT line FROM events WHERE pid=? ORDER BY seq", (pid,))]

    def events(self, pid: int) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT json FROM events WHERE pid=? ORDER BY seq", (pid,))]

    def event_dicts(self, pid: int) -> list[dict]:
        """Parsed events; damaged ones are left out and described in ``skipped``."""
        out = []
        for i, text in enumerate(self.events(pid)):
            try:
                out.append(json.loads(text))
            except (TypeError, ValueError, RecursionError):
                self.skipped.append(f"process {pid}: damaged event {i} skipped")
        return out

    def counts(self, daemon: str | None = None) -> dict[str, int]:
        sql = "SELECT state, COUNT(*) FROM processes"
        args: tuple = ()
        if daemon:
            sql += " WHERE daemon=?"
            args = (daemon,)
        sql += " GROUP BY state"
        return {r[0]: r[1] for r in self._conn.execute(sql, args)}
