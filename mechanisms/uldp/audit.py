"""Monte Carlo audit of the ULDP condition for small domains (paper §3.1 Definition 2; docs/frequency.md §1).

For every protected output y and all inputs x, x′: Q(y|x) ≤ e^ε Q(y|x′); every invertible
output must be produced only by the non-sensitive input it reveals.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtri

from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator
from mechanisms.uldp.sparse import SparseBits

logger = logging.getLogger(__name__)

MAX_AUDIT_K = 8
MAX_AUDIT_BITS = 10


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit_uldp`.

    Attributes
    ----------
    passed : bool
        No ratio test rejected and no invertible-output violation was seen.
    epsilon : float
        The ε audited.
    worst_ratio : float
        Largest observed Q̂(y|x)/Q̂(y|x′) over protected y (``inf`` if some protected output was
        seen from x but never from x′).
    worst : tuple (y, x, x′)
        Where ``worst_ratio`` occurred (y is the protected-output key: a code for uRR, the
        sensitive-bit pattern as an int for uRAP).
    max_z : float
        Largest one-sided z statistic of H₀: Q(y|x) ≤ e^ε Q(y|x′).
    z_crit : float
        Rejection threshold (Bonferroni over ``n_tests`` at family-wise level ``alpha``).
    n_tests : int
    invertible_violations : list of str
        Human-readable descriptions of invertible outputs from the wrong input.
    details : dict
        ``q_hat`` (k_in, n_keys) estimated protected-output probabilities, ``n_per_input``.
    """

    passed: bool
    epsilon: float
    worst_ratio: float
    worst: tuple
    max_z: float
    z_crit: float
    n_tests: int
    invertible_violations: list = field(default_factory=list)
    details: dict = field(default_factory=dict)


def audit_uldp(mechanism, *, n_per_input: int = 100_000, alpha: float = 1e-5,
               personal_sensitive=None, epsilon: float | None = None,
               rng: RngLike = None) -> AuditResult:
    """Estimate Q(y|x) by sampling and test the ULDP condition.

    Parameters
    ----------
    mechanism : URR, RR, URAP, RAPPOR, PUM or any object with ``k``, ``sensitive``, ``epsilon``,
        ``output_kind`` and ``privatize(codes, rng)`` (e.g. a deliberately broken variant).
    n_per_input : int
        Reports sampled per input value (>= 1000).
    alpha : float in (0, 1)
        Family-wise false-rejection probability of a correct mechanism (normal approximation);
        the Bonferroni threshold is z_{1−α/T} over the T ratio tests.
    personal_sensitive : mapping {code: bot}, optional
        For a PUM: the audited user's personally sensitive values (then the sensitive inputs are
        common ∪ personal and the protected outputs those of the common mechanism).
    epsilon : float, optional
        ε to audit (default ``mechanism.epsilon``).
    rng : Generator, int or None

    Returns
    -------
    AuditResult

    Raises
    ------
    ParameterError
        ``k`` > 8, more than 10 sensitive output bits, or bad arguments.

    Notes
    -----
    Test of each (y, x, x′): z = (q̂ − e^ε q̂′)/SE₀ with SE₀ the standard error under the H₀
    boundary q = e^ε q′, q′ estimated by pooling: q₀ = (q̂ + q̂′)/(1 + e^ε),
    SE₀² = [e^ε q₀(1 − e^ε q₀) + e^{2ε} q₀(1 − q₀)]/N. A protected output seen c times from x and
    never from x′ gives z ≈ √(c/e^ε), so correct mechanisms need N·min Q ≫ z_crit² (N = 10⁵
    suffices for k ≤ 6 at ε ≤ 2) and a broken one fails by a wide margin.
    Source: paper §3.1, Definition 2 (ULDP), docs/frequency.md §1.
    """
    if isinstance(n_per_input, bool) or not isinstance(n_per_input, (int, np.integer)) or n_per_input < 1000:
        raise ParameterError(f"n_per_input must be an integer >= 1000, got {n_per_input!r}")
    if not 0 < alpha < 1:
        raise ParameterError(f"alpha must be in (0, 1), got {alpha!r}")
    g = as_generator(rng)
    eps = float(mechanism.epsilon if epsilon is None else epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ParameterError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    k_in = int(mechanism.k)
    if k_in > MAX_AUDIT_K:
        raise ParameterError(f"mechanism.k must be <= {MAX_AUDIT_K} for an audit, got {k_in}")
    if hasattr(mechanism, "mechanism") and hasattr(mechanism, "preprocess"):  # PUM
        common = mechanism.mechanism
        ps = dict(personal_sensitive or {})
        sens_in = set(mechanism.common_sensitive.tolist()) | {int(c) for c in ps}

        def sample(x):
            return mechanism.privatize(np.full(n_per_input, x), ps, g)
    else:
        common = mechanism
        sens_in = set(np.asarray(mechanism.sensitive).tolist())

        def sample(x):
            return mechanism.privatize(np.full(n_per_input, x), g)

    k_out = int(common.k)
    out_sens = np.zeros(k_out, bool)
    out_sens[np.asarray(common.sensitive)] = True
    rank = np.full(k_out, -1, np.int64)
    rank[out_sens] = np.arange(out_sens.sum())
    s_out = int(out_sens.sum())
    kind = common.output_kind
    if kind == "bits" and s_out > MAX_AUDIT_BITS:
        raise ParameterError(f"at most {MAX_AUDIT_BITS} sensitive output bits can be audited, got {s_out}")
    n_keys = s_out if kind == "codes" else 1 << s_out
    C = np.zeros((k_in, n_keys), np.int64)
    violations: list[str] = []
    for x in range(k_in):
        rep = sample(x)
        if kind == "codes":
            y = np.asarray(rep, np.int64)
            prot = out_sens[y]
            C[x] = np.bincount(rank[y[prot]], minlength=n_keys)
            inv_vals = y[~prot]
        else:
            if not isinstance(rep, SparseBits):
                raise ParameterError("a 'bits' mechanism must return SparseBits")
            idx = rep.indices.astype(np.int64)
            rows = np.repeat(np.arange(rep.n), np.diff(rep.offsets))
            ns = ~out_sens[idx]
            n_ns = np.bincount(rows[ns], minlength=rep.n)
            if n_ns.max(initial=0) > 1:
                violations.append(f"input {x}: {int((n_ns > 1).sum())} reports with several invertible bits")
            prot = n_ns == 0
            ent = prot[rows] & ~ns
            key = np.zeros(rep.n, np.int64)
            np.add.at(key, rows[ent], np.left_shift(1, rank[idx[ent]]))
            C[x] = np.bincount(key[prot], minlength=n_keys)
            inv_vals = idx[ns & (n_ns[rows] == 1)]
        if inv_vals.size:
            wrong = inv_vals != x
            if x in sens_in:
                violations.append(f"sensitive input {x}: {inv_vals.size} invertible outputs")
            elif wrong.any():
                violations.append(f"input {x}: {int(wrong.sum())} invertible outputs revealing another value")
    N = float(n_per_input)
    q = C / N
    ee = math.exp(eps)
    qa, qb = q[:, None, :], q[None, :, :]  # (x, x', y)
    num = qa - ee * qb
    # variance under the H₀ boundary Q(y|x) = e^ε Q(y|x′), with Q(y|x′) estimated by pooling
    q0 = np.minimum((qa + qb) / (1 + ee), 1 / ee)
    den = np.sqrt((ee * q0 * (1 - ee * q0) + ee**2 * q0 * (1 - q0)) / N)
    offdiag = ~np.eye(k_in, dtype=bool)[:, :, None]
    valid = offdiag & (den > 0)
    z = np.where(valid, num / np.where(den > 0, den, 1.0), -np.inf)
    n_tests = int(k_in * (k_in - 1) * n_keys)
    z_crit = float(ndtri(1 - alpha / max(n_tests, 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(offdiag & (qa > 0), qa / qb, 0.0)
    ratio = np.where(np.isnan(ratio), 0.0, ratio)
    wi = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst_ratio = float(ratio[wi])
    max_z = float(z.max()) if n_tests else -math.inf
    passed = bool(max_z <= z_crit and not violations)
    result = AuditResult(passed, eps, worst_ratio, (int(wi[2]), int(wi[0]), int(wi[1])), max_z, z_crit,
                         n_tests, violations, {"q_hat": q, "n_per_input": int(n_per_input)})
    logger.info("ULDP audit %s: worst ratio %.4g (e^eps = %.4g), max z %.3g (crit %.3g), %d violations",
                "passed" if passed else "FAILED", worst_ratio, ee, max_z, z_crit, len(violations))
    return result
