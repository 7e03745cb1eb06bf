"""Compiled (numba, ``nogil``) update loops of the closed-form states.

A worker applies state updates on a background thread while its main thread polls Kafka and
decodes the next records (``aggregator.worker.Worker``, ``overlap=True``). NumPy releases the GIL
only inside large ufunc loops, so the many NumPy calls of the moment, histogram and uRAP count
updates fought the main thread for the GIL: in process, the five closed-form queries of the
flights pipeline ran *slower* threaded (1.6·10⁶ reports/s) than serially (1.8·10⁶). These loops
compute the same quantities in one pass each without the GIL:

* :func:`moments_batch` — batch mean and centred cross-product matrix of
  ``z = (a, b, a², b²)`` (two passes; merged by ``moments.chan_merge``);
* :func:`histogram3` — the three histograms (``X̃₁``, ``X̃₂``, ``max``) of ``HistogramState``,
  bin index ``= searchsorted(edges, x, "left")`` by arithmetic on the uniform edges plus an
  exact ±1 correction;
* :func:`urap_counts` — ``URAP.counts`` without pattern tracking (``max_patterns = 0``): per-bit
  counts, the ≤ 1 non-sensitive-bit check, and the per-bit counts of protected reports.
* :func:`sl_draws` — the consumer's doubling draws ``sqrt(W)·G`` (standard ``SL_d(I)``) of many
  records at once from per-record SplitMix64 streams (see ``aggregator.state.base.doubling_draws``).

Each is checked against an independent NumPy computation in ``tests/aggregator/test_kernels.py``.
Source: DESIGN §5 (state families), §3 (uRAP counts).
"""

from __future__ import annotations

import numpy as np

from ingest._numba import jit

__all__ = ["histogram3", "moments_batch", "sl_draws", "urap_counts", "warm"]


@jit(nogil=True)
def moments_batch(a, b):  # pragma: no cover - compiled
    """Mean ``(4,)`` and centred cross-products ``(4, 4)`` of ``z = (a, b, a², b²)``, ``a, b (n,)``."""
    n = a.shape[0]
    mb = np.zeros(4)
    z = np.empty(4)
    for i in range(n):
        x, y = a[i], b[i]
        mb[0] += x
        mb[1] += y
        mb[2] += x * x
        mb[3] += y * y
    if n:
        mb /= n
    cb = np.zeros((4, 4))
    for i in range(n):
        x, y = a[i], b[i]
        z[0] = x - mb[0]
        z[1] = y - mb[1]
        z[2] = x * x - mb[2]
        z[3] = y * y - mb[3]
        for j in range(4):
            for k in range(j, 4):
                cb[j, k] += z[j] * z[k]
    for j in range(4):
        for k in range(j):
            cb[j, k] = cb[k, j]
    return mb, cb


@jit(nogil=True)
def _bin(v, low, inv_w, pad):  # pragma: no cover - compiled
    nb = pad.shape[0] - 2  # number of edges
    g = np.ceil((v - low) * inv_w)
    if g < 0.0:
        g = 0.0
    elif g > nb:
        g = float(nb)
    k = int(g)
    if pad[k] >= v:  # edges[k - 1] >= v: one edge fewer lies below v
        k -= 1
    if pad[k + 1] < v:  # edges[k] < v: one more
        k += 1
    return k


@jit(nogil=True)
def histogram3(a, b, low, inv_w, pad, c1, c2, cmax):  # pragma: no cover - compiled
    """Add the bin counts of ``a``, ``b`` and ``max(a, b)`` (each ``(n,)``) to ``c1``, ``c2``,
    ``cmax`` (int64, ``edges.size + 1``) in place; ``pad = [−inf, edges…, +inf]``,
    ``inv_w = bins/(high − low)``, ``low = edges[0]``."""
    for i in range(a.shape[0]):
        x, y = a[i], b[i]
        c1[_bin(x, low, inv_w, pad)] += 1
        c2[_bin(y, low, inv_w, pad)] += 1
        cmax[_bin(x if x >= y else y, low, inv_w, pad)] += 1


@jit(nogil=True)
def urap_counts(indices, offsets, rank, k, s):  # pragma: no cover - compiled
    """Per-bit counts of a CSR batch of uRAP reports.

    Parameters
    ----------
    indices : int32 (nnz,); offsets : int64 (n + 1,)
        ``SparseBits`` arrays.
    rank : int64 (k,)
        Rank of a code among the sensitive codes, −1 for non-sensitive codes.
    k, s : int
        Domain size and number of sensitive codes.

    Returns
    -------
    counts : int64 (k,)
        Reports with bit j set.
    protected : int
        Reports with no non-sensitive bit set.
    overflow_bits : int64 (s,)
        Among protected reports, the number with sensitive bit r set.
    bad : int
        First report with more than one non-sensitive bit (−1 if none; then the other outputs
        are incomplete).
    bad_count : int
        Its number of non-sensitive bits.
    """
    counts = np.zeros(k, np.int64)
    ob = np.zeros(s, np.int64)
    protected = 0
    for r in range(offsets.shape[0] - 1):
        lo, hi = offsets[r], offsets[r + 1]
        nns = 0
        for e in range(lo, hi):
            j = indices[e]
            counts[j] += 1
            if rank[j] < 0:
                nns += 1
        if nns > 1:
            return counts, protected, ob, r, nns
        if nns == 0:
            protected += 1
            for e in range(lo, hi):
                ob[rank[indices[e]]] += 1
    return counts, protected, ob, -1, 0


_warm = False


_GAMMA = np.uint64(0x9E3779B97F4A7C15)


@jit(nogil=True)
def _uniform(seed, j):  # pragma: no cover - compiled
    """Draw ``j`` (≥ 1) of SplitMix64 seeded with ``seed`` as a double in (0, 1):
    ``((mix(seed + j·γ) >> 11) + 0.5) · 2⁻⁵³`` (mix = Stafford's variant 13, SplitMix64's output)."""
    z = seed + np.uint64(j) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (float(z >> np.uint64(11)) + 0.5) * 1.1102230246251565e-16


@jit(nogil=True)
def sl_draws(seeds, counts, out):  # pragma: no cover - compiled
    """Fill ``out`` ``(Σ counts, d)`` with standard ``SL_d(I)`` draws ``sqrt(W)·G``.

    The ``counts[r]`` rows of record ``r`` come from SplitMix64 seeded with ``seeds[r]`` (uint64):
    row ``i`` of the record uses draws ``j = i·(1 + 2p) + 1 … (i + 1)·(1 + 2p)``, ``p = ⌈d/2⌉``:
    ``W = −log u_j`` from the first, then Box–Muller pairs ``r = sqrt(−2 log u)``,
    ``θ = 2π u′`` giving ``G = (r cos θ, r sin θ, …)`` (the last sine dropped when ``d`` is odd).
    """
    d = out.shape[1]
    p = (d + 1) // 2
    per_row = 1 + 2 * p
    row = 0
    for r in range(seeds.shape[0]):
        seed = seeds[r]
        for i in range(counts[r]):
            j = i * per_row + 1
            sw = np.sqrt(-np.log(_uniform(seed, j)))
            for t in range(p):
                rad = np.sqrt(-2.0 * np.log(_uniform(seed, j + 1 + 2 * t))) * sw
                theta = 6.283185307179586 * _uniform(seed, j + 2 + 2 * t)
                out[row, 2 * t] = rad * np.cos(theta)
                if 2 * t + 1 < d:
                    out[row, 2 * t + 1] = rad * np.sin(theta)
            row += 1


def warm() -> None:
    """Compile or load these kernels now (once per process), not on a worker's first record."""
    global _warm
    if _warm:
        return
    v = np.zeros(2)
    moments_batch(v, v)
    moments_batch(v[::2], v[::2])
    c = np.zeros(3, np.int64)
    pad = np.array([-np.inf, 0.0, 1.0, np.inf])
    histogram3(v, v, 0.0, 1.0, pad, c, c.copy(), c.copy())
    histogram3(v[::2], v[::2], 0.0, 1.0, pad, c, c.copy(), c.copy())
    urap_counts(np.zeros(1, np.int32), np.array([0, 1]), np.array([0, -1]), 2, 1)
    sl_draws(np.zeros(1, np.uint64), np.ones(1, np.int64), np.empty((1, 2)))
    _warm = True
