"""Consumer-side doubling: the block ``X̃₂`` every state receives next to ``X̃₁``.

The worker doubles every report as ``X̃₂ = X̃₁ + sqrt(δλ²)·range·sqrt(W)·G`` — the distribution
of ``mechanisms.zil.double`` (docs/mechanisms.md §2.1–2.2) — with standard symmetric-Laplace
draws ``sqrt(W)·G`` seeded by the bytes of the record the report came in
(:func:`doubling_seed`), so that the draws depend only on the record, never on how records are
batched, and a replay reproduces every state bit for bit. :class:`Doubler` is the doubling of
one schema, as the worker's plan uses it; :func:`double_records` and :func:`doubling_draws` are
its arithmetic.
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = ["Doubler", "double_records", "doubling_draws", "doubling_seed"]


def doubling_seed(record_bytes) -> int:
    """The seed of a record's doubling draws: XXH3-64 (seed 0) of all its bytes.

    Parameters
    ----------
    record_bytes : bytes-like
        The raw Kafka record value (any length).

    Returns
    -------
    int in [0, 2⁶⁴)

    Raises
    ------
    TypeError
        If ``record_bytes`` is not bytes-like.
    """
    return xxhash.xxh3_64_intdigest(record_bytes)


def doubling_draws(records, counts, dim: int) -> np.ndarray:
    """Standard symmetric-Laplace draws ``sqrt(W)·G`` (``SL_dim(I)``) for the reports of records,
    deterministic per record.

    The worker doubles every report as ``X̃₂ = X̃₁ + sqrt(δλ²)·range·sqrt(W)·G`` (docs/mechanisms.md §2.2, the
    arithmetic of ``mechanisms.zil.sample_sl``) with these draws: record ``r``'s rows come from
    SplitMix64 seeded with :func:`doubling_seed` of its bytes (layout in
    ``aggregator.state._kernels.sl_draws``), so they depend only on the record — not on how
    records are batched — and a replay after a crash reproduces ``X̃₂``, and hence every state,
    bit for bit. ``X̃₂`` is post-processing of the public report: a public seed costs no privacy.

    Parameters
    ----------
    records : sequence of bytes-like, length R
        Record values.
    counts : sequence of int, length R
        Reports in each record.
    dim : int
        Numeric dimension ``d``.

    Returns
    -------
    ndarray of float64, shape (Σ counts, dim)
        Rows of record 0, then record 1, … . ``W ~ Exp(1)`` is shared by a row's coordinates and
        ``G ~ N(0, I)``, so each row has mean 0 and covariance ``I``.

    Raises
    ------
    TypeError
        If a record is not bytes-like.
    """
    from aggregator.state._kernels import sl_draws

    seeds, n = _seeds_counts(records, counts)
    out = np.empty((int(n.sum()), int(dim)))
    sl_draws(seeds, n, out)
    return out


def double_records(records, counts, x1: np.ndarray, sd: float) -> np.ndarray:
    """The worker's doubled block ``X̃₂ = X̃₁ + sd·sqrt(W)·G`` of records' reports, in one pass.

    Bit for bit ``g = doubling_draws(records, counts, d); g *= sd; g += x1`` — the same draws
    (deterministic per record, see :func:`doubling_draws`) with the scaling and the sum done in
    the compiled loop that draws them (``aggregator.state._kernels.sl_double``), not in two more
    passes over the arrays. The worker calls it with ``sd = sqrt(zero_prob · noise_variance)``
    (``δλ²·range²`` per coordinate, docs/mechanisms.md §2.1).

    Parameters
    ----------
    records : sequence of bytes-like, length R
        Record values.
    counts : sequence of int, length R
        Reports in each record (Σ counts = n).
    x1 : ndarray of float64, shape (n, d)
        The reports' numeric block ``X̃₁``, rows in record order.
    sd : float or ndarray of float64, shape (d,)
        Scale of the added noise per coordinate (a scalar applies to every coordinate).

    Returns
    -------
    ndarray of float64, shape (n, d)

    Raises
    ------
    ValueError
        If ``x1`` does not have Σ counts rows, or ``sd`` is neither a scalar nor of shape (d,).
    TypeError
        If a record is not bytes-like.
    """
    from aggregator.state._kernels import sl_double

    seeds, n = _seeds_counts(records, counts)
    x1 = np.ascontiguousarray(x1, dtype=np.float64)
    if x1.ndim != 2 or x1.shape[0] != int(n.sum()):
        raise ValueError(f"x1 must have shape (sum(counts), d) = ({int(n.sum())}, d), got {x1.shape}")
    try:
        sd = np.ascontiguousarray(np.broadcast_to(np.asarray(sd, dtype=np.float64), (x1.shape[1],)))
    except ValueError:
        raise ValueError(f"sd must be a scalar or of shape ({x1.shape[1]},), "
                         f"got shape {np.shape(sd)}") from None
    out = np.empty_like(x1)
    sl_double(seeds, n, x1, sd, out)
    return out


def _seeds_counts(records, counts) -> tuple[np.ndarray, np.ndarray]:
    """Per-record seeds (uint64, :func:`doubling_seed`) and report counts (int64) of records."""
    seeds = np.fromiter(map(doubling_seed, records), dtype=np.uint64, count=len(records))
    return seeds, np.asarray(counts, dtype=np.int64).reshape(-1)


class Doubler:
    """The doubling ``X̃₂`` of a schema's reports, record by record or for several records at once.

    Parameters
    ----------
    schema : ingest.client.schema.TelemetrySchema
        Its :meth:`zil_mechanism` gives ``sd = sqrt(zero_prob · noise_variance)`` per numeric
        coordinate (``δλ²·range²``, docs/mechanisms.md §2.2); a schema without numeric fields doubles nothing.

    Attributes
    ----------
    sd : ndarray of float64, shape (d,), or None
        Scale of the added noise per coordinate; None when the schema has no numeric block.
    """

    def __init__(self, schema) -> None:
        mech = schema.zil_mechanism()
        self.sd = None if mech is None else np.sqrt(mech.zero_prob * mech.noise_variance)

    def double_many(self, batch, records, counts) -> np.ndarray:
        """``X̃₂`` of a batch made of several records (their bytes and report counts, in order).

        Equal, bit for bit, to :meth:`double` applied record by record. A batch without numeric
        columns or reports, or a schema without numeric fields, gives a copy of ``X̃₁``.

        Parameters
        ----------
        batch : ingest.client.batch.ReportBatch
            ``batch.numeric`` is ``X̃₁``, shape (n, d), rows in record order.
        records : sequence of bytes-like
        counts : sequence of int
            Reports in each record (Σ counts = n).

        Returns
        -------
        ndarray of float64, shape (n, d)
        """
        x1 = batch.numeric
        if self.sd is None or x1.shape[1] == 0 or batch.n == 0:
            return x1.copy()
        return double_records(records, counts, x1, self.sd)

    def double(self, batch, record) -> np.ndarray:
        """``X̃₂`` of the reports of one record (its bytes seed the draws)."""
        return self.double_many(batch, [record], [batch.n])

    def __repr__(self) -> str:
        return f"Doubler(d={0 if self.sd is None else self.sd.size})"
