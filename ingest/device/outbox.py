"""The outbox: a persistent FIFO queue of encoded batches waiting for the collector, in an SQLite
file on the device (docs/devices.md §6.2).

A batch is committed to the outbox before it is first POSTed and deleted only after the collector
acknowledged it (202), so neither a crash nor ``kill -9`` loses one; a batch that was acknowledged
just before a crash is sent again with the same idempotency key, and the collector answers it as a
duplicate. Each row holds one wire record (``ingest.client.codec.encode``), its idempotency key (a
uuid4's hex, unique), its report count, when it was queued, its attempts, the time of its next
attempt and its last error. Batches the collector refused for good move to the ``rejected``
table with the status, error code and reason; they are kept there, not retried.

The file is opened as the device ledger is (``ingest.device._sqlite``: mode 0600, WAL,
``synchronous = FULL``, every write one ``BEGIN IMMEDIATE`` transaction, an application id and
format version checked on open). Several processes may put batches into one outbox; delivery is
exclusive: a sender delivers only while it holds the outbox's delivery lock
(:meth:`Outbox.delivery_lock`), an ``flock`` on ``<path>.lock`` that the kernel releases when
the process dies, so two senders never POST the same row at the same time.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ingest.device._sqlite import FileKind, connect, create_private_file, immediate, initialize, sqlite_errors
from ingest.errors import ConfigError, OutboxError, OutboxFull

__all__ = ["APPLICATION_ID", "FORMAT_VERSION", "MEMORY", "DeliveryLock", "Outbox", "QueuedBatch",
           "RejectedBatch", "default_outbox_path"]

#: ``PRAGMA application_id`` of an outbox file ("LDPO").
APPLICATION_ID = 0x4C44504F
#: ``PRAGMA user_version`` of the current outbox format.
FORMAT_VERSION = 1
#: The path of an in-memory outbox (its batches are lost when the process ends).
MEMORY = ":memory:"

_CREATE = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # AUTOINCREMENT: ids only grow, so ORDER BY id is the order of put
    "CREATE TABLE batches (id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL UNIQUE, "
    "body BLOB NOT NULL, size INTEGER NOT NULL, reports INTEGER NOT NULL, created_at REAL NOT NULL, "
    "attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL, last_error TEXT)",
    "CREATE TABLE rejected (id INTEGER PRIMARY KEY, idempotency_key TEXT NOT NULL, body BLOB NOT NULL, "
    "size INTEGER NOT NULL, reports INTEGER NOT NULL, created_at REAL NOT NULL, attempts INTEGER NOT NULL, "
    "rejected_at REAL NOT NULL, status INTEGER NOT NULL, error TEXT NOT NULL, reason TEXT NOT NULL)",
)
_KIND = FileKind(what="outbox", short="outbox", name="an ldp-stream outbox", application_id=APPLICATION_ID,
                 version=FORMAT_VERSION, tables=frozenset({"meta", "batches", "rejected"}), create=_CREATE,
                 format="ldp-stream outbox", suffix="", error=OutboxError)
_COLUMNS = "id, idempotency_key, body, reports, created_at, attempts, next_attempt_at, last_error"


@dataclass(frozen=True)
class QueuedBatch:
    """One queued batch (a row of ``batches``).

    Attributes
    ----------
    id : int
        Position in the queue (ids only grow).
    key : str
        Its idempotency key: 32 lowercase hex digits (``uuid.uuid4().hex``).
    body : bytes
        The wire record POSTed.
    reports : int
        Reports in it.
    created_at : float
        Unix seconds it was queued.
    attempts : int
        POSTs that failed so far (over every process that tried).
    next_attempt_at : float
        Unix seconds before which it is not POSTed again.
    last_error : str or None
        What the last failed attempt got (``"503 overloaded: …"``, ``"ConnectionRefusedError"``).
    """

    id: int
    key: str
    body: bytes
    reports: int
    created_at: float
    attempts: int
    next_attempt_at: float
    last_error: str | None


@dataclass(frozen=True)
class RejectedBatch:
    """A batch the collector refused for good (a row of ``rejected``).

    Attributes
    ----------
    id, key, body, reports, created_at, attempts
        As in :class:`QueuedBatch`.
    rejected_at : float
        Unix seconds of the refusal.
    status : int
        HTTP status of the refusal (0 when the sender gave up after ``max_attempts``).
    error : str
        The collector's ``error`` code (``"empty_batch"``, ``"unknown_fingerprint"`` …), or the
        sender's (``"max_attempts"``).
    reason : str
        The collector's ``reason`` text.
    """

    id: int
    key: str
    body: bytes
    reports: int
    created_at: float
    attempts: int
    rejected_at: float
    status: int
    error: str
    reason: str


class Outbox:
    """A persistent FIFO queue of encoded batches, bounded, safe across processes and crashes.

    Parameters
    ----------
    path : str or Path or None
        The SQLite file, created (mode 0600) if missing; its directory must be writable (SQLite
        keeps ``-wal`` and ``-shm`` files, and the delivery lock ``<path>.lock``, beside it).
        ``None`` or ``":memory:"``: an in-memory outbox, lost when the process ends.
    max_batches : int
        Most batches held, queued plus rejected, in [1, 10_000_000].
    max_bytes : int
        Most body bytes held, queued plus rejected, in [1, 2**40].
    timeout : float
        Seconds (> 0) a call waits for another process's transaction before :class:`OutboxError`.

    Attributes
    ----------
    path : str
        The file, or ``":memory:"``.
    max_batches, max_bytes : int

    Raises
    ------
    ConfigError
        If a parameter is out of range (the message names it and the range).
    OutboxError
        If the file cannot be opened or created, is a directory, not SQLite, another application's
        database, of another format version, or corrupt. The message names the path.

    Notes
    -----
    Source: docs/devices.md §6.2. An outbox object holds one SQLite connection, used under a lock,
    so it may be shared by threads; it does not survive ``fork`` (open a new one in the child).
    Every write is one ``BEGIN IMMEDIATE`` transaction committed with ``synchronous = FULL``.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, max_batches: int = 100_000,
                 max_bytes: int = 256 * 2**20, timeout: float = 30.0) -> None:
        _check_int("max_batches", max_batches, 1, 10_000_000, "batches")
        _check_int("max_bytes", max_bytes, 1, 2**40, "bytes")
        if isinstance(timeout, bool) or not (isinstance(timeout, int | float) and math.isfinite(timeout)
                                             and timeout > 0):
            raise ConfigError(f"outbox timeout must be a finite number of seconds > 0, got {timeout!r}")
        if path is not None and not isinstance(path, str | os.PathLike):
            raise ConfigError(f"outbox path must be a file path, ':memory:' or None, got {path!r}")
        self.path = MEMORY if path is None or str(path) == MEMORY else str(path)
        if not self.path.strip():
            raise ConfigError("outbox path must be a file path, ':memory:' or None, got ''")
        self.max_batches = int(max_batches)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._delivery: DeliveryLock | None = None
        if self.memory:
            self._con = connect(MEMORY, timeout, _KIND, check_same_thread=False)
        else:
            create_private_file(self.path, _KIND)
            self._con = connect(self.path, timeout, _KIND, check_same_thread=False)
        try:
            with sqlite_errors(_KIND, self.path):
                initialize(self._con, self.path, _KIND)
        except BaseException:
            self._con.close()
            raise

    @property
    def memory(self) -> bool:
        """Whether the outbox is in memory (its batches end with the process)."""
        return self.path == MEMORY

    # ------------------------------------------------------------------ queue
    def put(self, body: bytes, reports: int, *, now: float | None = None) -> str:
        """Queue one batch; see :meth:`put_many`. Returns its idempotency key."""
        return self.put_many([(body, reports)], now=now)[0]

    def put_many(self, items: Sequence[tuple[bytes, int]], *, now: float | None = None) -> list[str]:
        """Queue batches at the tail, all or nothing, in one committed transaction.

        Parameters
        ----------
        items : sequence of (body, reports)
            ``body``: one non-empty wire record (bytes); ``reports``: its report count (>= 1).
        now : float, optional
            Unix seconds of the put (default ``time.time()``): ``created_at``, and the first
            attempt is due at once.

        Returns
        -------
        list of str
            The batches' idempotency keys (uuid4 hex), in order; committed when this returns.

        Raises
        ------
        ConfigError
            If a body is empty or not bytes, or a count is not an integer >= 1.
        OutboxFull
            If the batches would take the outbox beyond ``max_batches`` or ``max_bytes``
            (queued plus rejected); nothing was stored.
        OutboxError
            If the file cannot be written.
        """
        rows = []
        t = time.time() if now is None else float(now)
        for body, reports in items:
            if not isinstance(body, bytes | bytearray | memoryview) or not len(body):
                raise ConfigError(f"an outbox batch body must be non-empty bytes, got {type(body).__name__} "
                                  f"of length {len(body) if hasattr(body, '__len__') else '?'}")
            if isinstance(reports, bool) or not isinstance(reports, int) or reports < 1:
                raise ConfigError(f"an outbox batch's report count must be an integer >= 1, got {reports!r}")
            rows.append((uuid.uuid4().hex, bytes(body), len(body), int(reports), t, t))
        if not rows:
            return []
        size = sum(r[2] for r in rows)
        with self._lock, sqlite_errors(_KIND, self.path), immediate(self._con) as con:
            batches, nbytes = self._held(con)
            if batches + len(rows) > self.max_batches or nbytes + size > self.max_bytes:
                raise OutboxFull(
                    f"outbox {self.path!r} is full: it holds {batches} batches of {nbytes} bytes (queued "
                    f"and rejected; max_batches={self.max_batches}, max_bytes={self.max_bytes}) and "
                    f"{len(rows)} more of {size} bytes do not fit; nothing of them was queued",
                    self.path, batches=batches, bytes=nbytes, max_batches=self.max_batches,
                    max_bytes=self.max_bytes)
            con.executemany("INSERT INTO batches (idempotency_key, body, size, reports, created_at, "
                            "next_attempt_at) VALUES (?, ?, ?, ?, ?, ?)", rows)
        return [r[0] for r in rows]

    def head(self) -> QueuedBatch | None:
        """The oldest queued batch (the next to deliver, FIFO), or None if the queue is empty."""
        with self._lock, sqlite_errors(_KIND, self.path):
            row = self._con.execute(f"SELECT {_COLUMNS} FROM batches ORDER BY id LIMIT 1").fetchone()
        return None if row is None else QueuedBatch(*row)

    def batches(self) -> list[QueuedBatch]:
        """Every queued batch, oldest first."""
        with self._lock, sqlite_errors(_KIND, self.path):
            rows = self._con.execute(f"SELECT {_COLUMNS} FROM batches ORDER BY id").fetchall()
        return [QueuedBatch(*r) for r in rows]

    def delete(self, batch_id: int) -> bool:
        """Remove a delivered batch (after the collector's 202). Returns False if it was not queued."""
        with self._lock, sqlite_errors(_KIND, self.path), immediate(self._con) as con:
            return con.execute("DELETE FROM batches WHERE id = ?", (batch_id,)).rowcount == 1

    def record_failure(self, batch_id: int, error: str, next_attempt_at: float) -> int:
        """Count a failed attempt of a queued batch and set when it is due again.

        Parameters
        ----------
        batch_id : int
        error : str
            What the attempt got (kept as ``last_error``; never holds the token).
        next_attempt_at : float
            Unix seconds before which it is not POSTed again.

        Returns
        -------
        int
            Its attempts so far (0 if it is no longer queued).
        """
        with self._lock, sqlite_errors(_KIND, self.path), immediate(self._con) as con:
            con.execute("UPDATE batches SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? "
                        "WHERE id = ?", (float(next_attempt_at), str(error), batch_id))
            row = con.execute("SELECT attempts FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def reject(self, batch_id: int, status: int, error: str, reason: str, *,
               now: float | None = None, attempted: bool = True) -> bool:
        """Move a queued batch to the ``rejected`` table (kept, not retried), in one transaction.

        Parameters
        ----------
        batch_id : int
        status : int
            HTTP status of the refusal (0: the sender gave up).
        error, reason : str
            The collector's ``error`` code and ``reason`` text.
        now : float, optional
            Unix seconds of the refusal (default ``time.time()``).
        attempted : bool
            Whether the refusal answered an attempt not yet counted (by :meth:`record_failure`).

        Returns
        -------
        bool
            False if the batch was not queued (another process moved or delivered it).
        """
        t = time.time() if now is None else float(now)
        with self._lock, sqlite_errors(_KIND, self.path), immediate(self._con) as con:
            moved = con.execute(
                "INSERT INTO rejected (id, idempotency_key, body, size, reports, created_at, attempts, "
                "rejected_at, status, error, reason) SELECT id, idempotency_key, body, size, reports, "
                "created_at, attempts + ?, ?, ?, ?, ? FROM batches WHERE id = ?",
                (int(attempted), t, int(status), str(error), str(reason), batch_id)).rowcount
            con.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
        return moved == 1

    def rejected(self) -> list[RejectedBatch]:
        """Every rejected batch, oldest first."""
        with self._lock, sqlite_errors(_KIND, self.path):
            rows = self._con.execute(
                "SELECT id, idempotency_key, body, reports, created_at, attempts, rejected_at, status, "
                "error, reason FROM rejected ORDER BY id").fetchall()
        return [RejectedBatch(*r) for r in rows]

    def drop_rejected(self) -> int:
        """Delete every rejected batch (after inspecting them); returns how many."""
        with self._lock, sqlite_errors(_KIND, self.path), immediate(self._con) as con:
            return con.execute("DELETE FROM rejected").rowcount

    def counts(self) -> dict[str, int]:
        """What the outbox holds.

        Returns
        -------
        dict
            ``queued``, ``queued_reports``, ``queued_bytes``, ``rejected``, ``rejected_reports``,
            ``rejected_bytes``.
        """
        with self._lock, sqlite_errors(_KIND, self.path):
            q = self._con.execute("SELECT COUNT(*), TOTAL(reports), TOTAL(size) FROM batches").fetchone()
            r = self._con.execute("SELECT COUNT(*), TOTAL(reports), TOTAL(size) FROM rejected").fetchone()
        return {"queued": int(q[0]), "queued_reports": int(q[1]), "queued_bytes": int(q[2]),
                "rejected": int(r[0]), "rejected_reports": int(r[1]), "rejected_bytes": int(r[2])}

    # ------------------------------------------------------------------ delivery lock / close
    def delivery_lock(self) -> DeliveryLock:
        """The lock a sender holds while it delivers from this outbox (one per outbox object)."""
        if self._delivery is None:
            self._delivery = DeliveryLock(None if self.memory else self.path + ".lock")
        return self._delivery

    def close(self) -> None:
        """Release the delivery lock and close the connection. Idempotent."""
        if self._delivery is not None:
            self._delivery.close()
        with self._lock:
            self._con.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Outbox(path={self.path!r}, max_batches={self.max_batches}, max_bytes={self.max_bytes})"

    @staticmethod
    def _held(con: sqlite3.Connection) -> tuple[int, int]:
        n, size = con.execute("SELECT (SELECT COUNT(*) FROM batches) + (SELECT COUNT(*) FROM rejected), "
                              "(SELECT TOTAL(size) FROM batches) + (SELECT TOTAL(size) FROM rejected)"
                              ).fetchone()
        return int(n), int(size)


class DeliveryLock:
    """Exclusive right to deliver from one outbox: ``flock(LOCK_EX)`` on ``<outbox>.lock`` (a
    thread lock for an in-memory outbox).

    The kernel releases the lock when its process ends, ``kill -9`` included, so a dead sender
    never blocks a later one; two outbox objects on one file, in one process or in two, exclude
    each other (the lock belongs to the open file, not to the process).

    Parameters
    ----------
    path : str or None
        The lock file (created, mode 0600, never removed); None for a thread lock.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._thread_lock = threading.Lock()
        self.held = False

    def acquire(self) -> bool:
        """Take the lock if it is free (never waits); True if this object holds it now."""
        if self.held:
            return True
        if self.path is None:
            self.held = self._thread_lock.acquire(blocking=False)
            return self.held
        import fcntl  # POSIX; the outbox's delivery lock needs it

        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise OutboxError(f"outbox lock file {self.path!r} cannot be opened: {exc.strerror}",
                                  self.path) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def release(self) -> None:
        """Let another sender deliver. Idempotent."""
        if not self.held:
            return
        self.held = False
        if self.path is None:
            self._thread_lock.release()
        else:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Release the lock and close the lock file."""
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _check_int(name: str, value, low: int, high: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}] {unit}, got {value!r}")


def default_outbox_path(ledger_path: str | os.PathLike) -> str:
    """The outbox file beside a device ledger: ``<ledger stem>.outbox.db`` in its directory."""
    p = Path(ledger_path)
    return str(p.with_name(p.stem + ".outbox.db"))
