"""``ldp-stream collect``: the HTTP collector (docs/collector.md), and ``ldp-stream
collect-token``: mint a token for it (docs/collector.md §5)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from aggregator.cli._extras import require_extra

log = logging.getLogger(__name__)

#: what ``collect`` needs of the ``server`` extra
COLLECT_MODULES = ("prometheus_client", "starlette", "uvicorn")


def register(subparsers) -> None:
    """Add the ``collect`` and ``collect-token`` subcommands to ``subparsers``."""
    p = subparsers.add_parser(
        "collect", help="HTTP collector: devices POST report batches, forwarded to the reports topic",
        description="Accept POST /v1/reports from devices (bearer token of [collector] token_file, "
                    "Idempotency-Key, one wire record per body), check and decode each body as the "
                    "workers do and refuse with 422 what they would dead-letter (with windowed "
                    "queries also event times more than [worker] max_event_time_skew_s ahead of "
                    "this host's clock), forward it once to the reports topic of the pipeline and "
                    "answer 202 after Kafka acknowledged it. Every error is JSON {error, reason}. "
                    "Also GET /healthz, /readyz (200 while the broker answers a request within "
                    "ack_timeout_s), /metrics. Settings: [collector], [kafka], [topics] of the "
                    "pipeline file (docs/collector.md). SIGTERM or Ctrl-C stops accepting, waits "
                    "for acknowledgements and flushes.")
    p.add_argument("--config", required=True,
                   help="pipeline TOML file; its [collector] token_file is required (relative to the "
                        "pipeline file; mint tokens with collect-token --config)")
    p.add_argument("--host", default=None, help="bind address (default: [collector] host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None,
                   help="TCP port (default: [collector] port, 8090; 0 = a free port)")
    p.set_defaults(func=run)

    t = subparsers.add_parser(
        "collect-token", help="mint a collector token: append its hash to the token file, print it once",
        description="Create a random token (256 bits), append 'ID sha256:HASH [EXPIRES]' to the token "
                    "file (created with mode 0600; an existing one must be private and valid) and "
                    "print the token once on stdout; stderr says which file. The file is the "
                    "pipeline's [collector] token_file (--config, resolved relative to the pipeline "
                    "file, as collect reads it) or --token-file. A running collector picks the token "
                    "up within a few seconds. Give it to the devices (a file of mode 0600, "
                    "docs/devices.md §6.4).")
    where = t.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", default=None,
                       help="pipeline TOML file: mint into its [collector] token_file")
    where.add_argument("--token-file", default=None, help="the token file itself")
    t.add_argument("--id", required=True, dest="token_id",
                   help="name of the token (1-64 of A-Z a-z 0-9 . _ : -), unique in the file; logged")
    t.add_argument("--expires", default=None,
                   help="expiry: a duration from now (90d, 12h, 30m, 2w) or an ISO-8601 UTC time "
                        "(2027-01-01T00:00:00Z); default: never")
    t.set_defaults(func=run_token)


#: how to set the token file, in the one line of a pipeline without one
_SET_TOKEN_FILE = ("add token_file = \"FILE\" to its [collector] section; a relative path is read "
                   "relative to the pipeline file")


def token_file_of(config: str):
    """The ``[collector] token_file`` of the pipeline file ``config``, resolved relative to it.

    Parameters
    ----------
    config : str or Path
        The pipeline TOML file.

    Returns
    -------
    Path
        The token file, as ``ldp-stream collect`` reads it.

    Raises
    ------
    aggregator.errors.ConfigError
        The file does not load, or sets no ``token_file``.
    """
    from aggregator.config import PipelineConfig
    from aggregator.errors import ConfigError

    path = PipelineConfig.load(config).collector.token_file
    if path is None:
        raise ConfigError(f"collector.token_file is not set in {config} ({_SET_TOKEN_FILE})")
    return path


def run_token(args: argparse.Namespace) -> int:
    """Mint one token into ``--token-file`` or the ``--config``'s token file; print it on stdout
    and the file's path on stderr."""
    import os

    from aggregator.collector.tokens import mint_token, parse_expiry
    from aggregator.errors import CLIError
    from ingest.client.event_time import iso_utc

    expires = None
    if args.expires is not None:
        try:
            expires = parse_expiry(args.expires)
        except ValueError as exc:
            raise CLIError(f"--expires: {exc}") from None
    path = token_file_of(args.config) if args.config is not None else args.token_file
    token = mint_token(path, args.token_id, expires)
    print(token, flush=True)
    until = f", expires {iso_utc(expires)}" if expires is not None else ""
    print(f"ldp-stream collect-token: added {args.token_id!r} to {os.path.abspath(path)}{until}; the "
          "token above is shown once", file=sys.stderr)
    return 0


def _check_tls(section) -> tuple[str | None, str | None]:
    from aggregator.errors import ConfigError
    from ingest.files import check_readable

    out = []
    for key in ("tls_certfile", "tls_keyfile"):
        path = getattr(section, key)
        if path is not None:
            check_readable(path, lambda why, key=key, path=path: ConfigError(
                f"collector.{key}: cannot read {str(path)!r}: {why}"))
        out.append(str(path) if path is not None else None)
    return out[0], out[1]


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C; then drain and flush."""
    require_extra("the collect command", "server", COLLECT_MODULES)
    from aggregator.collector.app import Collector, build_app
    from aggregator.collector.config import event_time_skew_limit
    from aggregator.collector.forward import PRODUCER_OPTIONS
    from aggregator.collector.protocol import http_protocol
    from aggregator.collector.tokens import TokenStore
    from aggregator.config import PipelineConfig
    from aggregator.errors import CLIError, ConfigError
    from aggregator.serve import check_bindable
    from ingest.kafka.clients import reachable
    from ingest.kafka.topics import ensure_topic
    from ingest.kafka.transport import KafkaPythonTransport

    if args.host is not None and not args.host.strip():
        raise CLIError("--host must be an address to bind, got ''")
    cfg = PipelineConfig.load(args.config)
    section = cfg.collector
    if section.token_file is None:
        raise ConfigError(f"collector.token_file: required by ldp-stream collect, not set in "
                          f"{args.config} ({_SET_TOKEN_FILE}; then mint tokens with ldp-stream "
                          f"collect-token --config {args.config} --id NAME)")
    host = args.host or section.host
    port = section.port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise CLIError(f"--port must be in [0, 65535], got {port}")
    certfile, keyfile = _check_tls(section)
    tokens = TokenStore(section.token_file)  # refuses a missing, shared or malformed file
    schema = cfg.telemetry_schema
    check_bindable(host, port)  # fail before touching Kafka
    if port == 0:
        from ingest.local.processes import free_port

        port = free_port(host)
    if not reachable(cfg.kafka, timeout=2.0):
        raise CLIError(f"cannot reach Kafka at {cfg.kafka.bootstrap} ([kafka] bootstrap_servers)")
    ensure_topic(cfg.kafka, cfg.topics.reports, cfg.topics.partitions)
    transport = KafkaPythonTransport(
        cfg.kafka, linger_s=0.0, delivery_timeout_s=section.delivery_timeout_s,
        max_request_size=max(1 << 20, section.max_body_bytes + 64 * 1024),
        max_block_ms=int(section.ack_timeout_s * 1000), **PRODUCER_OPTIONS)
    collector = Collector(section, schema, transport, cfg.topics.reports, tokens=tokens,
                          settings=cfg.kafka, max_event_time_skew_s=event_time_skew_limit(cfg)).start()
    app = build_app(collector)
    scheme = "https" if certfile else "http"
    where = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{where}:{port}"
    print(f"ldp-stream collect: pipeline {cfg.pipeline.name!r}, reports on {url}/v1/reports to topic "
          f"{cfg.topics.reports!r} (also /healthz, /readyz, /metrics); Ctrl-C to stop",
          file=sys.stderr, flush=True)
    try:
        _serve(app, host, port, certfile, keyfile, grace_s=section.ack_timeout_s + 1.0,
               protocol=http_protocol(collector.metrics.refuse))
    finally:
        left = collector.table.inflight
        collector.close(timeout_s=min(section.delivery_timeout_s, 30.0))
        log.info("collector stopped (%d record(s) were awaiting acknowledgement)", left)
    print("ldp-stream collect: stopped", file=sys.stderr, flush=True)
    return 0


def _serve(app, host: str, port: int, certfile: str | None, keyfile: str | None, grace_s: float,
           protocol) -> None:
    """uvicorn with the HTTP ``protocol`` class until SIGTERM/SIGINT: it stops accepting and lets
    the requests in progress finish (each waits at most ``ack_timeout_s`` for Kafka), then
    returns."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            ssl_certfile=certfile, ssl_keyfile=keyfile, http=protocol,
                            timeout_graceful_shutdown=max(1, int(grace_s + 0.999)))
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it caught once it has shut down, with the handlers it found
    # installed: make those no-ops so that the producer is still flushed after it returns
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
