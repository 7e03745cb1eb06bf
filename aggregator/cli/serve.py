"""``ldp-stream serve``: merged estimates over HTTP and Prometheus (docs/deploy.md)."""

from __future__ import annotations

import argparse
import logging
import sys

from aggregator.cli._extras import SERVER_MODULES, require_extra

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``serve`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "serve", help="merge partition checkpoints and serve estimates (HTTP JSON + /metrics)",
        description="Read the state topic, merge the latest checkpoint of every partition per "
                    "query and serve GET /estimates, /estimates/{query}, /privacy, /healthz (liveness), "
                    "/readyz (readiness), /metrics.")
    p.add_argument("--config", required=True, help="pipeline TOML file")
    p.add_argument("--host", default=None, help="bind address (default: [serve] host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default: [serve] port)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    require_extra("the serve command", "server", SERVER_MODULES)
    from aggregator.checkpoint import StateTopicReader
    from aggregator.config import PipelineConfig
    from aggregator.errors import CLIError
    from aggregator.plan import PipelineRuntime
    from aggregator.serve import EstimateStore, build_app, check_bindable, run_server
    from aggregator.topics import ensure_topics
    from aggregator.warm import announce_compile

    if args.host is not None and not args.host.strip():
        raise CLIError("--host must be an address to bind, got ''")
    cfg = PipelineConfig.load(args.config)
    cfg.require_queries("serve would have no estimates to publish")
    host = args.host or cfg.serve.host
    port = cfg.serve.port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise CLIError(f"--port must be in [0, 65535], got {port}")
    check_bindable(host, port)  # fail before touching Kafka
    if port == 0:  # a free port, chosen now so that it can be printed
        from ingest.local.processes import free_port

        port = free_port(host)
    announce_compile("ldp-stream serve")  # the states' kernels are compiled or loaded next
    runtime = PipelineRuntime.from_config(cfg)
    ensure_topics(cfg)
    reader = StateTopicReader.connect(cfg.kafka, cfg.topics.state, runtime.name, panes=True)
    store = EstimateStore(runtime, reader, refresh_interval_s=cfg.serve.refresh_interval_s,
                          stale_after_s=cfg.serve.stale_after_s, reports_topic=cfg.topics.reports,
                          window_idle_timeout_s=cfg.serve.window_idle_timeout_s).start()
    try:
        privacy = cfg.telemetry_schema.privacy_summary()
    except Exception as exc:  # a summary problem must not stop the estimates
        log.warning("privacy summary unavailable: %s", exc)
        privacy = {"error": "privacy summary unavailable"}
    app = build_app(store, privacy=privacy)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"ldp-stream serve: pipeline {runtime.name!r}, estimates on {url}/estimates (also "
          "/windows/{query}, /privacy, /healthz, /readyz, /metrics); Ctrl-C to stop",
          file=sys.stderr, flush=True)
    try:
        run_server(app, host=host, port=port)
    finally:
        store.stop()
    return 0
