"""``ldp-stream privacy plan``: a schema's privacy parameters for a target per privacy unit, with
the interval half-widths they will give (``ingest.client.planner``; docs/privacy.md §8)."""

from __future__ import annotations

import argparse
import json
import math

from mechanisms.errors import ParameterError

#: ``--reports-per-window``: the predictions need at least two reports; beyond 10¹² they are moot.
WINDOW_RANGE = (2, 10**12)


def _sd_map(text: str) -> dict[str, float]:
    """``--data-sd arr_delay=45,distance=730`` → ``{"arr_delay": 45.0, "distance": 730.0}``."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not sep or not name.strip() or not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"expected FIELD=SD pairs with SD > 0, separated by commas, "
                                             f"got {item!r}")
        out[name.strip()] = v
    return out


def register(sub) -> None:
    """Add ``plan`` to the ``privacy`` subcommands."""
    from ingest.client.planner import OPTIMIZE

    p = sub.add_parser(
        "plan",
        help="recommend zero_prob, scale and categorical epsilons for a target (epsilon, delta) per "
        "privacy unit, and predict the interval widths",
        description="For the fields of --schema and a target (epsilon, delta) for its privacy unit "
        "(composed over the unit's reports_per_period, or --reports), recommend the numeric "
        "zero_prob and scale and each categorical field's epsilon, and predict the 95%% half-width "
        "of a mean, a median and a category's frequency after --reports-per-window reports. The "
        "budget is split evenly in epsilon across the numeric block and each categorical field "
        "(90%% of delta to the numeric block).",
    )
    p.add_argument("--schema", required=True, metavar="FILE", help="the schema TOML file (fields and bounds)")
    p.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0 for one unit")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1) for one unit")
    p.add_argument("--reports-per-window", type=int, required=True, metavar="N",
                   help=f"expected reports per window ({WINDOW_RANGE[0]} or more): the predictions are for "
                   "one window")
    p.add_argument("--reports", type=int, default=None, metavar="T",
                   help="reports composed per unit (default: the schema's [privacy] reports_per_period, 1 "
                   "for unit = \"event\")")
    p.add_argument("--zero-prob", type=float, default=None,
                   help="fix zero_prob instead of searching below the exact-release floor")
    p.add_argument("--data-sd", type=_sd_map, default=None, metavar="FIELD=SD,...",
                   help="typical standard deviations of numeric fields (original units); default: values "
                   "uniform on their box")
    p.add_argument("--optimize", choices=OPTIMIZE, default="balanced",
                   help="what the zero_prob search minimises: the mean's and median's half-widths together "
                   "(balanced, default), the median's or the mean's")
    p.add_argument("--write-schema", default=None, metavar="OUT",
                   help="also write the schema with the recommended parameters to OUT (TOML)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_plan)


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _text(plan: dict) -> str:
    tg, num = plan["target"], plan["numeric"]
    lines = [f"Target: ({tg['epsilon']:.6g}, {tg['delta']:.6g})-DP per {tg['unit']} over {tg['reports']} "
             f"report(s); predictions for {plan['n']:,} reports per window, 95 % intervals "
             f"({plan['assumption']}).",
             f"Budget: epsilon {plan['split']['epsilon_each']:.6g} to each of {plan['split']['groups']} "
             "mechanism(s); they add up (basic composition)."]
    if num is not None:
        lines += ["", f"Numeric block ({num['dim']} fields, {num['accounting']}): "
                  f"zero_prob = {num['zero_prob']:.4g}, scale = {num['scale']:.6g} "
                  f"(epsilon {num['epsilon']:.6g}, delta {num['delta']:.6g}; "
                  f"P(an exact release among the reports) = {num['exact_release_prob']:.4g})", "",
                  _row(["field", "box", "mean ± (half-width)", "median ± (half-width)"]), _row(["---"] * 4)]
        for name, f in num["fields"].items():
            unit = f" {f['unit']}" if f["unit"] else ""
            lines.append(_row([name, f"[{f['low']:g}, {f['high']:g}]", f"{f['mean_halfwidth']:.4g}{unit}",
                               f"{f['median_halfwidth']:.4g}{unit}"]))
        lines += ["", f"zero_prob candidates (optimize = {num['optimize']}; half-widths / range, "
                  "averaged over the fields):", "",
                  _row(["zero_prob", "scale", "mean", "median"]), _row(["---"] * 4)]
        for r in num["candidates"]:
            lines.append(_row([f"{r['zero_prob']:.4g}", f"{r['scale']:.4g}",
                               f"{r['mean_halfwidth_per_range']:.3g}",
                               f"{r['median_halfwidth_per_range']:.3g}"]))
    if plan["categorical"]:
        lines += ["", _row(["categorical field", "mechanism", "epsilon per report", "± sensitive category",
                            "± non-sensitive category"]), _row(["---"] * 5)]
        for name, c in plan["categorical"].items():
            non = "—" if c["halfwidth_non_sensitive"] is None else f"{c['halfwidth_non_sensitive']:.3g}"
            lines.append(_row([name, c["mechanism"], f"{c['epsilon']:.4g}",
                               f"{c['halfwidth_sensitive']:.3g}", non]))
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan (``--json``: ``ingest.client.planner.plan_schema``'s dict); ``--write-schema``
    writes the schema with the recommended parameters.

    Returns
    -------
    int
        0. Bad arguments or an unreachable target raise ``ParameterError`` (exit 2).
    """
    from ingest.client.planner import plan_schema, planned_schema
    from ingest.client.schema import TelemetrySchema

    lo, hi = WINDOW_RANGE
    if not lo <= args.reports_per_window <= hi:
        raise ParameterError(f"--reports-per-window must be in [{lo}, {hi}], got {args.reports_per_window}")
    schema = TelemetrySchema.load(args.schema)
    plan = plan_schema(schema, args.epsilon, args.delta, n=args.reports_per_window, reports=args.reports,
                       zero_prob=args.zero_prob, data_sd=args.data_sd, optimize=args.optimize)
    if args.write_schema:
        from pathlib import Path

        try:
            Path(args.write_schema).write_text(planned_schema(schema, plan).dumps_toml())
        except OSError as exc:
            raise ParameterError(f"--write-schema: cannot write {args.write_schema!r}: "
                                 f"{exc.strerror}") from None
    print(json.dumps(plan, allow_nan=False) if args.json else _text(plan))
    return 0
