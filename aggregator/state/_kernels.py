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
  records at once from per-record SplitMix64 streams through ziggurat samplers (see
  ``aggregator.state.doubling.doubling_draws``); :func:`sl_double` scales them and adds ``X̃₁`` in
  the same pass (``aggregator.state.doubling.double_records``).

Each is checked against an independent NumPy computation in ``tests/aggregator/test_kernels.py``.
Source: docs/mechanisms.md §2.2, §6.1, §6.2; docs/frequency.md §8 (uRAP counts).
"""

from __future__ import annotations

import math

import numpy as np

from ingest.jit import jit

__all__ = ["histogram3", "moments_batch", "sl_double", "sl_draws", "urap_counts", "warm"]


#: Sums over a batch's rows may be reassociated (vectorized, several accumulators): they differ
#: from a row-by-row loop in the last bits only, and are the same on every run of one build.
FAST_SUMS = {"reassoc", "contract"}


@jit(nogil=True, fastmath=FAST_SUMS)
def moments_batch(a, b):  # pragma: no cover - compiled
    """Mean ``(4,)`` and centred cross-products ``(4, 4)`` of ``z = (a, b, a², b²)``, ``a, b (n,)``.

    Two passes (mean, then centred products); every sum is a scalar accumulator so that the
    compiler keeps them in registers (3.2 ns per row against 9.0 ns with ``z`` in an array, on
    1.29·10⁵ rows)."""
    n = a.shape[0]
    mb = np.zeros(4)
    cb = np.zeros((4, 4))
    if n == 0:
        return mb, cb
    s0 = s1 = s2 = s3 = 0.0
    for i in range(n):
        x, y = a[i], b[i]
        s0 += x
        s1 += y
        s2 += x * x
        s3 += y * y
    m0, m1, m2, m3 = s0 / n, s1 / n, s2 / n, s3 / n
    c00 = c01 = c02 = c03 = c11 = c12 = c13 = c22 = c23 = c33 = 0.0
    for i in range(n):
        x, y = a[i], b[i]
        z0 = x - m0
        z1 = y - m1
        z2 = x * x - m2
        z3 = y * y - m3
        c00 += z0 * z0
        c01 += z0 * z1
        c02 += z0 * z2
        c03 += z0 * z3
        c11 += z1 * z1
        c12 += z1 * z2
        c13 += z1 * z3
        c22 += z2 * z2
        c23 += z2 * z3
        c33 += z3 * z3
    mb[0], mb[1], mb[2], mb[3] = m0, m1, m2, m3
    cb[0, 0], cb[1, 1], cb[2, 2], cb[3, 3] = c00, c11, c22, c33
    cb[0, 1] = cb[1, 0] = c01
    cb[0, 2] = cb[2, 0] = c02
    cb[0, 3] = cb[3, 0] = c03
    cb[1, 2] = cb[2, 1] = c12
    cb[1, 3] = cb[3, 1] = c13
    cb[2, 3] = cb[3, 2] = c23
    return mb, cb


@jit(nogil=True)
def _bin(v, low, inv_w, pad):  # pragma: no cover - compiled
    """Bin of a finite ``v``: the clamp and the ±1 corrections are written without branches.
    Reports outside ``[low, high]`` are common (the noise is wide) and fall below or above at
    random, so an ``if`` per side would often be mispredicted."""
    nb = pad.shape[0] - 2  # number of edges
    k = int(min(max(np.ceil((v - low) * inv_w), 0.0), float(nb)))
    k -= pad[k] >= v  # edges[k - 1] >= v: one edge fewer lies below v
    k += pad[k + 1] < v  # edges[k] < v: one more
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
        ``SparseBits`` arrays (``offsets[0]`` need not be 0: a slice of a larger batch).
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

    Three flat loops, none whose trip count is a report's length (such a loop's exit, and the "protected"
    test, would be mispredicted once per report): the positions (counts, and a running count of
    non-sensitive bits), the reports (their non-sensitive bits as a difference of that running count; a
    protected report marks where it starts and ends), the positions again (each adds its report's mark to
    its sensitive rank; non-sensitive positions go to a spare slot).
    """
    n = offsets.shape[0] - 1
    counts = np.zeros(k, np.int64)
    ob = np.zeros(s + 1, np.int64)  # slot s: non-sensitive positions (never in a protected report)
    nsf = np.empty(k, np.int64)
    slot = np.empty(k, np.int64)
    for j in range(k):
        nsf[j] = 1 if rank[j] < 0 else 0
        slot[j] = s if rank[j] < 0 else rank[j]
    base = offsets[0]
    m = offsets[n] - base
    cum = np.empty(m + 1, np.int64)  # cum[e]: non-sensitive bits among positions < e
    cum[0] = 0
    c = 0
    for e in range(m):
        j = indices[base + e]
        counts[j] += 1
        c += nsf[j]
        cum[e + 1] = c
    step = np.zeros(m + 1, np.int8)  # Σ step[≤ e] = 1 where position e is in a protected report
    protected = 0
    prev = 0
    for r in range(n):
        lo = offsets[r] - base
        nns = cum[offsets[r + 1] - base] - cum[lo]
        if nns > 1:
            return counts, protected, ob[:s], r, nns
        p = 1 if nns == 0 else 0
        protected += p
        step[lo] += p - prev
        prev = p
    inside = 0
    for e in range(m):
        inside += step[e]
        ob[slot[indices[base + e]]] += inside
    return counts, protected, ob[:s].copy(), -1, 0


_warm = False


_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_ZIG_LAYERS = 256


def _ziggurat(f, finv, tail_area, r0: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Marsaglia–Tsang ziggurat of 256 equal-area layers under a decreasing ``f`` on [0, ∞).

    ``r`` (the base layer's edge) is solved by bisection near ``r0`` so that the layers close at
    ``f(0)``: with ``V = r·f(r) + tail_area(r)``, ``x₀ = V/f(r)``, ``x₁ = r``,
    ``x_{i+1} = f⁻¹(V/x_i + f(x_i))`` and ``x₂₅₆ = 0``, every layer ``i ≥ 1`` spans heights
    ``[f(x_i), f(x_{i+1})]`` over ``[0, x_i]`` and the base is ``[0, r]×[0, f(r)]`` plus the tail,
    each of area ``V``. Returns ``(r, x (257,), f(x) (257,))``.
    """
    def build(r):
        v = r * f(r) + tail_area(r)
        x = [v / f(r), r]
        for _ in range(1, _ZIG_LAYERS - 1):
            y = v / x[-1] + f(x[-1])
            if y >= f(0.0):
                return None, y - f(0.0)
            x.append(finv(y))
        return x, v / x[-1] + f(x[-1]) - f(0.0)

    lo, hi = r0 * 0.999, r0 * 1.001  # closure error > 0 below the right r, < 0 above
    while True:  # until lo and hi are adjacent doubles (≈ 50 halvings)
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        _, err = build(mid)
        if err > 0:
            lo = mid
        else:
            hi = mid
    x, _ = build(hi)
    xs = np.array([*x, 0.0])
    return hi, xs, np.array([f(v) for v in xs])


_ZN_R, _ZN_X, _ZN_F = _ziggurat(lambda x: math.exp(-0.5 * x * x), lambda y: math.sqrt(-2.0 * math.log(y)),
                                lambda r: math.sqrt(math.pi / 2.0) * math.erfc(r / math.sqrt(2.0)),
                                3.6541528853610088)
_ZE_R, _ZE_X, _ZE_F = _ziggurat(lambda x: math.exp(-x), lambda y: -math.log(y), lambda r: math.exp(-r),
                                7.69711747013104972)


@jit(nogil=True)
def _mix(seed, j):  # pragma: no cover - compiled
    """Output ``j`` (≥ 1) of SplitMix64 seeded with ``seed``: Stafford's variant-13 mix of
    ``seed + j·γ`` (mod 2⁶⁴)."""
    z = seed + np.uint64(j) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit(nogil=True)
def _uniform(seed, j):  # pragma: no cover - compiled
    """Output ``j`` as a double in (0, 1): ``((z >> 11) + 0.5)·2⁻⁵³``."""
    return (float(np.int64(_mix(seed, j) >> np.uint64(11))) + 0.5) * 1.1102230246251565e-16


@jit(nogil=True)
def _normal_tail(seed, jj, r):  # pragma: no cover - compiled
    """The base layer's tail ``r + a`` of :func:`_sl_rows`' normal ziggurat, from outputs
    ``jj[0], jj[0]+1, …`` (``jj[0]`` advanced past them): ``a = −log(u₁)/r``, ``b = −log(u₂)``,
    accepted when ``2b > a²`` (Marsaglia 1964), else retried with the next two outputs."""
    j = jj[0]
    while True:
        a = -np.log(_uniform(seed, j)) / r
        b = -np.log(_uniform(seed, j + 1))
        j += 2
        if b + b > a * a:
            jj[0] = j
            return r + a


@jit(nogil=True)
def _sl_rows(seeds, counts, out, w_out, with_w, x1, sd, nr, nx, nf, er, ex, ef):  # pragma: no cover
    """Rows of :func:`sl_draws` (``with_w``: ``W`` first, written to ``w_out`` when it has a
    slot per row; else ``W = 1``). When ``x1`` has a row per output row, each output is
    ``x1[row, c] + sqrt(W)·G_c·sd[c]`` (:func:`sl_double`), else ``sqrt(W)·G_c``.

    Both samplers are 256-layer ziggurats written inline: output ``z`` picks layer
    ``i = z & 255`` and ``u = (z >> 11)·2⁻⁵³``; ``v = u·x_i`` is accepted when ``v < x_{i+1}``;
    otherwise layer ``i ≥ 1`` accepts when a uniform height in ``[f(x_i), f(x_{i+1})]`` (one
    more output) lies below ``f(v)``, and the base layer draws the tail (exponential:
    ``r − log u``, one output; normal: :func:`_normal_tail`). A rejection starts over with the
    next output. The normal takes its sign from bit 8 of ``z`` (branch-free). (Written as one
    flat loop: a sampler function returning ``(value, next output)`` from inside its rejection
    loop compiled ≈ 3× slower.)
    """
    d = out.shape[1]
    keep_w = w_out.shape[0] > 0
    add_x1 = x1.shape[0] > 0
    jj = np.ones(1, np.int64)
    row = 0
    for k in range(seeds.shape[0]):
        seed = seeds[k]
        j = 1
        for _ in range(counts[k]):
            sw = 1.0
            if with_w:
                while True:  # W ~ Exp(1)
                    z = _mix(seed, j)
                    j += 1
                    i = np.int64(z & np.uint64(255))
                    w = float(np.int64(z >> np.uint64(11))) * 1.1102230246251565e-16 * ex[i]
                    if w < ex[i + 1]:
                        break
                    if i == 0:
                        w = er - np.log(_uniform(seed, j))
                        j += 1
                        break
                    y = ef[i] + _uniform(seed, j) * (ef[i + 1] - ef[i])
                    j += 1
                    if y < np.exp(-w):
                        break
                if keep_w:
                    w_out[row] = w
            c = 0
            while c < d:  # G_c ~ N(0, 1)
                z = _mix(seed, j)
                j += 1
                i = np.int64(z & np.uint64(255))
                sign = 1.0 - 2.0 * float(np.int64((z >> np.uint64(8)) & np.uint64(1)))
                v = float(np.int64(z >> np.uint64(11))) * 1.1102230246251565e-16 * nx[i]
                if v >= nx[i + 1]:
                    if i == 0:
                        jj[0] = j
                        v = _normal_tail(seed, jj, nr)
                        j = jj[0]
                    else:
                        y = nf[i] + _uniform(seed, j) * (nf[i + 1] - nf[i])
                        j += 1
                        if y >= np.exp(-0.5 * v * v):
                            continue
                out[row, c] = sign * v
                c += 1
            # sqrt(W) after the draws, so that its latency does not hold up theirs
            if with_w:
                sw = np.sqrt(w)
            if add_x1:  # (draw · sd) + x̃₁: the arithmetic, and so the bits, of g *= sd; g += x1
                for c in range(d):
                    out[row, c] = (sw * out[row, c]) * sd[c] + x1[row, c]
            elif with_w:
                for c in range(d):
                    out[row, c] = sw * out[row, c]
            row += 1


_NO_W = np.empty(0)
_NO_X1 = np.empty((0, 0))


def sl_draws(seeds, counts, out) -> None:
    """Fill ``out`` ``(Σ counts, d)`` with standard ``SL_d(I)`` draws ``sqrt(W)·G``.

    The ``counts[r]`` rows of record ``r`` use SplitMix64 seeded with ``seeds[r]`` (uint64),
    outputs ``1, 2, …`` consumed in order: per row ``W ~ Exp(1)`` then ``G₁ … G_d ~ N(0, 1)``,
    each by a 256-layer ziggurat (:func:`_sl_rows`; tables from :func:`_ziggurat`). Compiled,
    without the GIL.
    """
    _sl_rows(seeds, counts, out, _NO_W, True, _NO_X1, _NO_W, _ZN_R, _ZN_X, _ZN_F, _ZE_R, _ZE_X, _ZE_F)


def sl_double(seeds, counts, x1, sd, out) -> None:
    """Fill ``out`` ``(Σ counts, d)`` with ``x1 + sd·sqrt(W)·G``: :func:`sl_draws`' draws scaled
    by ``sd`` (float64 ``(d,)``, per coordinate) and added to ``x1`` (``(Σ counts, d)``, float64)
    in the same pass, bit for bit what
    ``g = sl_draws(…); g *= sd; g += x1`` gives, without two more passes over the arrays.
    ``out`` must not share memory with ``x1`` (a row's draws are written before it is read)."""
    _sl_rows(seeds, counts, out, _NO_W, True, x1, sd, _ZN_R, _ZN_X, _ZN_F, _ZE_R, _ZE_X, _ZE_F)


def normal_draws(seed: int, n: int) -> np.ndarray:
    """``n`` standard normals from one SplitMix64 stream (the sampler of :func:`sl_draws`; for tests)."""
    out = np.empty((1, n))
    _sl_rows(np.array([seed], np.uint64), np.ones(1, np.int64), out, _NO_W, False, _NO_X1, _NO_W,
             _ZN_R, _ZN_X, _ZN_F, _ZE_R, _ZE_X, _ZE_F)
    return out[0]


def exponential_draws(seed: int, n: int) -> np.ndarray:
    """``n`` standard exponentials from one SplitMix64 stream (as :func:`normal_draws`)."""
    w = np.empty(n)
    _sl_rows(np.array([seed], np.uint64), np.array([n], np.int64), np.empty((n, 0)), w, True, _NO_X1, _NO_W,
             _ZN_R, _ZN_X, _ZN_F, _ZE_R, _ZE_X, _ZE_F)
    return w


def warm() -> None:
    """Compile or load these kernels now (once per process), not on a worker's first record."""
    global _warm
    if _warm:
        return
    v = np.zeros(2)
    s = np.zeros(4)[::2]  # strided ('A' layout: a column of the decoded matrix); of 2, not 1
    moments_batch(v, v)
    moments_batch(s, s)
    c = np.zeros(3, np.int64)
    pad = np.array([-np.inf, 0.0, 1.0, np.inf])
    histogram3(v, v, 0.0, 1.0, pad, c, c.copy(), c.copy())
    histogram3(s, s, 0.0, 1.0, pad, c, c.copy(), c.copy())
    urap_counts(np.zeros(1, np.int32), np.array([0, 1]), np.array([0, -1]), 2, 1)
    sl_draws(np.zeros(1, np.uint64), np.ones(1, np.int64), np.empty((1, 2)))
    sd = np.ones(2)
    sd.flags.writeable = False  # double_records passes sd through np.broadcast_to: read-only
    sl_double(np.zeros(1, np.uint64), np.ones(1, np.int64), np.zeros((1, 2)), sd, np.empty((1, 2)))
    _warm = True
