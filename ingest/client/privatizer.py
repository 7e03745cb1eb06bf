"""Client-side privatizer: raw events → privatized :class:`~ingest.client.batch.ReportBatch`.

Stated in docs/schema.md §3, docs/mechanisms.md §1 and docs/frequency.md §2, §3, §6.

* Numeric fields: clipped into the schema's box, then ONE ZIL draw over all numeric fields per
  report (``mechanisms.zil.ZILMechanism``; a common zero indicator and a common W).
* Categorical fields: value → code (``fallback`` for unknown strings if declared) → uRR codes or
  uRAP :class:`~mechanisms.uldp.SparseBits` (``mechanisms.uldp``). PUM fields first map the
  user's personally sensitive values to a bot symbol.
* Event time (schemas with ``[event_time]``): the time column → Unix seconds
  (``ingest.client.event_time.to_unix_seconds_masked``), rounded down to the schema's resolution; it is
  not privatized (docs/schema.md §1, §4).
* With a :class:`~ingest.device.runtime.Device` (docs/devices.md): memoized fields resend the device's
  memoized report, and every call spends the device ledger's budget before it returns.

Both :meth:`Privatizer.privatize` (one event) and :meth:`Privatizer.privatize_batch` go through
the same vectorised code path, so validation and clipping are identical.
"""

from __future__ import annotations

import itertools
import logging
import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ingest.client.batch import ReportBatch
from ingest.client.event_time import floor_to, invalid_time_error, to_unix_seconds_masked
from ingest.client.schema import CategoricalField, TelemetrySchema
from ingest.device.runtime import Device, open_device
from ingest.errors import SchemaError
from mechanisms.rng import RngLike, as_generator

logger = logging.getLogger(__name__)

__all__ = ["INVALID_REASONS", "Privatizer", "PrivatizerStats"]

#: Reasons a row can be invalid (labels of :attr:`PrivatizerStats.skipped`).
INVALID_REASONS = ("missing", "wrong_type", "non_finite", "unknown_category", "invalid_time")

_BOT_SUFFIX = "__bot"


@dataclass
class PrivatizerStats:
    """Running counters of a :class:`Privatizer` (plain data; safe to export as metrics).

    Attributes
    ----------
    reports : int
        Reports produced.
    rows_in : int
        Rows (events) received.
    clipped_rows : int
        Reports with at least one numeric value clipped into its bounds.
    clipped : Counter[str]
        Clipped values per numeric field.
    skipped : Counter[str]
        Rows dropped under ``on_invalid="skip"``, by reason (first failing field in schema order,
        the event-time column last); reasons are :data:`INVALID_REASONS` (``invalid_time``: a
        missing or unreadable event time, or one outside 1970 … 2106).
    skipped_by_field : Counter[str]
        The same rows by the first failing field.
    fallback : Counter[str]
        Unknown categories mapped to the field's ``fallback``, per field.
    """

    reports: int = 0
    rows_in: int = 0
    clipped_rows: int = 0
    clipped: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    skipped_by_field: Counter = field(default_factory=Counter)
    fallback: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data copy."""
        return {
            "reports": self.reports,
            "rows_in": self.rows_in,
            "clipped_rows": self.clipped_rows,
            "clipped": dict(self.clipped),
            "skipped": dict(self.skipped),
            "skipped_by_field": dict(self.skipped_by_field),
            "fallback": dict(self.fallback),
        }


class Privatizer:
    """Privatize events of one :class:`TelemetrySchema` on the client.

    Parameters
    ----------
    schema : TelemetrySchema
    rng : Generator, int, "secure" or None
        Noise source; ``None`` (the default) seeds from OS entropy — or, when the schema says
        ``[client] rng = "secure"``, uses ChaCha20 keyed from the OS; ``"secure"`` always does
        (``mechanisms.rng.as_generator``). Ints are for tests and benchmarks.
    personal_sensitive : mapping str → (iterable of str | mapping str → int), optional
        For PUM fields (``personalized`` set in the schema): this user's personally sensitive
        values. An iterable maps every listed value to bot ⊥₁ (code ``len(categories)``); a
        mapping ``value → bot index`` (0-based, < κ) picks the bot. Batches may instead carry a
        per-row int column ``"<field>__bot"`` (−1 = not personal, else the bot index).
    device : ingest.device.runtime.Device, optional
        Report as one device (docs/devices.md): required by schemas with ``[privacy] unit =
        "device"`` (its ledger keeps the budget) or a memoized field (its secret keys the memoized
        reports). With a device, every call is one all-or-nothing spend in the ledger, committed
        before the reports are returned; without one, the vectorised path runs unchanged.

    Raises
    ------
    SchemaError
        If ``personal_sensitive`` names a field that is not a PUM field or a value/bot that does
        not exist.
    ConfigError
        If the schema needs a device (or its ledger or secret) and none is given, or a ledger is
        given for a schema of ``unit = "event"``.
    LedgerError, DeviceSecretError
        If the device's ledger or secret file cannot be used (the message names the file).

    Notes
    -----
    ``privatize`` returns a :class:`ReportBatch` of one report (a single-report record is a batch
    of one, docs/schema.md §3). Source: docs/mechanisms.md §1 (ZIL), docs/frequency.md §2, §3, §6
    (uRR, uRAP, PUM).
    """

    def __init__(self, schema: TelemetrySchema, rng: RngLike = None, *,
                 personal_sensitive: Mapping[str, Iterable[str] | Mapping[str, int]] | None = None,
                 device: Device | None = None) -> None:
        if not isinstance(schema, TelemetrySchema):
            raise SchemaError(f"schema must be a TelemetrySchema, got {type(schema).__name__}")
        self.schema = schema
        client = getattr(schema, "client", None)
        if rng is None and client is not None and client.rng == "secure":
            rng = "secure"  # the schema's [client] rng setting (docs/privacy.md §6.3)
        self._rng = as_generator(rng)
        self._zil = schema.zil_mechanism()
        self._cat_mechs = {c.name: schema.categorical_mechanism(c.name) for c in schema.categorical}
        self._luts = {c.name: {v: i for i, v in enumerate(c.categories)} for c in schema.categorical}
        self._personal = self._check_personal(personal_sensitive or {})
        self._device = open_device(schema, device, self._zil, self._cat_mechs)  # docs/devices.md
        self._time_field = schema.event_time.field if schema.event_time is not None else None
        #: the columns read from every event: the schema's fields, then the event-time column
        self._columns = (*schema.numeric_names, *schema.categorical_names,
                         *((self._time_field,) if self._time_field is not None else ()))
        self.stats = PrivatizerStats()

    # ------------------------------------------------------------------ public API
    def privatize(self, event: Mapping[str, Any]) -> ReportBatch:
        """Privatize one event into a batch of one report.

        Parameters
        ----------
        event : mapping field name → value
            Numeric fields: real numbers (int/float, not bool); categorical: strings; the
            event-time column (schemas with ``[event_time]``): an ISO-8601 string, a
            ``datetime``/``datetime64`` or Unix seconds. Extra keys are ignored.

        Returns
        -------
        ReportBatch
            ``n == 1``; ``event_time`` set for schemas with ``[event_time]``.

        Raises
        ------
        SchemaError
            If a value is missing, NaN/inf, of the wrong type, or an unknown category (without
            ``fallback``); the message names the field.
        EventTimeError
            (a SchemaError) If the event time is missing or not a time in 1970 … 2106; the
            message names the time column and row 0.
        """
        if not isinstance(event, Mapping):
            raise SchemaError(f"event must be a mapping of field name to value, got {type(event).__name__}")
        cols: dict[str, Any] = {}
        for name in self._columns:
            cell = np.empty(1, dtype=object)
            cell[0] = event.get(name)
            cols[name] = cell
            if name + _BOT_SUFFIX in event:
                cols[name + _BOT_SUFFIX] = np.array([event[name + _BOT_SUFFIX]])
        return self._run(cols, 1, "raise")[0]

    def privatize_batch(self, columns: Mapping[str, Any], *,
                        on_invalid: Literal["raise", "skip"] = "raise",
                        return_mask: bool = False) -> ReportBatch | tuple[ReportBatch, np.ndarray]:
        """Privatize a batch of events given column by column (vectorised).

        Parameters
        ----------
        columns : mapping str → array-like of length n, or pandas.DataFrame
            One column per schema field, and the event-time column for schemas with
            ``[event_time]`` (extra columns are ignored). Numeric columns may be float arrays with
            NaN for missing values, or object arrays with None; categorical columns are
            arrays/lists of strings (None/NaN = missing); the time column holds ISO-8601 strings
            (``"2013-01-01T10:00:00Z"``; no zone = UTC), ``datetime64``/``datetime`` values or Unix
            seconds (``ingest.client.event_time.to_unix_seconds``).
        on_invalid : {"raise", "skip"}
            ``"raise"``: the first invalid value raises SchemaError naming the field and row.
            ``"skip"``: rows with a missing / NaN / non-numeric value, an unknown category or an
            invalid event time are dropped and counted in :attr:`stats` by reason.
        return_mask : bool
            Also return the boolean mask (length of the input) of the rows that became reports.

        Returns
        -------
        ReportBatch
            ``n`` = number of valid rows; numeric ``(n, d)`` float64 in original units;
            ``event_time`` int64 ``(n,)`` Unix seconds rounded down to the schema's resolution
            (None without ``[event_time]``).
        mask : ndarray of bool, shape (rows,)
            Only with ``return_mask=True``.

        Raises
        ------
        SchemaError
            A schema field or the event-time column has no column, columns differ in length,
            ``on_invalid`` is not recognised, or (with ``"raise"``) a value is invalid; an invalid
            event time raises :class:`~ingest.client.event_time.EventTimeError` naming the time column
            and the row.
        """
        if on_invalid not in ("raise", "skip"):
            raise SchemaError(f"on_invalid must be 'raise' or 'skip', got {on_invalid!r}")
        if not hasattr(columns, "__getitem__") or not hasattr(columns, "__contains__"):
            raise SchemaError(
                f"columns must be a mapping of column name to array, got {type(columns).__name__}")
        n = None
        cols: dict[str, Any] = {}
        for name in self._columns:
            if name not in columns:
                what = "time column" if name == self._time_field else "field"
                raise SchemaError(f"{what} {name!r}: no such column in the batch")
            col = _as_array(columns[name], name)
            if n is None:
                n = col.shape[0]
            elif col.shape[0] != n:
                raise SchemaError(f"field {name!r}: column has {col.shape[0]} rows, expected {n}")
            cols[name] = col
        for name in self.schema.categorical_names:
            bot = name + _BOT_SUFFIX
            if bot in columns:
                cols[bot] = _as_array(columns[bot], bot)
                if cols[bot].shape[0] != n:
                    raise SchemaError(f"field {bot!r}: column has {cols[bot].shape[0]} rows, expected {n}")
        batch, valid = self._run(cols, int(n or 0), on_invalid)
        return (batch, valid) if return_mask else batch

    # ------------------------------------------------------------------ internals
    def _run(self, cols: dict[str, np.ndarray], n: int, on_invalid: str) -> tuple[ReportBatch, np.ndarray]:
        schema = self.schema
        self.stats.rows_in += n
        valid = np.ones(n, dtype=bool)
        first_reason = np.full(n, -1, dtype=np.int8)
        first_field = np.full(n, -1, dtype=np.int16)
        fields = list(self._columns)

        def mark(j: int, bad: np.ndarray, reason: str) -> None:
            if not bad.any():
                return
            if on_invalid == "raise":
                row = int(np.flatnonzero(bad)[0])
                if reason == "invalid_time":
                    raise invalid_time_error(cols[fields[j]], fields[j], row)
                raw = cols[fields[j]][row]
                where = f" (row {row})" if n > 1 else ""
                what = {"missing": "value is missing", "wrong_type": f"value {raw!r} is not a real number",
                        "non_finite": f"value {raw!r} is not finite",
                        "unknown_category": f"unknown category {raw!r}"}[reason]
                if reason == "wrong_type" and isinstance(schema.field(fields[j]), CategoricalField):
                    what = f"value {raw!r} is not a string"
                raise SchemaError(f"field {fields[j]!r}: {what}{where}")
            new = bad & (first_reason < 0)
            first_reason[new] = INVALID_REASONS.index(reason)
            first_field[new] = j
            valid[bad] = False

        # numeric block: parse, validate
        d = schema.dim
        x = np.empty((n, d), dtype=np.float64)
        for j, name in enumerate(schema.numeric_names):
            vals, missing, wrong = _numeric_column(cols[name])
            mark(j, missing, "missing")
            mark(j, wrong & ~missing, "wrong_type")
            nonfin = ~np.isfinite(vals) & ~missing & ~wrong
            mark(j, nonfin, "non_finite")
            x[:, j] = vals
        # categorical: map to codes
        codes: dict[str, np.ndarray] = {}
        fallback_hits: dict[str, np.ndarray] = {}
        for jj, c in enumerate(schema.categorical):
            j = d + jj
            code, missing, wrong, unknown = self._category_codes(c, cols[c.name])
            mark(j, missing, "missing")
            mark(j, wrong, "wrong_type")
            if c.fallback is not None:
                code[unknown] = self._luts[c.name][c.fallback]
                fallback_hits[c.name] = unknown
            else:
                mark(j, unknown, "unknown_category")
            codes[c.name] = code
        # event time: Unix seconds (checked like the fields), rounded down after the filter
        t = None
        if self._time_field is not None:
            t, ok = to_unix_seconds_masked(cols[self._time_field], self._time_field)
            mark(len(fields) - 1, ~ok, "invalid_time")

        if not valid.all():
            bad = ~valid
            for r, cnt in zip(*np.unique(first_reason[bad], return_counts=True)):
                self.stats.skipped[INVALID_REASONS[int(r)]] += int(cnt)
            for f, cnt in zip(*np.unique(first_field[bad], return_counts=True)):
                self.stats.skipped_by_field[fields[int(f)]] += int(cnt)
            x = x[valid]
            codes = {k: v[valid] for k, v in codes.items()}
            cols = {k: (v[valid] if k.endswith(_BOT_SUFFIX) else v) for k, v in cols.items()}
            fallback_hits = {k: v[valid] for k, v in fallback_hits.items()}
            t = t[valid] if t is not None else None
        for k, v in fallback_hits.items():
            if v.any():
                self.stats.fallback[k] += int(v.sum())
        m = int(x.shape[0])

        # numeric: clip (counted), then ONE ZIL draw per report
        if self._zil is not None:
            lo, hi = self._zil.low, self._zil.high
            out_of = (x < lo) | (x > hi)
            if out_of.any():
                per_field = out_of.sum(axis=0)
                for j, name in enumerate(schema.numeric_names):
                    if per_field[j]:
                        self.stats.clipped[name] += int(per_field[j])
                self.stats.clipped_rows += int(out_of.any(axis=1).sum())
                np.clip(x, lo, hi, out=x)
        for c in schema.categorical:
            if c.personalized is not None:
                codes[c.name] = self._apply_pum(c, codes[c.name], cols.get(c.name + _BOT_SUFFIX))
        if self._device is not None:  # memoized parts, then the ledger's spend (ingest.device.runtime)
            released, cat_out = self._device.release(x, codes, self._rng)
        else:
            released = (self._zil.privatize(x, self._rng) if m else x) if self._zil is not None \
                else np.empty((m, 0), dtype=np.float64)
            cat_out = {c.name: self._cat_mechs[c.name].privatize(codes[c.name], self._rng)
                       for c in schema.categorical}
        self.stats.reports += m
        if t is not None:
            t = floor_to(t, schema.event_time.resolution_s)
        return ReportBatch(schema.fingerprint, released, cat_out, t), valid

    def _category_codes(self, c: CategoricalField, col: np.ndarray):
        lut = self._luts[c.name]
        n = col.shape[0]
        if col.dtype.kind == "U":
            col = col.astype(object)
        if col.dtype.kind != "O":
            # numbers / bools are not categories
            if col.dtype.kind == "f":
                missing = np.isnan(col)
            else:
                missing = np.zeros(n, dtype=bool)
            z = np.zeros(n, dtype=np.int32)
            return z, missing, ~missing, np.zeros(n, dtype=bool)
        # dict lookups driven by map() (no per-row Python frame); rows it cannot place are then
        # classified one by one
        items = col.tolist()
        try:
            code = np.fromiter(map(lut.get, items, itertools.repeat(-1, n)), dtype=np.int32, count=n)
        except TypeError:  # an unhashable value (list, dict, ...)
            code = np.array([_lookup(lut, v) for v in items], dtype=np.int32)
        unknown = np.zeros(n, dtype=bool)
        missing = np.zeros(n, dtype=bool)
        wrong = np.zeros(n, dtype=bool)
        for i in np.flatnonzero(code < 0):
            v = items[i]
            if isinstance(v, str):
                unknown[i] = True
            elif v is None or (isinstance(v, float) and math.isnan(v)) or _is_na(v):
                missing[i] = True
            else:
                wrong[i] = True
        code[code < 0] = 0
        return code, missing, wrong, unknown

    def _apply_pum(self, c: CategoricalField, code: np.ndarray, bot_col) -> np.ndarray:
        base = len(c.categories)
        out = code.copy()
        mapping = self._personal.get(c.name)
        if mapping:
            table = np.full(base, -1, dtype=np.int32)
            for v, b in mapping.items():
                table[self._luts[c.name][v]] = b
            hit = table[code]
            out = np.where(hit >= 0, base + hit, out)
        if bot_col is not None:
            b = _int_column(bot_col, c.name + _BOT_SUFFIX)
            if np.any((b < -1) | (b >= c.personalized.bots)):
                raise SchemaError(f"field {c.name + _BOT_SUFFIX!r}: bot index must be -1 or in "
                                  f"[0, {c.personalized.bots}), got {b.min()}..{b.max()}")
            out = np.where(b >= 0, base + b, out).astype(np.int32)
        return out.astype(np.int32, copy=False)

    def _check_personal(self, ps: Mapping[str, Any]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for name, vals in ps.items():
            try:
                c = self.schema.categorical_field(name)
            except SchemaError:
                raise SchemaError(f"personal_sensitive: no categorical field {name!r}") from None
            if c.personalized is None:
                raise SchemaError(f"personal_sensitive: field {name!r} is not personalized (PUM)")
            m = dict(vals) if isinstance(vals, Mapping) else dict.fromkeys(vals, 0)
            for v, b in m.items():
                if v not in self._luts[name]:
                    raise SchemaError(f"personal_sensitive: field {name!r} has no category {v!r}")
                if not (isinstance(b, numbers.Integral) and 0 <= b < c.personalized.bots):
                    raise SchemaError(f"personal_sensitive: field {name!r}: bot index must be in "
                                      f"[0, {c.personalized.bots}), got {b!r}")
            out[name] = {v: int(b) for v, b in m.items()}
        return out

    def __repr__(self) -> str:
        return f"Privatizer(schema={self.schema.name!r}, reports={self.stats.reports})"


# ---------------------------------------------------------------------- column helpers
def _as_array(col: Any, name: str) -> np.ndarray:
    if hasattr(col, "to_numpy") and not isinstance(col, np.ndarray):
        if getattr(col.dtype, "kind", None) in ("f", "i", "u") and str(col.dtype)[0].islower():
            a = col.to_numpy()
        else:
            a = col.to_numpy(dtype=object)
    else:
        try:
            a = np.asarray(col)
        except (TypeError, ValueError):
            a = np.asarray(list(col), dtype=object)
    if a.ndim == 0:
        raise SchemaError(f"field {name!r}: expected a 1-d column, got a scalar")
    if a.ndim != 1:
        raise SchemaError(f"field {name!r}: expected a 1-d column, got shape {a.shape}")
    return a


def _numeric_column(col: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (float64 values, missing mask, wrong-type mask)."""
    n = col.shape[0]
    kind = col.dtype.kind
    if kind in "fiu":
        v = col.astype(np.float64, copy=False)
        return v, np.isnan(v), np.zeros(n, dtype=bool)
    if kind != "O":
        # strings, bools, datetimes: every entry is of the wrong type
        return np.zeros(n), np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
    items = col.tolist()
    vals = np.empty(n, dtype=np.float64)
    missing = np.zeros(n, dtype=bool)
    wrong = np.zeros(n, dtype=bool)
    for i, v in enumerate(items):
        if isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_):
            vals[i] = float(v)
            if vals[i] != vals[i]:
                missing[i] = True
        elif v is None or _is_na(v):
            vals[i] = 0.0
            missing[i] = True
        else:
            vals[i] = 0.0
            wrong[i] = True
    return vals, missing, wrong


def _int_column(col: np.ndarray, name: str) -> np.ndarray:
    if col.dtype.kind not in "iu":
        raise SchemaError(f"field {name!r}: expected integers, got dtype {col.dtype}")
    return col.astype(np.int64)


def _lookup(lut: dict[str, int], v: Any) -> int:
    try:
        return lut.get(v, -1)
    except TypeError:  # unhashable
        return -1


def _is_na(v: Any) -> bool:
    """pandas.NA / NaT without importing pandas."""
    t = type(v).__name__
    return t in ("NAType", "NaTType")
