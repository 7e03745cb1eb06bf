"""The paced send loop: batches handed to a sender at a mean rate of reports per second
(``ldp-stream produce --rate``, the demo's producer)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from ingest.client.batch import ReportBatch

__all__ = ["send_paced"]


def send_paced(send: Callable[[ReportBatch], object], batches: Iterable[ReportBatch], rate: float | None, *,
               start: float | None = None, stop: threading.Event | None = None,
               on_sent: Callable[[int], object] | None = None) -> int:
    """Send ``batches`` one after the other with ``send``, at most ``rate`` reports per second
    on average since ``start``: after a batch, the loop waits until the reports sent so far are
    due (it does not wait after the last batch, nor when it is behind).

    Parameters
    ----------
    send : callable (ReportBatch) → object
        Sends (or queues) one batch; returning ``False`` means the batch was not taken and ends
        the loop (it is not counted).
    batches : iterable of ReportBatch
    rate : float or None
        Reports per second (> 0); None or 0 sends without pause.
    start : float or None
        ``time.monotonic()`` the rate counts from (default: when the loop starts).
    stop : threading.Event or None
        Ends the loop when set: checked before each batch, and waited on instead of sleeping.
    on_sent : callable (int) → object, optional
        Called after each batch with the reports sent so far; a true result ends the loop (the
        caller's last batch: no pause after it).

    Returns
    -------
    int
        Reports sent.
    """
    t0 = time.monotonic() if start is None else start
    sent = 0
    for batch in batches:
        if stop is not None and stop.is_set():
            break
        if send(batch) is False:
            break
        sent += batch.n
        if on_sent is not None and on_sent(sent):
            break
        if rate:
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                if stop is None:
                    time.sleep(ahead)
                elif stop.wait(ahead):
                    break
    return sent
