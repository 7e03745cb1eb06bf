"""Config validation of windowed queries (``window = {size, hop, grace, retention}``) and of
``[worker] max_event_time_skew_s`` and ``[serve] window_idle_timeout_s`` — one-line messages
naming the key, as tests/aggregator/test_config_strict.py."""

from __future__ import annotations

import pytest

from aggregator.queries import DEFAULT_RETAINED_HOPS, MAX_RETAINED_PANES, parse_query
from tests.aggregator.test_config_strict import load, refused

MEAN = '[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\n'
DURATION = 'must be a duration {} like "30s", "15m", "1h", "1d" or "7d", got {!r}'


@pytest.mark.parametrize(("window", "message"), [
    ('{ size = "1x" }', "queries.m.window.size: " + DURATION.format("> 0", "1x")),
    ('{ size = "0s" }', "queries.m.window.size: " + DURATION.format("> 0", "0s")),
    ('{ size = "-1h" }', "queries.m.window.size: " + DURATION.format("> 0", "-1h")),
    ('{ size = "1.5h" }', "queries.m.window.size: " + DURATION.format("> 0", "1.5h")),
    ('{ size = "1d", hop = "0s" }', "queries.m.window.hop: " + DURATION.format("> 0", "0s")),
    ('{ size = "1d", grace = "-1s" }', "queries.m.window.grace: " + DURATION.format(">= 0", "-1s")),
    ('{ size = "1d", retention = "1y" }', "queries.m.window.retention: " + DURATION.format("> 0", "1y")),
    ('{ size = 86400 }', "queries.m.window.size: must be a string, got 86400"),
    ('{ size = "1d", hop = "7h" }', "queries.m.window: size (1d) must be a multiple of hop (7h)"),
    ('{ size = "1d", hop = "2d" }', "queries.m.window: size (1d) must be a multiple of hop (2d)"),
    ('{ size = "7d", hop = "1d", retention = "6d" }',
     "queries.m.window: retention (6d) must be at least size (7d)"),
    ('{ size = "1s", retention = "100001s" }',
     f"queries.m.window: retention (100001s) must be at most {MAX_RETAINED_PANES} hops of 1s"),
    ('{ size = "1d", sise = "1d" }', "queries.m.window.sise: Extra inputs are not permitted"),
    ('{ hop = "1d" }', "queries.m.window.size: Field required"),
    ('"1d"', "queries.m.window: must be a table, got '1d'"),
])
def test_a_bad_window_is_refused_naming_the_key(tmp_path, window, message):
    assert refused(tmp_path, MEAN + f"window = {window}\n") == message


@pytest.mark.parametrize(("window", "want"), [
    ('{ size = "1d" }', (86400, 86400, 0, DEFAULT_RETAINED_HOPS * 86400)),
    ('{ size = "7d", hop = "1d", grace = "6h" }',
     (7 * 86400, 86400, 6 * 3600, DEFAULT_RETAINED_HOPS * 86400)),
    ('{ size = "30s", grace = "0s", retention = "30s" }', (30, 30, 0, 30)),  # retention = size
    ('{ size = "1s", retention = "100000s" }', (1, 1, 0, MAX_RETAINED_PANES)),  # at the pane bound
    ('{ size = "2w", hop = "1w" }', (14 * 86400, 7 * 86400, 0, DEFAULT_RETAINED_HOPS * 7 * 86400)),
])
def test_a_good_window_loads_with_its_durations_in_seconds(tmp_path, window, want):
    w = load(tmp_path, MEAN + f"window = {window}\n").query("m").window
    assert (w.size_s, w.hop_s, w.grace_s, w.retention_s) == want


def test_a_query_without_window_has_none_and_every_kind_takes_one():
    assert parse_query({"kind": "mean", "name": "m", "field": "a"}).window is None
    for spec in ({"kind": "frequency", "name": "f", "field": "c"},
                 {"kind": "quantiles", "name": "q", "field": "a", "q": [0.5]},
                 {"kind": "linear_regression", "name": "l", "response": "b", "covariates": ["a"]},
                 {"kind": "logistic_regression", "name": "g", "covariates": ["a"], "label": "y"}):
        assert parse_query({**spec, "window": {"size": "1h"}}).window.size_s == 3600


@pytest.mark.parametrize(("body", "message"), [
    ("[worker]\nmax_event_time_skew_s = -1\n",
     "worker.max_event_time_skew_s: must be a finite number in [0, 3.16224e+07], got -1.0"),
    ("[worker]\nmax_event_time_skew_s = nan\n",
     "worker.max_event_time_skew_s: must be a finite number in [0, 3.16224e+07], got nan"),
    ("[worker]\nmax_event_time_skew_s = 31622401\n",
     "worker.max_event_time_skew_s: must be a finite number in [0, 3.16224e+07], got 31622401.0"),
    ('[worker]\nmax_event_time_skew_s = "1h"\n', "worker.max_event_time_skew_s: must be a number, got '1h'"),
    ("[serve]\nwindow_idle_timeout_s = 0\n",
     "serve.window_idle_timeout_s: must be a finite number in (0, 3.16224e+07], got 0.0"),
    ("[serve]\nwindow_idle_timeout_s = inf\n",
     "serve.window_idle_timeout_s: must be a finite number in (0, 3.16224e+07], got inf"),
    ("[serve]\nwindow_idle_timeout_s = 31622401\n",
     "serve.window_idle_timeout_s: must be a finite number in (0, 3.16224e+07], got 31622401.0"),
    ("[serve]\nwindow_idle_timeout_s = true\n", "serve.window_idle_timeout_s: must be a number, got true"),
])
def test_skew_and_idle_timeout_bounds(tmp_path, body, message):
    assert refused(tmp_path, body) == message


@pytest.mark.parametrize(("body", "skew", "idle"), [
    ("", 3600.0, 300.0),                                               # the defaults
    ("[worker]\nmax_event_time_skew_s = 0\n", 0.0, 300.0),             # 0 is allowed: no skew at all
    ("[worker]\nmax_event_time_skew_s = 31622400\n", 31_622_400.0, 300.0),  # 366 days
    ("[serve]\nwindow_idle_timeout_s = 0.5\n", 3600.0, 0.5),
    ("[serve]\nwindow_idle_timeout_s = 31622400\n", 3600.0, 31_622_400.0),
])
def test_skew_and_idle_timeout_in_range_load(tmp_path, body, skew, idle):
    cfg = load(tmp_path, body)
    assert cfg.worker.max_event_time_skew_s == skew and isinstance(cfg.worker.max_event_time_skew_s, float)
    assert cfg.serve.window_idle_timeout_s == idle
