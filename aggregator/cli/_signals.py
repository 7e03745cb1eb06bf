"""Signal handling shared by the ``ldp-stream`` subcommands."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, a supervisor, ``timeout``, a closed terminal) raises
    ``KeyboardInterrupt`` as Ctrl-C does, so that the command's Ctrl-C path runs (flush, counts,
    stop its child processes); the previous handler is restored on exit. Main thread only
    (``ValueError`` elsewhere, from :func:`signal.signal`)."""
    def _terminate(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
