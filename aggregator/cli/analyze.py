"""``ldp-stream analyze``: batch re-analysis of the stored reports at no extra privacy cost."""

from __future__ import annotations

import argparse
import json
import logging
import re

from aggregator.cli._extras import SERVER_MODULES, require_extra

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``analyze`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "analyze", help="replay the reports topic and fit queries or any loss in batch",
        description="Replay the reports topic from the beginning (to its high watermark) and run the "
                    "exact batch M-estimation (DR/SDR, sandwich CI) of configured queries or of any "
                    "loss — reports are already private, so re-analysis costs no privacy.")
    p.add_argument("--config", required=True, help="pipeline TOML file")
    p.add_argument("--query", action="append", default=None, metavar="NAME",
                   help="a configured query to re-fit (repeatable; default: all)")
    p.add_argument("--loss", default=None, metavar="MODULE:CALLABLE",
                   help="a custom loss object or factory (mechanisms.losses.Loss)")
    p.add_argument("--fields", default=None, help="comma-separated numeric fields (columns) for --loss")
    p.add_argument("--estimator", default="dr", choices=["dr", "sdr", "sl", "naive"],
                   help="corrected loss for --loss (default dr)")
    p.add_argument("--window", default=None, metavar="SIZE",
                   help="re-fit every query per event-time window of this size (30s, 15m, 1h, 1d, 7d; "
                        "aligned to the Unix epoch, UTC); default: a windowed query's own window, "
                        "the others over all reports")
    p.add_argument("--hop", default=None, metavar="HOP",
                   help="with --window: hopping windows starting every HOP (SIZE a multiple of it)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to read the topic (default 120)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.6g}"


def run(args: argparse.Namespace) -> int:
    """Replay and print the analyses; exit 2 on a configuration error, 1 if a query could not be
    fitted (the others are still printed)."""
    require_extra("the analyze command", "server", SERVER_MODULES)
    from aggregator.analyze import analyze_loss, analyze_query, analyze_windows, replay
    from aggregator.config import PipelineConfig, check_loss_fields, load_custom_loss
    from aggregator.errors import AggregatorError, CLIError
    from aggregator.plan import PipelineRuntime
    from mechanisms.errors import MechanismError

    if (args.loss is None) != (args.fields is None):
        raise CLIError("--loss and --fields go together")
    if args.loss is not None and not re.fullmatch(r"[^:\s]+:[^:\s]+", args.loss):
        raise CLIError(f"--loss must look like 'package.module:callable', got {args.loss!r}")
    if not args.timeout > 0:
        raise CLIError(f"--timeout must be > 0 seconds, got {args.timeout}")
    window = _window_arg(args.window, args.hop)
    cfg = PipelineConfig.load(args.config)
    if args.loss is None:
        cfg.require_queries("nothing to analyze; pass --loss MODULE:CALLABLE --fields F1,F2 to fit a loss")
    queries = [cfg.query(n) for n in args.query] if args.query else list(cfg.queries)
    if args.loss and args.query is None:
        queries = []
    loss = load_custom_loss(args.loss, key="--loss") if args.loss is not None else None
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields is not None else []
    if loss is not None:  # before the replay, which can take minutes
        check_loss_fields(loss, fields, cfg.telemetry_schema, key="--fields", loss_name=args.loss,
                          estimator=args.estimator)
    from ingest.kafka.clients import reachable

    runtime = PipelineRuntime.from_config(cfg)  # its states' own checks, before any broker contact
    if not reachable(cfg.kafka):
        raise CLIError(f"no Kafka broker reachable at {cfg.kafka.bootstrap}")
    rep = replay(runtime, cfg.kafka, cfg.topics.reports, timeout_s=args.timeout,
                 max_event_time_skew_s=cfg.worker.max_event_time_skew_s)
    results = []
    for q in queries:  # one query that cannot be fitted (yet) must not hide the others
        try:
            if window is not None or q.window is not None:
                results.append(analyze_windows(rep, runtime, q, window))
            else:
                results.append(analyze_query(rep, runtime, q))
        except (AggregatorError, MechanismError, ValueError, ArithmeticError) as exc:
            results.append({"query": q.name, "error": str(exc)})
    if loss is not None:
        results.append(analyze_loss(rep, runtime, loss, fields, method=args.estimator, name=args.loss))
    if args.json:
        print(json.dumps({"reports": rep.n, "records": rep.records, "skipped": rep.skipped,
                          "analyses": results}, indent=2))
        return 1 if any("error" in r for r in results) else 0
    print(f"{rep.n} reports in {rep.records} records (undecodable: {sum(rep.skipped.values())})")
    for r in results:
        if "windows" in r:
            w = r["window"]
            print(f"\n{r['query']}  per window of {w['size_s']} s (hop {w['hop_s']} s): "
                  f"{len(r['windows'])} windows")
            for row in r["windows"]:
                _print_fit(row, indent="    ", title=f"  {row['start']} … {row['end']}")
            continue
        _print_fit(r, indent="  ", title=r["query"], blank=True)
    return 1 if any("error" in r for r in results) else 0


def _print_fit(r: dict, *, indent: str, title: str, blank: bool = False) -> None:
    """One fit (or its error) as a few lines of text."""
    lead = "\n" if blank else ""
    if "error" in r:
        print(f"{lead}{title}  not estimable: {r['error']}")
        return
    print(f"{lead}{title}  [{r.get('estimator')}, n={r['n']}, {100 * r['level']:g} % CI]")
    for i, p in enumerate(r["params"]):
        print(f"{indent}{p:>20}  {_fmt(r['value'][i])}  ± {_fmt(r['stderr'][i])}  "
              f"[{_fmt(r['ci_low'][i])}, {_fmt(r['ci_high'][i])}]")


def _window_arg(size: str | None, hop: str | None):
    """The ``WindowSpec`` of ``--window``/``--hop`` (None without ``--window``); one-line
    :class:`CLIError` for a bad value."""
    from pydantic import ValidationError

    from aggregator.errors import CLIError
    from aggregator.queries import WindowSpec, format_validation_error

    if size is None:
        if hop is not None:
            raise CLIError("--hop needs --window")
        return None
    try:
        return WindowSpec(size=size, hop=hop)
    except ValidationError as exc:  # the first message, one line
        key, _, msg = format_validation_error(exc).partition(": ")
        raise CLIError(f"--{'hop' if key == 'hop' else 'window'}: {msg}") from None
