"""The demo's pipeline for a run (``aggregator.demo.run``): serve's idle timeout follows the pace."""

from __future__ import annotations

import tomllib

import pytest

from aggregator.demo.run import CHECKPOINT_INTERVAL_S, DemoOptions, _write_config, window_idle_timeout


@pytest.mark.parametrize(("rate", "expected"), [
    (None, 2.0),        # unpaced: the stream ends at once, the last windows are final 2 s later
    (10_000.0, 2.5),    # default: a send every 0.25 s
    (1_000.0, 4.0),     # a 1000-report record every second
    (100.0, 22.0),      # one every 10 s: longer than any pause of the stream
])
def test_window_idle_timeout_outlasts_the_pauses_between_sends(rate, expected):
    opts = DemoOptions(rate=rate)
    assert window_idle_timeout(opts) == pytest.approx(expected)
    send_every = 0.0 if rate is None else max(opts.reports_per_record, rate / 4) / rate
    assert window_idle_timeout(opts) > CHECKPOINT_INTERVAL_S + send_every


def test_the_written_pipeline_carries_the_timeout_and_the_checkpoint_interval(tmp_path):
    opts = DemoOptions(rate=None, output_dir=tmp_path)
    path, data = _write_config(opts, "127.0.0.1:9", schema_path=opts.schema_path)
    written = tomllib.loads(path.read_text())
    assert written == data
    assert written["serve"]["window_idle_timeout_s"] == 2.0
    assert written["worker"]["checkpoint_interval_s"] == CHECKPOINT_INTERVAL_S
