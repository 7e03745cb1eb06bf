"""Small SQLite files of the device side: the device ledger (``ingest.device.ledger``) and the outbox
(``ingest.device.outbox``), opened, checked and written the same way (docs/devices.md §1.3, §6.2).

* A new file is created with mode 0600 (SQLite gives its ``-wal``/``-shm`` files the same mode).
* WAL journal, ``synchronous = FULL`` (a committed transaction survives a crash of the process or
  of the machine) and a busy timeout (concurrent processes wait for each other).
* The file names its application (``PRAGMA application_id``) and format (``PRAGMA user_version``):
  an SQLite file of another application, another format version, a file that is not SQLite or
  fails ``quick_check`` is refused with one typed error naming the path.
* Every ``sqlite3.Error`` becomes that typed error (:func:`sqlite_errors`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["FileKind", "connect", "create_private_file", "immediate", "initialize", "iso_utc", "rollback",
           "sqlite_error", "sqlite_errors"]


def iso_utc(seconds: float) -> str:
    """Unix seconds → ISO-8601 UTC text with a ``Z`` (``"2026-12-02T00:00:00Z"``)."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class FileKind:
    """What one kind of file is, for its checks and its error messages.

    Attributes
    ----------
    what : str
        Its name at the start of a message (``"device ledger"``).
    short : str
        Its one-word name (``"ledger"``: "is a directory, not a ledger file").
    name : str
        Its full name (``"an ldp-stream device ledger"``).
    application_id, version : int
        ``PRAGMA application_id`` and ``PRAGMA user_version`` of the current format.
    tables : frozenset of str
        Tables a file of this kind must have.
    create : tuple of str
        Statements that create them in a new file.
    format : str
        The ``meta`` table's ``format`` value.
    suffix : str
        End of every message (``"; nothing was sent"``).
    error : callable (message, path) -> Exception
        The typed error raised.
    """

    what: str
    short: str
    name: str
    application_id: int
    version: int
    tables: frozenset
    create: tuple
    format: str
    suffix: str
    error: Callable[[str, str], Exception]


def create_private_file(path: str, kind: FileKind) -> None:
    """Create ``path`` (mode 0600) if it does not exist.

    Raises
    ------
    kind.error
        If ``path`` is a directory or cannot be opened or created.
    """
    if Path(path).is_dir():
        raise kind.error(f"{kind.what} {path!r} is a directory, not {_a(kind.short)} file{kind.suffix}", path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as exc:
        raise kind.error(f"{kind.what} {path!r} cannot be opened: {exc.strerror}{kind.suffix}",
                         path) from None


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def connect(path: str, timeout: float, kind: FileKind, *,
            check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), busy timeout ``timeout``
    seconds, ``synchronous = FULL``.

    Raises
    ------
    kind.error
        If SQLite cannot open the file.
    """
    try:
        con = sqlite3.connect(path, timeout=timeout, isolation_level=None,
                              check_same_thread=check_same_thread)
        con.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        con.execute("PRAGMA synchronous = FULL")
    except sqlite3.Error as exc:
        raise sqlite_error(kind, path, exc) from None
    return con


@contextmanager
def sqlite_errors(kind: FileKind, path: str) -> Iterator[None]:
    """``with`` block in which every ``sqlite3.Error`` becomes ``kind.error`` naming ``path``."""
    try:
        yield
    except sqlite3.Error as exc:
        raise sqlite_error(kind, path, exc) from None


@contextmanager
def immediate(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction (the write lock taken at once): committed when the
    block ends, rolled back if it raises."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def rollback(con: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not ended it already."""
    if con.in_transaction:
        con.execute("ROLLBACK")


def initialize(con: sqlite3.Connection, path: str, kind: FileKind) -> None:
    """Create the tables of a new (empty) file, or check an existing one; then ``quick_check``.

    Raises
    ------
    kind.error
        If the file is another application's database, has another format version, or is corrupt.
        (Call inside :func:`sqlite_errors`: a file that is not SQLite raises ``sqlite3.Error``.)
    """
    con.execute("PRAGMA journal_mode = WAL")
    with immediate(con):
        app = con.execute("PRAGMA application_id").fetchone()[0]
        version = con.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if app == 0 and version == 0 and not tables:  # a new (empty) file
            for statement in kind.create:
                con.execute(statement)
            con.execute("INSERT INTO meta VALUES ('format', ?), ('created_at', ?)",
                        (kind.format, iso_utc(time.time())))
            con.execute(f"PRAGMA application_id = {kind.application_id}")
            con.execute(f"PRAGMA user_version = {kind.version}")
        elif app != kind.application_id or not kind.tables <= tables:
            raise kind.error(f"{kind.what} {path!r} is an SQLite database of something else, not "
                             f"{kind.name}{kind.suffix}", path)
        elif version != kind.version:
            raise kind.error(f"{kind.what} {path!r} has format version {version}; this version of "
                             f"ldp-stream reads {kind.version}{kind.suffix}", path)
    check = con.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise kind.error(f"{kind.what} {path!r} is corrupt (SQLite quick_check: {check}){kind.suffix}", path)


def sqlite_error(kind: FileKind, path: str, exc: sqlite3.Error) -> Exception:
    """``kind.error`` for an ``sqlite3.Error``: not SQLite/corrupt, locked too long, or other."""
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        what = f"is not {kind.name} (not an SQLite database, or corrupt: {text})"
    elif isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        what = f"stayed locked by another process beyond the busy timeout ({text})"
    else:
        what = f"cannot be used: {text}"
    return kind.error(f"{kind.what} {path!r} {what}{kind.suffix}", path)
