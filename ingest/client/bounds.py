"""What a report may hold beyond its layout (docs/wire-format.md §4): the span of a numeric
report and the non-sensitive positions of a uRAP field, with the checks that refuse a report
outside them. Shared by the Python decoder (:mod:`ingest.client.codec`) and the compiled one
(:mod:`ingest.client.decode_kernel`)."""

from __future__ import annotations

import functools

import numpy as np

from ingest.client.schema import TelemetrySchema
from ingest.errors import ImpossibleReportError, OutOfRangeError
from mechanisms.uldp.sparse import SparseBits

__all__ = ["NUMERIC_REPORT_SPAN", "check_non_sensitive", "check_numeric_span", "non_sensitive_mask",
           "numeric_outside", "numeric_span"]

#: How many noise standard deviations (``λ·(high − low)``, docs/mechanisms.md §1.2) a numeric
#: report may lie outside its field's ``[low, high]``. A ZIL report exceeds ``t`` of them with
#: probability ``exp(−√2·t)``, which is 0 in float64 at t = 1000; a value beyond is not a report
#: the privatizer emits (and ``1e308`` would overflow every moment sum), so it is refused as
#: ``out_of_range``.
NUMERIC_REPORT_SPAN = 1000.0

_SPANS: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def numeric_span(schema: TelemetrySchema) -> tuple[np.ndarray, np.ndarray]:
    """The interval a numeric report of ``schema`` can take: ``low − NUMERIC_REPORT_SPAN·σ`` to
    ``high + NUMERIC_REPORT_SPAN·σ`` per field, with ``σ = λ·(high − low)`` the ZIL noise
    standard deviation (docs/wire-format.md §4). Two float64 arrays ``(d,)``, cached per
    fingerprint; empty for a schema without numeric fields."""
    key = bytes(schema.fingerprint)
    out = _SPANS.get(key)
    if out is None:
        mech = schema.zil_mechanism()
        if mech is None:
            out = (np.empty(0), np.empty(0))
        else:
            out = (mech.low - NUMERIC_REPORT_SPAN * mech.coord_scale,
                   mech.high + NUMERIC_REPORT_SPAN * mech.coord_scale)
        _SPANS[key] = out
    return out


def numeric_outside(schema: TelemetrySchema, numeric: np.ndarray) -> np.ndarray:
    """bool ``(n, d)``: where numeric reports ``(n, d)`` lie outside :func:`numeric_span`."""
    lo, hi = numeric_span(schema)
    return (numeric < lo) | (numeric > hi)


def check_numeric_span(schema: TelemetrySchema, numeric: np.ndarray) -> None:
    """Refuse numeric reports ``(n, d)`` (finite) outside :func:`numeric_span`.

    Raises
    ------
    OutOfRangeError
        Naming the field, the report and the allowed interval.
    """
    if not numeric.size:
        return
    outside = numeric_outside(schema, numeric)
    if outside.any():
        lo, hi = numeric_span(schema)
        i, j = np.argwhere(outside)[0]
        raise OutOfRangeError(
            f"numeric field {schema.numeric_names[j]!r}: report {i} is {numeric[i, j]:g}, outside "
            f"[{lo[j]:g}, {hi[j]:g}] (low/high ± {NUMERIC_REPORT_SPAN:g} noise standard deviations)")


@functools.lru_cache(maxsize=256)
def non_sensitive_mask(k: int, sensitive_codes: tuple[int, ...]) -> np.ndarray:
    """uint8 ``(k,)``: 1 at the non-sensitive positions of a uRAP field of ``k`` bits whose
    sensitive positions are ``sensitive_codes`` (read-only; cached)."""
    mask = np.ones(k, dtype=np.uint8)
    mask[list(sensitive_codes)] = 0
    mask.flags.writeable = False
    return mask


def check_non_sensitive(name: str, col: SparseBits, mask: np.ndarray) -> None:
    """Refuse a uRAP column in which a report has more than one non-sensitive bit set.

    Under uRAP (Murakami & Kawamoto 2019, §4.2; docs/frequency.md §3) a report carries at most
    one non-sensitive bit (the user's own value, when it is non-sensitive); the estimators count
    on it.

    Parameters
    ----------
    name : str
        The field, for the message.
    col : SparseBits
        The column, positions < ``mask.size``.
    mask : ndarray of uint8, shape (k,)
        :func:`non_sensitive_mask` of the field.

    Raises
    ------
    ImpossibleReportError
        Naming the first such report and its count.
    """
    if col.n == 0 or col.indices.size == 0:
        return
    cs = np.zeros(col.indices.size + 1, dtype=np.int64)
    np.cumsum(mask[col.indices], out=cs[1:])
    n_ns = cs[col.offsets[1:]] - cs[col.offsets[:-1]]
    if n_ns.max() > 1:
        bad = int(np.argmax(n_ns > 1))
        raise ImpossibleReportError(f"field {name!r}: report {bad} has {int(n_ns[bad])} non-sensitive "
                                    "bits set (uRAP sets at most 1)")
