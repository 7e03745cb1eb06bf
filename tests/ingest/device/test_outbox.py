"""The outbox (ingest.device.outbox, docs/devices.md §6.2): FIFO, committed puts, bounds, the rejected
table, the delivery lock across processes, SIGKILL mid-write, corrupt and foreign files."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ingest.device.ledger import DeviceLedger
from ingest.device.outbox import MEMORY, Outbox, default_outbox_path
from ingest.errors import ConfigError, OutboxError, OutboxFull

ROOT = Path(__file__).resolve().parents[3]


def test_batches_come_out_in_the_order_they_were_put_with_unique_keys(tmp_path):
    box = Outbox(tmp_path / "o.db")
    keys = [box.put(bytes([i]) * (i + 1), i + 1) for i in range(5)] + box.put_many([(b"x", 1), (b"yy", 2)])
    assert len(set(keys)) == 7 and all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    rows = box.batches()
    assert [r.key for r in rows] == keys and [r.reports for r in rows] == [1, 2, 3, 4, 5, 1, 2]
    assert rows[2].body == b"\x02\x02\x02" and rows[2].attempts == 0 and rows[2].last_error is None
    assert box.head() == rows[0]
    assert box.delete(rows[0].id) and not box.delete(rows[0].id)
    assert box.head().key == keys[1]
    assert box.counts() == {"queued": 6, "queued_reports": 17, "queued_bytes": 2 + 3 + 4 + 5 + 1 + 2,
                            "rejected": 0, "rejected_reports": 0, "rejected_bytes": 0}
    # ids only grow: a batch put after deleting the newest one still comes last
    assert box.delete(rows[-1].id)
    new = box.put(b"z", 1)
    assert [r.key for r in box.batches()] == [*keys[1:6], new]


def test_a_put_is_committed_and_read_back_by_another_process(tmp_path):
    path = tmp_path / "o.db"
    box = Outbox(path)
    key = box.put(b"abc", 3, now=1000.0)
    other = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from ingest.device.outbox import Outbox
        b = Outbox({str(path)!r}).head()
        print(b.key, b.body.decode(), b.reports, b.created_at, b.next_attempt_at)
    """)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == [key, "abc", "3", "1000.0", "1000.0"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_failures_are_counted_and_kept_across_a_reopen(tmp_path):
    box = Outbox(tmp_path / "o.db")
    key = box.put(b"abc", 3)
    bid = box.head().id
    assert box.record_failure(bid, "503 overloaded: busy", 2000.0) == 1
    assert box.record_failure(bid, "ConnectionRefusedError", 3000.0) == 2
    box.close()
    again = Outbox(tmp_path / "o.db").head()
    assert (again.key, again.attempts, again.next_attempt_at, again.last_error) == (
        key, 2, 3000.0, "ConnectionRefusedError")
    assert Outbox(tmp_path / "o.db").record_failure(9999, "x", 0.0) == 0


def test_full_refuses_the_whole_call_and_loses_nothing(tmp_path):
    box = Outbox(tmp_path / "o.db", max_batches=3, max_bytes=10)
    keys = box.put_many([(b"aaaa", 1), (b"bbbb", 1)])
    with pytest.raises(OutboxFull, match=r"holds 2 batches of 8 bytes .* 1 more of 4 bytes do not fit; "
                                         r"nothing of them was queued") as exc:
        box.put(b"cccc", 1)  # 12 bytes > max_bytes
    e = exc.value
    assert (e.batches, e.bytes, e.max_batches, e.max_bytes, e.path) == (2, 8, 3, 10, str(tmp_path / "o.db"))
    with pytest.raises(OutboxFull):
        box.put_many([(b"c", 1), (b"d", 1)])  # 4 batches > max_batches: neither is stored
    assert [b.key for b in box.batches()] == keys
    box.put(b"c", 1)
    with pytest.raises(OutboxFull):
        box.put(b"d", 1)
    # a rejected batch still takes room (it is kept) until it is dropped
    box.reject(box.head().id, 422, "empty_batch", "no reports")
    with pytest.raises(OutboxFull):
        box.put(b"d", 1)
    assert box.drop_rejected() == 1
    box.put(b"d", 1)
    assert box.counts()["queued"] == 3


def test_a_rejected_batch_is_kept_with_its_status_code_and_reason(tmp_path):
    box = Outbox(tmp_path / "o.db")
    k1, k2 = box.put_many([(b"one", 1), (b"two", 2)])
    first = box.head()
    box.record_failure(first.id, "503 overloaded", 0.0)
    assert box.reject(first.id, 422, "unknown_fingerprint", "the schema is not served here", now=50.0)
    assert not box.reject(first.id, 422, "x", "y")  # no longer queued
    (r,) = box.rejected()
    assert (r.key, r.body, r.reports, r.status, r.error, r.reason, r.attempts, r.rejected_at) == (
        k1, b"one", 1, 422, "unknown_fingerprint", "the schema is not served here", 2, 50.0)
    assert box.head().key == k2
    c = box.counts()
    assert (c["queued"], c["rejected"], c["rejected_reports"], c["rejected_bytes"]) == (1, 1, 1, 3)
    box.reject(box.head().id, 0, "max_attempts", "gave up", attempted=False)
    assert [r.attempts for r in box.rejected()] == [2, 0]


def test_an_in_memory_outbox(tmp_path):
    box = Outbox(None)
    assert box.path == MEMORY and box.memory and Outbox(":memory:").memory
    key = box.put(b"abc", 1)
    assert box.head().key == key
    lock = box.delivery_lock()
    assert lock.acquire() and lock.acquire()  # held: acquiring again is a no-op
    lock.release()
    assert lock.acquire()
    box.close()
    assert not list(tmp_path.iterdir())


def test_the_delivery_lock_excludes_a_second_outbox_object_and_a_second_process(tmp_path):
    path = tmp_path / "o.db"
    a, b = Outbox(path), Outbox(path)
    la, lb = a.delivery_lock(), b.delivery_lock()
    assert la.acquire() and not lb.acquire()
    la.release()
    assert lb.acquire() and not la.acquire()
    lb.release()
    # a process that holds the lock and is killed with SIGKILL releases it (the kernel does)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from ingest.device.outbox import Outbox
        assert Outbox({str(path)!r}).delivery_lock().acquire()
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "held"
        assert not la.acquire()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 5
        while not la.acquire():
            assert time.monotonic() < deadline, "the lock of a killed process was not released"
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert stat.S_IMODE(os.stat(str(path) + ".lock").st_mode) == 0o600


def test_sigkill_mid_write_loses_no_committed_batch(tmp_path):
    """A process puts batches as fast as it can and prints each key once put returned; after
    SIGKILL every printed key is in the file, in order, and the file passes quick_check."""
    path = tmp_path / "o.db"
    Outbox(path).close()
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from ingest.device.outbox import Outbox
        box = Outbox({str(path)!r})
        i = 0
        while True:
            print(box.put(bytes(200) + i.to_bytes(4, "big"), 1), flush=True)
            i += 1
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    printed = []
    try:
        while len(printed) < 40:
            printed.append(child.stdout.readline().strip())
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        printed += [line.strip() for line in child.stdout.read().splitlines() if len(line.strip()) == 32]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    box = Outbox(path)  # opens: quick_check passed
    keys = [b.key for b in box.batches()]
    assert keys[:len(printed)] == printed
    assert len(keys) - len(printed) <= 1  # at most the put in progress, committed but not printed
    bodies = [b.body for b in box.batches()]
    assert [int.from_bytes(x[-4:], "big") for x in bodies] == list(range(len(keys)))


@pytest.mark.parametrize(("content", "what"), [
    (b"\x00garbage\xff" * 500, r"is not an ldp-stream outbox \(not an SQLite database, or corrupt"),
    (b"SQLite format 3\x00" + bytes(range(256)) * 20, r"(not an ldp-stream outbox|is corrupt)"),
])
def test_a_corrupt_outbox_is_one_error_naming_the_path(tmp_path, content, what):
    path = tmp_path / "o.db"
    path.write_bytes(content)
    with pytest.raises(OutboxError, match=what) as exc:
        Outbox(path)
    assert exc.value.path == str(path) and str(path) in str(exc.value)
    assert path.read_bytes() == content


def test_a_foreign_database_a_ledger_a_directory_or_a_newer_format_is_refused(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    with pytest.raises(OutboxError, match=r"SQLite database of something else, not an ldp-stream outbox"):
        Outbox(other)
    from ingest.client.schema import TelemetrySchema

    schema = TelemetrySchema.from_dict({
        "name": "dev", "numeric": {"zero_prob": 0.2, "scale": 0.5, "fields": [{"name": "a", "low": 0.0,
                                                                              "high": 1.0}]},
        "privacy": {"unit": "device", "period": "1d", "reports_per_period": 5}})
    DeviceLedger(tmp_path / "ledger.db", schema)
    with pytest.raises(OutboxError, match=r"something else"):
        Outbox(tmp_path / "ledger.db")
    with pytest.raises(OutboxError, match=r"is a directory, not an outbox file"):
        Outbox(tmp_path)
    with pytest.raises(OutboxError, match=r"cannot be opened: No such file or directory"):
        Outbox(tmp_path / "no" / "o.db")
    Outbox(tmp_path / "v.db").close()
    with sqlite3.connect(tmp_path / "v.db") as con:
        con.execute("PRAGMA user_version = 7")
    con.close()
    with pytest.raises(OutboxError, match=r"has format version 7; this version of ldp-stream reads 1"):
        Outbox(tmp_path / "v.db")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_batches": 0}, r"max_batches must be an integer in \[1, 10000000\] batches, got 0"),
    ({"max_batches": True}, r"max_batches must be an integer"),
    ({"max_bytes": 0}, r"max_bytes must be an integer in \[1, 1099511627776\] bytes, got 0"),
    ({"max_bytes": 1.5}, r"max_bytes must be an integer"),
    ({"timeout": 0}, r"outbox timeout must be a finite number of seconds > 0, got 0"),
    ({"timeout": float("nan")}, r"outbox timeout must be"),
    ({"path": ""}, r"outbox path must be a file path, ':memory:' or None, got ''"),
    ({"path": 3}, r"outbox path must be a file path"),
])
def test_bad_parameters_name_themselves(kwargs, match):
    kwargs = {"path": None, **kwargs}
    with pytest.raises(ConfigError, match=match):
        Outbox(kwargs.pop("path"), **kwargs)


@pytest.mark.parametrize(("item", "match"), [
    ((b"", 1), r"non-empty bytes"), (("text", 1), r"non-empty bytes"),
    ((b"x", 0), r"report count must be an integer >= 1, got 0"), ((b"x", True), r"report count")])
def test_a_bad_batch_is_refused_and_nothing_of_the_call_is_stored(item, match):
    box = Outbox()
    with pytest.raises(ConfigError, match=match):
        box.put_many([(b"ok", 1), item])
    assert box.counts()["queued"] == 0


def test_the_default_outbox_sits_beside_the_ledger():
    assert default_outbox_path("/var/lib/app/ldp-ledger.db") == "/var/lib/app/ldp-ledger.outbox.db"
    assert default_outbox_path("ledger") == "ledger.outbox.db"
