"""ingest.client.pacing.send_paced: the one paced send loop of ``produce --rate`` and the demo."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from ingest.client import pacing


def _batches(*sizes):
    return [SimpleNamespace(n=n) for n in sizes]


def test_pauses_until_the_reports_sent_are_due(monkeypatch):
    now = [100.0]
    slept = []
    monkeypatch.setattr(pacing.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(pacing.time, "sleep", lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    sent = pacing.send_paced(lambda b: None, _batches(10, 10, 5), 10.0, start=100.0)
    assert sent == 25
    assert slept == [1.0, 1.0, 0.5]


def test_no_pause_without_a_rate_and_after_the_last_batch(monkeypatch):
    monkeypatch.setattr(pacing.time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError(s)))
    assert pacing.send_paced(lambda b: None, _batches(3, 4), None) == 7
    assert pacing.send_paced(lambda b: None, _batches(3, 4), 1e-3, on_sent=lambda n: n >= 3) == 3


def test_a_refused_batch_ends_the_loop_uncounted():
    seen = []
    assert pacing.send_paced(lambda b: seen.append(b.n) or b.n != 4, _batches(3, 4, 5), None) == 3
    assert seen == [3, 4]


def test_stop_ends_the_loop_and_interrupts_the_pause():
    stop = threading.Event()

    def send(b):
        stop.set()

    assert pacing.send_paced(send, _batches(2, 2), 1e-6, stop=stop) == 2
    assert pacing.send_paced(send, _batches(2), None, stop=stop) == 0
