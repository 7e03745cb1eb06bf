"""The device ledger: what one device has sent per privacy period, kept in an SQLite file on the
device (docs/devices.md §1).

A schema with ``[privacy] unit = "device"`` promises that one device sends at most
``reports_per_period`` fresh reports per ``period`` (periods aligned to the Unix epoch, UTC). The
:class:`DeviceLedger` keeps that promise across processes and crashes: every spend is one
``BEGIN IMMEDIATE`` transaction — count the period's spends, check the budget, insert, commit —
and the privatizer hands a report out only after the commit. The file is in WAL mode with
``synchronous = FULL`` (a committed spend survives a crash of the process or of the machine) and a
busy timeout (concurrent processes wait for each other instead of failing).

A fresh report costs one unit. With memoized fields (docs/devices.md §3) a report whose randomized
parts are all memoized and were all sent before in the same period costs nothing; the ledger
stores, for the current period only, the keyed tags (``ingest.device.memo.memo_tag``) of the memo keys
sent, never a value.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ingest.client.event_time import format_duration
from ingest.device._sqlite import FileKind, connect, create_private_file, immediate, initialize, sqlite_errors
from ingest.device._sqlite import iso_utc as iso_utc  # re-exported
from ingest.errors import BudgetExceeded, ConfigError, LedgerError

logger = logging.getLogger(__name__)

__all__ = ["APPLICATION_ID", "FORMAT_VERSION", "DeviceLedger", "iso_utc"]

#: ``PRAGMA application_id`` of a ledger file ("LDPD"): a file without it is not a ledger.
APPLICATION_ID = 0x4C445044
#: ``PRAGMA user_version`` of the current ledger format.
FORMAT_VERSION = 1
#: Spends older than this (seconds before the current period) are pruned: twice the longest period.
KEEP_S = 2 * 366 * 86_400

_TABLES = {"meta", "spends", "memo_tags"}
_CREATE = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # one row per unit spent: a fresh report; ``at`` is the device's wall-clock time (Unix s)
    "CREATE TABLE spends (id INTEGER PRIMARY KEY, at REAL NOT NULL, fingerprint BLOB NOT NULL)",
    "CREATE INDEX spends_at ON spends (at)",
    # the keyed tags of the memo keys sent in the current period (older ones are pruned)
    "CREATE TABLE memo_tags (fingerprint BLOB NOT NULL, tag BLOB NOT NULL, at REAL NOT NULL)",
    "CREATE INDEX memo_tags_key ON memo_tags (fingerprint, tag, at)",
)


_KIND = FileKind(what="device ledger", short="ledger", name="an ldp-stream device ledger",
                 application_id=APPLICATION_ID, version=FORMAT_VERSION, tables=frozenset(_TABLES),
                 create=_CREATE, format="ldp-stream device ledger", suffix="; nothing was sent",
                 error=LedgerError)


class DeviceLedger:
    """The persistent count of one device's fresh reports per period (docs/devices.md §1).

    Parameters
    ----------
    path : str or Path
        The SQLite file; created (mode 0600) if it does not exist. SQLite keeps ``-wal`` and
        ``-shm`` files next to it, so its directory must be writable.
    schema : TelemetrySchema
        A schema with ``[privacy] unit = "device"``: its ``reports_per_period`` is the budget,
        its ``period`` the length of a period, and its fingerprint labels the memo tags.
    timeout : float
        Seconds a call waits for another process's transaction (the busy timeout) before
        :class:`LedgerError`.

    Attributes
    ----------
    path : str
    budget : int
        ``reports_per_period``.
    period_s : int
        The period in seconds; period k is ``[k·period_s, (k+1)·period_s)`` in Unix seconds.

    Raises
    ------
    ConfigError
        If the schema's privacy unit is not ``"device"`` (there is no budget to keep).
    LedgerError
        If the file cannot be opened or created, is not an SQLite database, is another
        application's database (``PRAGMA application_id``), or fails SQLite's ``quick_check``.
        The message names the path.

    Notes
    -----
    Every method opens its own connection and closes it before returning, so a ledger object
    may be used from any thread and survives ``fork``; all its state is in the file. One ledger
    file counts every spend recorded in it, whatever the schema: a device that reports two
    schemas under separate budgets gives each its own file. The ledger trusts the device's
    clock.
    """

    def __init__(self, path: str | Path, schema, *, timeout: float = 30.0) -> None:
        unit = schema.privacy_unit
        if unit.unit != "device":
            raise ConfigError(f"device ledger {str(path)!r}: schema {schema.name!r} has [privacy] unit = "
                              f"{unit.unit!r}, which keeps no budget; a ledger needs unit = 'device'")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.path = str(path)
        self.budget = int(unit.reports_per_period)
        self.period_s = int(unit.period_s)
        self._period = format_duration(self.period_s)
        self._fingerprint = bytes(schema.fingerprint)
        self._timeout = float(timeout)
        self._open()

    # ------------------------------------------------------------------ public API
    def period_bounds(self, now: float | None = None) -> tuple[int, int]:
        """The period that holds ``now``.

        Parameters
        ----------
        now : float, optional
            Unix seconds; ``time.time()`` when omitted.

        Returns
        -------
        (start, end) : tuple of int
            Unix seconds, ``start = ⌊now/period_s⌋·period_s``, ``end = start + period_s``.
        """
        t = time.time() if now is None else float(now)
        start = math.floor(t / self.period_s) * self.period_s
        return start, start + self.period_s

    def spent(self, now: float | None = None) -> int:
        """Units spent in the period of ``now`` (Unix seconds; default: now).

        Raises
        ------
        LedgerError
            If the file cannot be read.
        """
        start, end = self.period_bounds(now)
        with self._connection() as con:
            return self._count(con, start, end)

    def remaining(self, now: float | None = None) -> int:
        """``budget − spent(now)``, never below 0."""
        return max(0, self.budget - self.spent(now))

    def spend(self, now: float | None = None, *,
              reports: Sequence[tuple[bool, Iterable[bytes]]] | None = None) -> int:
        """Spend the budget of one call's reports, all or nothing, and commit it.

        Parameters
        ----------
        now : float, optional
            Unix seconds of the spend (default ``time.time()``); it picks the period.
        reports : sequence of (fresh, tags), optional
            One entry per report, in order: ``fresh`` is True if the report has a part drawn
            afresh (not memoized); ``tags`` are the memo tags of its memoized parts. A report
            costs one unit if it is fresh or has a tag not yet sent in this period (counting the
            earlier reports of the same call), else nothing. ``None``: one fresh report.

        Returns
        -------
        int
            Units spent (0 … len(reports)); committed to the file when this returns.

        Raises
        ------
        BudgetExceeded
            If ``spent + cost > budget``: nothing is recorded. Its attributes name the period's
            start (ISO-8601 UTC), the units spent, the budget and what the call needed.
        LedgerError
            If the file cannot be written (the message names the path).
        """
        items = [(True, ())] if reports is None else reports
        t = time.time() if now is None else float(now)
        start, end = self.period_bounds(t)
        with self._connection() as con:
            with immediate(con):
                count = self._count(con, start, end)
                cost, new_tags = self._cost(con, items, start, end)
                if cost and count + cost > self.budget:
                    raise BudgetExceeded(
                        f"device ledger {self.path!r}: the budget of {self.budget} fresh reports per "
                        f"{self._period} is spent in the period starting {iso_utc(start)} ({count} "
                        f"spent, {cost} more needed); nothing was sent",
                        period_start=iso_utc(start), count=count, budget=self.budget, needed=cost)
                if cost:
                    con.executemany("INSERT INTO spends (at, fingerprint) VALUES (?, ?)",
                                    [(t, self._fingerprint)] * cost)
                if new_tags:
                    con.executemany("INSERT INTO memo_tags (fingerprint, tag, at) VALUES (?, ?, ?)",
                                    [(self._fingerprint, tag, t) for tag in new_tags])
                con.execute("DELETE FROM memo_tags WHERE at < ? OR at >= ?", (start, end))
                con.execute("DELETE FROM spends WHERE at < ?", (start - KEEP_S,))
        return cost

    def __repr__(self) -> str:
        return f"DeviceLedger(path={self.path!r}, budget={self.budget}, period={self._period!r})"

    # ------------------------------------------------------------------ internals
    def _cost(self, con: sqlite3.Connection, items, start: int, end: int) -> tuple[int, list[bytes]]:
        seen: dict[bytes, bool] = {}
        cost = 0
        for fresh, tags in items:
            new = False
            for tag in tags:
                tag = bytes(tag)
                if tag not in seen:
                    row = con.execute("SELECT 1 FROM memo_tags WHERE fingerprint = ? AND tag = ? AND at >= ? "
                                      "AND at < ? LIMIT 1", (self._fingerprint, tag, start, end)).fetchone()
                    seen[tag] = row is not None
                    new = new or row is None
            cost += bool(fresh or new)
        return cost, [tag for tag, old in seen.items() if not old]

    @staticmethod
    def _count(con: sqlite3.Connection, start: int, end: int) -> int:
        return int(con.execute("SELECT COUNT(*) FROM spends WHERE at >= ? AND at < ?",
                               (start, end)).fetchone()[0])

    def _connection(self):
        return _sqlite_connection(self.path, self._timeout)

    def _open(self) -> None:
        create_private_file(self.path, _KIND)
        with self._connection() as con:
            initialize(con, self.path, _KIND)


@contextmanager
def _sqlite_connection(path: str, timeout: float) -> Iterator[sqlite3.Connection]:
    """``with`` block of one SQLite connection to a ledger: every sqlite3 error inside it becomes a
    :class:`LedgerError` naming the file; the connection is closed on the way out."""
    con = connect(path, timeout, _KIND)
    try:
        with sqlite_errors(_KIND, path):
            yield con
    finally:
        con.close()
