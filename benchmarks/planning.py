"""Predicted against simulated interval half-widths of ``mechanisms.planning`` (docs/mechanisms.md §8.4).

Run: ``python -m benchmarks.planning [--reps R] [--seed S]`` — prints the agreement table and writes
``benchmarks/results/planning.json``.

For every setting, R independent windows of n reports are simulated end to end with the project's
own code: raw values drawn from the setting's data assumption, privatized on the "client" by the
schema's ``ZILMechanism`` / uRR / uRAP, doubled with ``ZILMechanism.double`` (the law of the
worker's doubling), folded into the aggregator's state (``MomentsState``, ``HistogramState``,
``CountsState`` via ``build_state``) or estimated by ``mechanisms.estimation.dr_quantile`` (the
batch quantile of ``ldp-stream analyze``), and estimated. Two simulated half-widths are compared
with the predictions: ``z·SD`` of the R estimates (the width an interval *should* have) with the
predicted z·SE of the estimate, and the mean over the R windows of the half-width the state
reports (``(ci_high − ci_low)/2``) with the predicted reported half-width. They differ only for
the streaming quantile, whose reported limits are rounded outwards to the histogram's bin edges.

``tests/mechanisms/test_planning.py`` runs the same simulations with fewer replications.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from mechanisms import planning

#: z_{0.975}; every setting is at level 0.95.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class NumericSetting:
    """One numeric field of a schema with ``dim`` fields (the field is column ``dim // 2``).

    ``data`` holds the data assumption as the keyword arguments of the planning functions
    (empty: uniform on the box); the simulated raw values follow it, or ``population`` when given
    (``("gamma", shape, scale, shift)``: the population a ``data_sample`` pilot was drawn from).
    ``target`` is the estimator (``"sdr"``, ``"dr"``, …) of a mean setting or the quantile level q
    of a quantile setting; ``bins`` None means the batch ``dr_quantile`` instead of the streaming
    histogram.
    """

    label: str
    zero_prob: float
    scale: float
    low: float
    high: float
    n: int
    target: str | float
    data: dict = field(default_factory=dict)
    dim: int = 1
    bins: int | None = 2000
    population: tuple | None = None

    def predicted(self) -> float:
        """The predicted half-width of the reported interval."""
        return self._predict(self.bins)

    def predicted_sd(self) -> float:
        """The predicted z·SE of the estimate (for a quantile: the asymptotic ``z·sqrt(A/n)/f``,
        without the histogram's rounding of the interval limits to bin edges)."""
        return self._predict(None)

    def _predict(self, bins) -> float:
        common = (self.zero_prob, self.scale, self.low, self.high, self.n)
        if isinstance(self.target, str):
            return planning.predict_mean_halfwidth(*common, estimator=self.target, **self.data)
        return planning.predict_quantile_halfwidth(*common, self.target, bins=bins, **self.data)


@dataclass(frozen=True)
class FrequencySetting:
    """One categorical field; the categories are the codes ``0..k−1``, the first ``s`` sensitive;
    ``p`` is the full distribution and ``category`` the code whose frequency is checked."""

    label: str
    mechanism: str
    epsilon: float
    p: tuple[float, ...]
    sensitive_size: int
    category: int
    n: int

    @property
    def k(self) -> int:
        return len(self.p)

    def predicted(self) -> float:
        """The predicted half-width (of the reported interval and z·SE of the estimate alike)."""
        return planning.predict_frequency_halfwidth(
            self.mechanism, self.epsilon, self.k, self.sensitive_size, self.p[self.category], self.n,
            sensitive=self.category < self.sensitive_size)

    predicted_sd = predicted


FLIGHTS = {"data_sd": 44.6, "data_mean": 7.0}  # arr_delay of the 2013 flights (examples/flights.schema.toml)
#: A skewed population (delay-like: Gamma(2, 15) − 20 min, mean 10, SD 21) and a pilot sample of it
#: that a user would pass as ``data_sample``.
GAMMA = ("gamma", 2.0, 15.0, -20.0)
PILOT = np.random.default_rng(2026).gamma(2.0, 15.0, 50_000) - 20.0

MEAN_SETTINGS = (
    NumericSetting("uniform [0, 1], δ=0.2, λ=0.5, sdr", 0.2, 0.5, 0.0, 1.0, 2000, "sdr"),
    NumericSetting("arr_delay N(7, 44.6²) in [-60, 240], δ=0.2, λ=1, sdr", 0.2, 1.0, -60.0, 240.0, 5000,
                   "sdr", FLIGHTS),
    NumericSetting("N(5, 2²) in [0, 10], δ=0.1, λ=0.25, dr, d=3", 0.1, 0.25, 0.0, 10.0, 5000, "dr",
                   {"data_sd": 2.0}, dim=3),
    NumericSetting("Gamma pilot sample in [-60, 240], δ=0.05, λ=2, sdr", 0.05, 2.0, -60.0, 240.0, 5000, "sdr",
                   {"data_sample": PILOT}, population=GAMMA),
)

QUANTILE_SETTINGS = (
    NumericSetting("uniform [0, 1], δ=0.2, λ=0.5, median", 0.2, 0.5, 0.0, 1.0, 10_000, 0.5),
    NumericSetting("N(5, 2²) in [0, 10], δ=0.3, λ=0.25, median, d=3", 0.3, 0.25, 0.0, 10.0, 10_000, 0.5,
                   {"data_sd": 2.0}, dim=3),
    NumericSetting("arr_delay N(7, 44.6²) in [-60, 240], δ=0.2, λ=1, q=0.9", 0.2, 1.0, -60.0, 240.0,
                   20_000, 0.9, FLIGHTS, bins=3000),
    NumericSetting("Gamma pilot sample in [-60, 240], δ=0.2, λ=0.5, q=0.25", 0.2, 0.5, -60.0, 240.0,
                   10_000, 0.25, {"data_sample": PILOT}, population=GAMMA),
    NumericSetting("uniform [0, 1], δ=0.2, λ=0.5, median, batch dr_quantile", 0.2, 0.5, 0.0, 1.0, 10_000,
                   0.5, bins=None),
)

#: Where the quantile's asymptotic prediction is not reached (not in the tests): a small δ with a small
#: λ (the SE comparable to the doubling noise's scale √δ·λ·range) and δ = 0.01 with 10⁴ reports
#: (z·s ≈ 0.44: the DR CDF at ξ is known to ±0.44).
LIMIT_SETTINGS = (
    NumericSetting("N(0.5, 0.15²) in [0, 1], δ=0.05, λ=0.25, median", 0.05, 0.25, 0.0, 1.0, 10_000, 0.5,
                   {"data_sd": 0.15}),
    NumericSetting("N(0.5, 0.15²) in [0, 1], δ=0.05, λ=0.25, median", 0.05, 0.25, 0.0, 1.0, 100_000, 0.5,
                   {"data_sd": 0.15}),
    NumericSetting("N(0.5, 0.15²) in [0, 1], δ=0.01, λ=2, median", 0.01, 2.0, 0.0, 1.0, 10_000, 0.5,
                   {"data_sd": 0.15}),
    NumericSetting("N(0.5, 0.15²) in [0, 1], δ=0.01, λ=2, median", 0.01, 2.0, 0.0, 1.0, 100_000, 0.5,
                   {"data_sd": 0.15}),
)

FREQUENCY_SETTINGS = (
    FrequencySetting("uRR ε=1, k=4, s=2, sensitive p=0.2", "urr", 1.0, (0.1, 0.2, 0.3, 0.4), 2, 1, 5000),
    FrequencySetting("uRR ε=1, k=4, s=2, non-sensitive p=0.3", "urr", 1.0, (0.1, 0.2, 0.3, 0.4), 2, 2, 5000),
    FrequencySetting("uRAP ε=1, k=6, s=3, sensitive p=0.1", "urap", 1.0, (0.3, 0.1, 0.1, 0.2, 0.2, 0.1), 3, 1,
                     5000),
    FrequencySetting("uRAP ε=2, k=6, s=3, non-sensitive p=0.2", "urap", 2.0,
                     (0.3, 0.1, 0.1, 0.2, 0.2, 0.1), 3, 3, 5000),
)


# ---------------------------------------------------------------------------------------------
# simulation
# ---------------------------------------------------------------------------------------------


def numeric_schema(s: NumericSetting):
    """A schema with ``s.dim`` numeric fields; the setting's field is ``"x"`` (column ``dim // 2``),
    the others ``"o<i>"`` on [0, 1]."""
    from ingest.client.schema import TelemetrySchema

    fields = [{"name": f"o{i}", "low": 0.0, "high": 1.0} for i in range(s.dim)]
    fields[s.dim // 2] = {"name": "x", "low": s.low, "high": s.high}
    return TelemetrySchema.from_dict({"name": "planning", "version": 1, "numeric": {
        "zero_prob": s.zero_prob, "scale": s.scale, "fields": fields}})


def raw_values(s: NumericSetting, n: int, rng: np.random.Generator) -> np.ndarray:
    """Raw values (n, dim) under the setting's data assumption (the other fields uniform)."""
    x = rng.uniform(0.0, 1.0, (n, s.dim))
    j = s.dim // 2
    if s.population is not None:
        kind, shape, scale, shift = s.population
        if kind != "gamma":
            raise ValueError(f"unknown population {kind!r}")
        x[:, j] = rng.gamma(shape, scale, n) + shift
    elif "data_sd" in s.data:
        x[:, j] = rng.normal(s.data.get("data_mean", 0.5 * (s.low + s.high)), s.data["data_sd"], n)
    elif "data_sample" in s.data:
        x[:, j] = rng.choice(np.asarray(s.data["data_sample"], dtype=float), n)
    else:
        x[:, j] = rng.uniform(s.low, s.high, n)
    return x


@dataclass
class Simulated:
    """R simulated windows: the estimates and the half-widths the estimator reported."""

    estimates: np.ndarray
    halfwidths: np.ndarray

    @property
    def sd_halfwidth(self) -> float:
        """z_{0.975} × the SD of the estimates over the windows."""
        return Z95 * float(np.std(self.estimates, ddof=1))

    @property
    def reported_halfwidth(self) -> float:
        """The mean reported half-width."""
        return float(np.mean(self.halfwidths))


def simulate_numeric(s: NumericSetting, reps: int, rng: np.random.Generator) -> Simulated:
    """R windows of ``s.n`` reports through the aggregator's state (or ``dr_quantile``)."""
    from aggregator.state import build_state
    from ingest.client.batch import ReportBatch
    from mechanisms.estimation import dr_quantile

    schema = numeric_schema(s)
    zil = schema.zil_mechanism()
    j = s.dim // 2
    if isinstance(s.target, str):
        query = {"kind": "mean", "name": "m", "field": "x", "estimator": s.target}
    else:
        query = {"kind": "quantiles", "name": "q", "field": "x", "q": [s.target], "bins": s.bins or 2000}
    est, hw = np.empty(reps), np.empty(reps)
    for r in range(reps):
        x1 = zil.privatize(raw_values(s, s.n, rng), rng)
        x2 = zil.double(x1, rng)
        if s.bins is None and not isinstance(s.target, str):
            e = dr_quantile(x1[:, j], x2[:, j], s.target, s.zero_prob)
            est[r], hw[r] = e.theta[0], Z95 * e.stderr[0]
            continue
        e = build_state(query, schema).update(ReportBatch(schema.fingerprint, x1, {}), x2).estimate()
        est[r], hw[r] = e.value[0], 0.5 * (e.ci_high[0] - e.ci_low[0])
    return Simulated(est, hw)


def simulate_frequency(s: FrequencySetting, reps: int, rng: np.random.Generator) -> Simulated:
    """R windows of ``s.n`` reports through the aggregator's ``CountsState`` (empirical method)."""
    from aggregator.state import build_state
    from ingest.client.batch import ReportBatch
    from ingest.client.schema import TelemetrySchema

    cats = [f"v{i}" for i in range(s.k)]
    schema = TelemetrySchema.from_dict({"name": "planning", "version": 1, "categorical": [{
        "name": "c", "categories": cats, "sensitive": cats[:s.sensitive_size], "mechanism": s.mechanism,
        "epsilon": s.epsilon}]})
    mech = schema.categorical_mechanism("c")
    query = {"kind": "frequency", "name": "f", "field": "c", "method": "empirical"}
    est, hw = np.empty(reps), np.empty(reps)
    for r in range(reps):
        codes = rng.choice(s.k, s.n, p=np.asarray(s.p))
        batch = ReportBatch(schema.fingerprint, np.zeros((s.n, 0)), {"c": mech.privatize(codes, rng)})
        e = build_state(query, schema).update(batch).estimate()
        i = s.category
        est[r], hw[r] = e.value[i], 0.5 * (e.ci_high[i] - e.ci_low[i])
    return Simulated(est, hw)


def simulate(s, reps: int, rng: np.random.Generator) -> Simulated:
    """:func:`simulate_numeric` or :func:`simulate_frequency`, by the setting's type."""
    if isinstance(s, FrequencySetting):
        return simulate_frequency(s, reps, rng)
    return simulate_numeric(s, reps, rng)


def main(argv=None) -> None:
    from benchmarks._common import Timer, table, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000, help="replications per setting (default 4000)")
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args(argv)
    rows, records = [], []
    groups = (("mean", MEAN_SETTINGS), ("quantile", QUANTILE_SETTINGS), ("frequency", FREQUENCY_SETTINGS),
              ("quantile (limits)", LIMIT_SETTINGS))
    with Timer() as total:
        for g, (kind, settings) in enumerate(groups):
            for i, s in enumerate(settings):
                rng = np.random.default_rng([args.seed, g, i])
                with Timer() as t:
                    sim = simulate(s, args.reps, rng)
                pred, pred_sd = s.predicted(), s.predicted_sd()
                sd_hw, rep_hw = sim.sd_halfwidth, sim.reported_halfwidth
                rows.append([kind, s.label, s.n, pred_sd, sd_hw, f"{sd_hw / pred_sd - 1:+.1%}", pred, rep_hw,
                             f"{rep_hw / pred - 1:+.1%}"])
                info = dataclasses.asdict(s)
                if "data_sample" in info.get("data", {}):  # the pilot, not its 50000 values
                    info["data"] = {"data_sample": f"{PILOT.size} draws of {GAMMA}"}
                records.append({"kind": kind, **info, "predicted": pred, "predicted_sd": pred_sd,
                                "sd_halfwidth": sd_hw, "reported_halfwidth": rep_hw, "seconds": t.seconds})
    mc = 1 / np.sqrt(2 * (args.reps - 1))
    title = (f"95 % half-widths, {args.reps} windows per setting (MC SE of 1.96·SD ≈ {mc:.1%}), "
             f"{total.seconds:.0f} s")
    print(table(["query", "setting", "n", "predicted z·SE", "1.96·SD", "Δ", "predicted reported",
                 "mean reported", "Δ"],
                rows, title=title))
    path = write_json("planning", {"reps": args.reps, "seed": args.seed, "seconds": total.seconds,
                                   "rows": records})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
