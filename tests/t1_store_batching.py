"""The store's writer batches (rnixfs/store.py, docs/architecture.md): one
transaction and one hand-over per batch, in order, and a callback only
after its row is committed."""
from __future__ import annotations

import json
import sqlite3
import threading

from rnixfs.store import Store, StoreReader, run_all


def status(pid: int, steps: int, state: str = "running") -> dict:
    return {"pid": pid, "uuid": f"u{pid}", "ppid": 0, "state": state, "daemon": "d", "intent": "x",
            "created": 1.0, "exited": None, "exit_code": None, "agent": "default", "steps": steps,
            "tokens": {"in": 0, "out": 0}}


def visible(path, sql: str, args=()) -> list:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_callbacks_run_in_order_and_only_after_their_rows_are_committed(tmp_path):
    db = tmp_path / "rnixfs.db"
    store = Store(db)
    seen: list[tuple[int, bool]] = []
    done = threading.Event()

    def dispatch(callbacks):
        # another connection, as a reader after a crash would have: every row
        # whose callback is about to run must already be there
        committed = {seq for (seq,) in visible(db, "SELECT seq FROM events WHERE pid=1")}
        for cb in callbacks:
            cb(committed)

    store.dispatch = dispatch
    store.start()
    try:
        for seq in range(1, 501):
            store.put_event(1, seq, f"line {seq}\n", "{}\n",
                            on_commit=lambda committed, seq=seq: seen.append((seq, seq in committed)))
        store.put_barrier(lambda committed: done.set())
        assert done.wait(30)
    finally:
        store.stop()
    assert [s for s, _ in seen] == list(range(1, 501))
    assert all(ok for _, ok in seen), [s for s, ok in seen if not ok][:5]


def test_a_batch_is_one_transaction_and_the_last_checkpoint_wins(tmp_path):
    db = tmp_path / "rnixfs.db"
    store = Store(db)
    store.dispatch = run_all  # callbacks run on the writer thread: one can hold it
    hold, held, done = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def block():
        held.set()
        assert hold.wait(30)

    store.start()
    try:
        store.put_barrier(block)
        assert held.wait(30)
        commits = store.commits
        # all of this queues while the writer is held: it must become one batch
        for i in range(50):
            store.put_process(status(7, i), None, on_commit=lambda i=i: order.append(f"status {i}"))
            store.put_event(7, i + 1, f"line {i}\n", "{}\n", on_commit=lambda i=i: order.append(f"line {i}"))
        store.put_process(status(8, 3, "zombie"), "the result")
        store.put_audit("d", "spawn", {"pid": 7})
        store.put_barrier(done.set)
        hold.set()
        assert done.wait(30)
        assert store.commits == commits + 1
    finally:
        store.stop()
    assert order == [x for i in range(50) for x in (f"status {i}", f"line {i}")]
    reader = StoreReader(db)
    try:
        assert reader.process(7)["steps"] == 49
        assert reader.process(8)["result"] == "the result"
        assert reader.trace(7) == [f"line {i}\n" for i in range(50)]
    finally:
        reader.close()
    assert visible(db, "SELECT action, detail FROM audit") == [("spawn", json.dumps({"pid": 7}))]


def test_stop_commits_what_is_still_queued(tmp_path):
    db = tmp_path / "rnixfs.db"
    store = Store(db)
    store.start()
    for seq in range(1, 101):
        store.put_event(3, seq, f"l{seq}\n", "{}\n")
    store.put_process(status(3, 5, "zombie"), "r")
    store.stop()
    reader = StoreReader(db)
    try:
        assert len(reader.trace(3)) == 100 and reader.process(3)["steps"] == 5
    finally:
        reader.close()
