"""``ldp-stream work``: run one exactly-once consumer-group worker (docs/reliability.md §1)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from aggregator.cli._extras import SERVER_MODULES, require_extra

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``work`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "work", help="consume reports in a consumer group, checkpoint state + offsets",
        description="Consume the reports topic in a consumer group, keep per-partition query "
                    "state, checkpoint it to the state topic, then commit offsets (exactly-once). "
                    "SIGTERM/SIGINT: final checkpoint, then leave the group; exit status 1 if the "
                    "final checkpoint failed (the next start replays from the last one); exit "
                    "status 2 with the error if a state update failed (no checkpoint follows it). "
                    "A signal during start-up stops "
                    "it with exit status 0 (nothing consumed yet).")
    p.add_argument("--config", required=True, help="pipeline TOML file")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Prometheus metrics on 127.0.0.1:PORT (default [worker] metrics_port; 0 = off)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics bind address (default 127.0.0.1)")
    p.add_argument("--group-id", default=None,
                   help="consumer group (default: [worker] group_id). Positions come from the state "
                        "topic's checkpoints (keyed by pipeline and partition), not from the group: "
                        "a new group id continues where the pipeline stopped")
    p.add_argument("--max-reports", type=int, default=None,
                   help="stop after processing this many reports (tests, demo)")
    p.add_argument("--exit-when-idle", type=float, default=None, metavar="S",
                   help="stop once caught up and idle for S seconds (tests, demo)")
    p.add_argument("--max-poll-records", type=int, default=None,
                   help="records per poll (default 5000 = aggregator.worker.DEFAULT_MAX_POLL_RECORDS)")
    p.add_argument("--no-coalesce", action="store_true",
                   help="update states record by record (bit-identical replays; slower for tiny records)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT, ``--max-reports`` or ``--exit-when-idle``.

    A signal during start-up (imports, kernel compilation, connecting, creating topics — seconds
    before the first poll) stops it too, with one line and exit status 0: nothing was consumed,
    so there is nothing to checkpoint."""
    require_extra("the work command", "server", SERVER_MODULES)
    from aggregator.errors import StoppedDuringStartup

    def _early(signum, frame):
        raise StoppedDuringStartup(signum)

    old = {s: signal.signal(s, _early) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run(args, old)
    except StoppedDuringStartup as exc:
        print(f"ldp-stream work: stopped by {signal.Signals(exc.args[0]).name} during start-up; "
              "nothing was consumed", file=sys.stderr)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(args: argparse.Namespace, old_handlers: dict) -> int:
    from aggregator.config import PipelineConfig
    from aggregator.errors import CLIError
    from aggregator.metrics import WorkerMetrics, start_metrics_server
    from aggregator.warm import announce_compile
    from aggregator.worker import DEFAULT_MAX_POLL_RECORDS, ensure_topics, worker_from_config

    if args.max_reports is not None and args.max_reports < 1:
        raise CLIError(f"--max-reports must be >= 1, got {args.max_reports}")
    if args.exit_when_idle is not None and not args.exit_when_idle > 0:
        raise CLIError(f"--exit-when-idle must be > 0 seconds, got {args.exit_when_idle}")
    if not args.metrics_host.strip():
        raise CLIError("--metrics-host must be an address to bind, got ''")
    if args.group_id is not None and not args.group_id.strip():
        raise CLIError(f"--group-id must be a non-empty string, got {args.group_id!r}")
    max_poll = DEFAULT_MAX_POLL_RECORDS if args.max_poll_records is None else args.max_poll_records
    if max_poll < 1:
        raise CLIError(f"--max-poll-records must be >= 1, got {max_poll}")
    cfg = PipelineConfig.load(args.config)
    cfg.require_queries("a worker would consume reports without estimating anything")
    announce_compile("ldp-stream work")  # the states' kernels are compiled or loaded next
    metrics = WorkerMetrics()
    worker = worker_from_config(cfg, group_id=args.group_id, metrics=metrics,
                                coalesce=not args.no_coalesce, max_poll_records=max_poll)
    port = cfg.worker.metrics_port if args.metrics_port is None else args.metrics_port
    if port < 0 or port > 65535:
        raise CLIError(f"--metrics-port must be in [0, 65535], got {port}")
    server = None
    if port:
        server, _ = start_metrics_server(metrics.registry, port, host=args.metrics_host)
    ensure_topics(cfg)
    metrics_at = (f"; metrics on http://{args.metrics_host}:{server.server_port}/metrics"
                  if server is not None else "")
    group = args.group_id or cfg.worker.group_id
    print(f"ldp-stream work: group {group!r}, reports topic {cfg.topics.reports!r}{metrics_at}; "
          "Ctrl-C or SIGTERM for a final checkpoint and a clean leave", file=sys.stderr, flush=True)

    def _stop(signum, frame):
        log.info("signal %d: final checkpoint and leaving the group", signum)
        worker.stop()

    for s in old_handlers:  # from here a signal means: final checkpoint, leave, exit
        signal.signal(s, _stop)
    try:
        n = worker.run(max_reports=args.max_reports, exit_when_idle=args.exit_when_idle)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if server is not None:
            server.shutdown()
    print(f"ldp-stream work: processed {n} reports; partitions owned when it stopped: "
          f"{worker.owned_at_stop or 'none'}")
    if worker.final_checkpoint_failed:
        print("ldp-stream work: the final checkpoint failed (see the log); the next start replays "
              "from the last checkpoint", file=sys.stderr)
        return 1
    return 0
