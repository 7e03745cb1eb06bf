"""``ldp-stream privacy``: ZIL privacy accounting from the command line (docs/privacy.md §2–§3).

Subcommands:

* ``calibrate`` — the scale λ (and shift c) that makes ZIL(zero_prob, λ²I) (ε, δ)-DP.
* ``curve`` — draw the trade-off function with its (ε, δ̃) envelope lines to a PNG.
* ``guarantee`` — the plain-language guarantee of a given (zero_prob, scale, dim), or of a schema
  file for its privacy unit.
* ``compose`` — the (ε, δ) guarantee of T reports of one device, composed (docs/privacy.md §7).
* ``plan`` — parameters for a target per privacy unit, with predicted interval widths
  (:mod:`aggregator.cli.privacy_plan`, docs/privacy.md §8).

Parameter errors raised by :mod:`mechanisms.privacy` are ``ParameterError`` (a ``ValueError``);
``aggregator.cli.main`` prints them as one line and exits with status 2. Every numeric flag is
range-checked before any work (the upper limits below bound time and memory), and every number
the commands print is formatted with six significant digits (``:.6g``), whatever its magnitude.
"""

from __future__ import annotations

import argparse
import json
import logging
import math

from mechanisms.errors import ParameterError

log = logging.getLogger(__name__)

#: ε values of the envelope lines in ``curve`` (paper Fig. 1(a)).
DEFAULT_CURVE_EPSILONS = "0.5,0.7,0.9,1.2,1.6,2.1,2.8"

#: ``curve --points``: the PNG is 605 pixels wide, so 10⁴ points (≈ 5 s of β_c) are more than enough.
POINTS_RANGE = (11, 10_000)
#: ``curve --monte-carlo N`` (0 = off): the curve's standard error is ≈ 1/√N, 1e-3 at the top.
MONTE_CARLO_RANGE = (100, 1_000_000)
#: ``--monte-carlo × --dim``: float64 values per hypothesis sample (80 MB, a few seconds).
MONTE_CARLO_CELLS = 10_000_000
#: ``--dim``: the number of numeric fields of a report.
DIM_RANGE = (1, 1_000_000)
#: ``compose --reports``: the number of composed reports.
REPORTS_RANGE = (1, 100_000)
#: ``--epsilons``: at most this many values (envelope lines in the plot, pairs in the summary).
MAX_EPSILONS = 100


def _png_path(text: str) -> str:
    """``--png``: a path ending in ``.png`` (the file is always written as PNG)."""
    if not text.lower().endswith(".png") or not text[:-4].strip(" /"):
        raise argparse.ArgumentTypeError(f"must be a path ending in .png, got {text!r}")
    return text


def _epsilon_list(text: str) -> tuple[float, ...]:
    items = text.split(",")
    if text.strip() and any(not v.strip() for v in items):  # "1,,2": a missing value, not skipped
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0 without empty items, "
                                         f"got {text!r}")
    try:
        values = tuple(float(v) + 0.0 for v in items if v.strip())  # + 0.0: -0 is 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, got {text!r}") from None
    if not values or any(not (math.isfinite(v) and v >= 0) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated finite numbers >= 0, got {text!r}")
    if len(values) > MAX_EPSILONS:
        raise argparse.ArgumentTypeError(f"at most {MAX_EPSILONS} values, got {len(values)}")
    return values


def _given(x: float) -> str:
    """A parameter as the user gave it: the shortest text that reads back as the same float
    (``:.12g`` printed δ = 0.9999999999999999 as 1), ``-0.0`` as ``0``, integers without ``.0``."""
    x = float(x) + 0.0  # -0.0 + 0.0 is +0.0
    return f"{x:.0f}" if x.is_integer() and abs(x) < 1e16 else repr(x)


def _check_range(flag: str, value: int | None, bounds: tuple[int, int]) -> None:
    """Raise ``ParameterError`` naming ``flag`` unless ``value`` is None or within ``bounds``."""
    lo, hi = bounds
    if value is not None and not lo <= value <= hi:
        raise ParameterError(f"{flag} must be in [{lo}, {hi}], got {value}")


def register(subparsers) -> None:
    """Add the ``privacy`` subcommand (with ``calibrate``, ``curve``, ``guarantee``)."""
    p = subparsers.add_parser(
        "privacy",
        help="ZIL privacy accounting: calibrate the scale, plot trade-off curves, explain guarantees",
        description="Privacy accounting of the ZIL mechanism in f-DP (Dong-Roth-Su): calibration of "
        "the noise scale to a target (epsilon, delta), trade-off curves and guarantees.",
    )
    p.set_defaults(func=lambda args: _help(p))
    sub = p.add_subparsers(dest="privacy_command", metavar="ACTION")

    cal = sub.add_parser(
        "calibrate",
        help="scale so that ZIL is (epsilon, delta)-DP",
        description="Solve delta~_{c,zero_prob}(epsilon) = delta for c and print c and "
        "scale = diameter / c. Needs delta > zero_prob.",
    )
    cal.add_argument("--epsilon", type=float, required=True, help="target epsilon >= 0")
    cal.add_argument("--delta", type=float, required=True, help="target delta in (zero_prob, 1)")
    cal.add_argument(
        "--zero-prob",
        type=float,
        required=True,
        help="probability in (0, 1) that a report is released exactly (no noise)",
    )
    cal.add_argument(
        "--diameter",
        type=float,
        required=True,
        help="diameter of the protected set in standardized units: sqrt(d) for whole reports of d "
        "fields (record level), 1 for one field (attribute level)",
    )
    cal.add_argument(
        "--dim",
        type=int,
        default=None,
        help="number of fields d; 1 uses the exact Laplace accounting, otherwise the beta_c bound "
        "(valid for every d) is used",
    )
    cal.add_argument("--json", action="store_true", help="print one JSON object")
    cal.set_defaults(func=run_calibrate)

    cur = sub.add_parser(
        "curve",
        help="draw the trade-off function and its (epsilon, delta~) envelopes to a PNG",
        description="Plot T_{d,c,zero_prob} (exact for --dim 1, the beta_c bound otherwise) with "
        "the f_{epsilon, delta~(epsilon)} envelope lines.",
    )
    cur.add_argument("--c", type=float, required=True, help="shift c = diameter / scale > 0")
    cur.add_argument("--zero-prob", type=float, required=True, help="zero probability in (0, 1)")
    cur.add_argument("--dim", type=int, default=None, help="number of fields (1 = exact Laplace)")
    cur.add_argument("--png", required=True, type=_png_path, help="output PNG path (*.png)")
    cur.add_argument(
        "--epsilons",
        type=_epsilon_list,
        default=_epsilon_list(DEFAULT_CURVE_EPSILONS),
        help=f"comma-separated epsilons of the envelope lines (default {DEFAULT_CURVE_EPSILONS})",
    )
    cur.add_argument(
        "--monte-carlo",
        type=int,
        default=0,
        metavar="N",
        help="also draw a Monte Carlo T_{dim,c,zero_prob} with N samples per hypothesis (needs --dim; "
        f"N in [{MONTE_CARLO_RANGE[0]}, {MONTE_CARLO_RANGE[1]}], N times --dim at most {MONTE_CARLO_CELLS})",
    )
    cur.add_argument("--seed", type=int, default=None, help="seed of the Monte Carlo curve")
    cur.add_argument(
        "--points",
        type=int,
        default=301,
        help=f"points on the curve, {POINTS_RANGE[0]} to {POINTS_RANGE[1]} (default 301)",
    )
    cur.set_defaults(func=run_curve)

    gua = sub.add_parser(
        "guarantee",
        help="explain the guarantee of a (zero_prob, scale, dim) configuration",
        description="Record- and attribute-level (epsilon, delta~) guarantees of ZIL noise on the "
        "standardized box [0, 1]^dim.",
    )
    gua.add_argument("--schema", default=None, metavar="FILE",
                     help="a schema TOML file: print its guarantees per report and for its [privacy] "
                     "unit (instead of --zero-prob/--scale/--dim)")
    gua.add_argument("--zero-prob", type=float, default=None, help="zero probability in (0, 1)")
    gua.add_argument("--scale", type=float, default=None, help="noise scale per unit of range > 0")
    gua.add_argument("--dim", type=int, default=None, help="number of numeric fields >= 1")
    gua.add_argument("--epsilons", type=_epsilon_list, default=None, help="comma-separated epsilons")
    gua.add_argument("--json", action="store_true", help="print one JSON object")
    gua.set_defaults(func=run_guarantee)

    com = sub.add_parser(
        "compose",
        help="the (epsilon, delta) guarantee of T reports of one device, composed",
        description="Compose the per-report ZIL guarantee over --reports reports with the "
        "privacy-loss-distribution accountant of dp-accounting: exact for --dim 1 (Laplace plus "
        "the point mass of exact releases), the conservative beta_c bound otherwise. Every delta "
        "printed is an upper bound; none is below the probability that one of the reports is "
        "released exactly.",
    )
    com.add_argument("--zero-prob", type=float, required=True, help="zero probability in (0, 1)")
    com.add_argument("--scale", type=float, required=True, help="noise scale per unit of range > 0")
    com.add_argument("--diameter", type=float, default=1.0,
                     help="diameter of the protected set in standardized units: sqrt(d) for whole "
                     "reports of d fields, 1 (default) for one field")
    com.add_argument("--dim", type=int, default=None,
                     help="number of fields d; 1 uses the exact Laplace accounting, otherwise the "
                     "beta_c bound (valid for every d)")
    com.add_argument("--reports", type=int, required=True,
                     help=f"number of reports T, {REPORTS_RANGE[0]} to {REPORTS_RANGE[1]}")
    com.add_argument("--epsilons", type=_epsilon_list, default=None,
                     help="comma-separated epsilons (default 1,2,4,8,16)")
    com.add_argument("--json", action="store_true", help="print one JSON object")
    com.set_defaults(func=run_compose)

    from aggregator.cli import privacy_plan

    privacy_plan.register(sub)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_calibrate(args: argparse.Namespace) -> int:
    """Print ``c`` and ``scale`` for the target (ε, δ); ``--json`` prints one JSON object.

    Returns
    -------
    int
        0. Impossible targets raise ``ParameterError`` (exit 2 through ``main``).
    """
    from mechanisms.privacy import calibrate_c, calibrate_zil, delta_for_epsilon

    if not (math.isfinite(args.diameter) and args.diameter > 0):
        raise ParameterError(f"diameter must be a finite number > 0, got {args.diameter}")
    _check_range("--dim", args.dim, DIM_RANGE)
    c = calibrate_c(args.epsilon, args.delta, args.zero_prob, args.dim)
    scale = calibrate_zil(args.epsilon, args.delta, args.zero_prob, args.diameter, args.dim)  # range-checked
    accounting = "exact_laplace" if args.dim == 1 else "beta_c_bound"
    check = float(delta_for_epsilon(args.epsilon, c, args.zero_prob, 1 if args.dim == 1 else None))
    if args.json:
        print(
            json.dumps(
                {
                    "c": c,
                    "scale": scale,
                    "epsilon": args.epsilon,
                    "delta": args.delta,
                    "zero_prob": args.zero_prob,
                    "diameter": args.diameter,
                    "dim": args.dim,
                    "accounting": accounting,
                    "delta_tilde_check": check,
                },
                allow_nan=False,
            )
        )
        return 0
    how = (
        "exact one-dimensional (Laplace) accounting"
        if args.dim == 1
        else "beta_c bound, valid for any number of fields"
    )
    print(f"c = {c:.6g}")
    print(f"scale = {scale:.6g}")
    print(
        # the user's parameters as given (_given)
        f"ZIL(zero_prob={_given(args.zero_prob)}, scale={scale:.6g}) over diameter "
        f"{_given(args.diameter)} is ({_given(args.epsilon)}, {_given(args.delta)})-DP ({how}); "
        f"{100 * args.zero_prob:.12g}% of reports are released exactly, without noise."
    )
    return 0


def run_curve(args: argparse.Namespace) -> int:
    """Draw the trade-off curve and its envelope lines to ``args.png``; print the (ε, δ̃) table.

    Returns
    -------
    int
        0.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from mechanisms.privacy import delta_for_epsilon, tradeoff_epsilon_delta, tradeoff_zil

    _check_range("--points", args.points, POINTS_RANGE)
    _check_range("--dim", args.dim, DIM_RANGE)
    if args.monte_carlo:
        lo, hi = MONTE_CARLO_RANGE
        if not lo <= args.monte_carlo <= hi:
            raise ParameterError(
                f"--monte-carlo must be 0 (no Monte Carlo curve) or in [{lo}, {hi}], got {args.monte_carlo}"
            )
        if args.dim is None:
            raise ParameterError("--monte-carlo needs --dim (the dimension to simulate)")
        if args.monte_carlo * args.dim > MONTE_CARLO_CELLS:
            raise ParameterError(
                f"--monte-carlo times --dim must be at most {MONTE_CARLO_CELLS} (memory), got "
                f"{args.monte_carlo} * {args.dim} = {args.monte_carlo * args.dim}"
            )
    if args.seed is not None and args.seed < 0:
        raise ParameterError(f"--seed must be an integer >= 0, got {args.seed}")
    alpha = np.linspace(0.0, 1.0, args.points)
    curve = tradeoff_zil(alpha, args.c, args.zero_prob, args.dim)
    exact = args.dim == 1
    dim_arg = 1 if exact else None
    eps = np.asarray(args.epsilons, dtype=float)
    dts = delta_for_epsilon(eps, args.c, args.zero_prob, dim_arg)

    fig, ax = plt.subplots(figsize=(5.5, 5.5), dpi=110)
    ax.plot(alpha, 1.0 - alpha, color="tab:cyan", lw=1, ls="--", label="1 − α (no information)")
    for k, (e, d) in enumerate(zip(eps, dts)):
        ax.plot(
            alpha,
            tradeoff_epsilon_delta(alpha, float(e), float(d)),
            color="black",
            lw=0.7,
            label="(ε, δ̃(ε)) envelopes" if k == 0 else None,
        )
    sub = f"{args.c:g},{args.zero_prob:g}"
    name = f"$T_{{1,{sub}}}$ (exact, d = 1)" if exact else f"$\\beta_{{{sub}}}$ (bound, any d)"
    ax.plot(alpha, curve, color="tab:blue", lw=2, label=name)
    if args.monte_carlo:
        mc = tradeoff_zil(
            alpha, args.c, args.zero_prob, args.dim, method="monte_carlo", rng=args.seed, n=args.monte_carlo
        )
        label = f"$T_{{{args.dim},{sub}}}$ Monte Carlo (n = {args.monte_carlo})"
        ax.plot(alpha, mc, color="tab:green", lw=1.2, label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("type I error α")
    ax.set_ylabel("type II error β")
    ax.set_title(f"ZIL trade-off, c = {args.c:g}, zero_prob = {args.zero_prob:g}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(args.png, format="png")
    finally:
        plt.close(fig)
    print(f"wrote {args.png}")
    print("    epsilon  delta_tilde")
    for e, d in zip(eps, dts):
        print(f"{e:11.6g}  {d:.6g}")
    return 0


def run_guarantee(args: argparse.Namespace) -> int:
    """Print the guarantee of a configuration (``ZILGuarantee.summary``) or of a schema file.

    With ``--schema`` the output is the schema's privacy summary for its ``[privacy]`` unit:
    per-report statements and, for a device unit, the composed ones (``--json``: the dict of
    ``TelemetrySchema.privacy_summary``).

    Returns
    -------
    int
        0. Missing or conflicting flags raise ``ParameterError`` (exit 2 through ``main``).
    """
    if args.schema is not None:
        if any(v is not None for v in (args.zero_prob, args.scale, args.dim)):
            raise ParameterError("give either --schema or --zero-prob/--scale/--dim, not both")
        from ingest.client.schema import TelemetrySchema

        summary = TelemetrySchema.load(args.schema).privacy_summary()
        print(json.dumps(summary, allow_nan=False) if args.json else _schema_text(summary))
        return 0
    missing = [f for f, v in (("--zero-prob", args.zero_prob), ("--scale", args.scale), ("--dim", args.dim))
               if v is None]
    if missing:
        raise ParameterError(f"guarantee needs --schema FILE or all of --zero-prob, --scale, --dim "
                             f"(missing {', '.join(missing)})")
    from mechanisms.privacy import DEFAULT_EPSILONS, zil_guarantee

    _check_range("--dim", args.dim, DIM_RANGE)
    g = zil_guarantee(args.zero_prob, args.scale, args.dim, args.epsilons or DEFAULT_EPSILONS)
    print(json.dumps(g.to_dict(), allow_nan=False) if args.json else g.summary())
    return 0


def _pairs(rows) -> str:
    return ", ".join(f"({r['epsilon']:.6g}, {r['delta']:.6g})" for r in rows)


def _schema_text(summary: dict) -> str:
    """The plain-language form of ``TelemetrySchema.privacy_summary()``."""
    unit = summary["unit"]
    lines = [f"Schema {summary['schema']!r} v{summary['version']}: {unit['statement']}."]
    num = summary["numeric"]
    if num is not None:
        lines.append(f"* Numeric fields {', '.join(num['fields'])}: {num['statement']}")
        comp = num.get("composed")
        if comp is not None:
            lines.append(f"* Numeric fields over {comp['reports']} reports per {unit['period']} "
                         f"(composed, {comp['accounting']}): {comp['exact_release_statement']}. "
                         f"Whole reports: (epsilon, delta) {_pairs(comp['record'])}; one field: "
                         f"{_pairs(comp['attribute'])}.")
    for name, c in summary["categorical"].items():
        line = f"* {name} ({c['mechanism']}): {c['guarantee']} per report"
        if "composed" in c:
            line += (f"; over {c['composed']['reports']} reports per {unit['period']}: (epsilon, delta) "
                     f"{_pairs(c['composed']['epsilon_delta'])} for sensitive values")
        lines.append(line + ".")
    lines.append(f"* Event time: {summary['event_time']['statement']}.")
    return "\n".join(lines)


def run_compose(args: argparse.Namespace) -> int:
    """Print the composed guarantee of ``--reports`` reports (``--json``: one JSON object).

    Returns
    -------
    int
        0. Bad arguments raise ``ParameterError`` (exit 2 through ``main``).
    """
    from mechanisms.privacy.composition import compose_zil

    _check_range("--dim", args.dim, DIM_RANGE)
    _check_range("--reports", args.reports, REPORTS_RANGE)
    g = compose_zil(args.zero_prob, args.scale, diameter=args.diameter, dim=args.dim,
                    reports=args.reports, epsilons=args.epsilons)
    if args.json:
        print(json.dumps(g.to_dict(), allow_nan=False))
        return 0
    how = ("exact one-field (Laplace) accounting" if g.accounting == "exact_laplace"
           else "beta_c bound, valid for any number of fields")
    print(f"{g.reports} report(s) of ZIL(zero_prob={_given(args.zero_prob)}, scale={args.scale:.6g}) "
          f"over diameter {_given(args.diameter)}, composed ({how}):")
    print(f"at least one report is released exactly with probability {g.exact_release_prob:.6g}")
    print("    epsilon  delta")
    for e, d in zip(g.epsilons, g.deltas):
        print(f"{e:11.6g}  {d:.6g}")
    return 0
