"""Fast checks of the pipeline / efficiency benchmark helpers (no timing, no broker)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import _pipeline_common, efficiency, pipeline


def test_write_pipeline_substitutes_every_setting(tmp_path):
    path = pipeline.write_pipeline(tmp_path, "127.0.0.1:12345", "t1", partitions=2, checkpoint_interval_s=0.5,
                                   serve_port=4321, refresh_s=0.2)
    cfg = pipeline.load_config(path)
    assert cfg.topics.reports == "bench.t1.reports"
    assert cfg.topics.state == "bench.t1.state"
    assert cfg.topics.partitions == 2
    assert cfg.worker.group_id == "bench-t1"
    assert cfg.worker.checkpoint_interval_s == 0.5
    assert len(cfg.queries) == 7  # the demo pipeline's queries are kept


def test_simulate_matches_the_stated_truth():
    rng = np.random.default_rng(7)
    n = 200_000
    x = efficiency.simulate(n, rng)
    assert x.shape == (n, 5)
    v = x[:, efficiency.V]
    se = v.std() / np.sqrt(n)
    assert abs(v.mean() - efficiency.TRUTH["mean"][0]) < 4 * se
    # median regression: the residual y − zᵀβ has median 0 (binomial SE of the sign fraction)
    z = np.column_stack([np.ones(n), x[:, [efficiency.C1, efficiency.C2]]])
    frac = np.mean(x[:, efficiency.Y] - z @ efficiency.BETA_MEDREG > 0)
    assert abs(frac - 0.5) < 4 * 0.5 / np.sqrt(n)


def test_one_rep_online_and_batch_estimate_every_query():
    from ingest.schema import TelemetrySchema

    schema = TelemetrySchema.from_dict(efficiency.SCHEMA)
    out = efficiency.one_rep(schema, 20_000, seed=3)
    for est in ("online", "batch"):
        for k, truth in efficiency.TRUTH.items():
            value, se, lo, hi = out[est][k]
            assert value.shape == truth.shape
            assert np.all(np.isfinite(value)) and np.all(se > 0) and np.all(lo < hi)
    # mean: online MomentsState (SDR) and batch SquaredLoss SDR are the same statistic
    np.testing.assert_allclose(out["online"]["mean"][0], out["batch"]["mean"][0], rtol=1e-9)
    value, se = out["batch"]["mean"][:2]
    assert abs(value[0] - efficiency.TRUTH["mean"][0]) < 5 * se[0]


@pytest.mark.parametrize("bad", ["nope"])
def test_write_pipeline_refuses_an_unknown_pattern(tmp_path, monkeypatch, bad):
    monkeypatch.setattr(_pipeline_common, "EXAMPLE", tmp_path / "x.toml")
    (tmp_path / "x.toml").write_text(bad)
    with pytest.raises(RuntimeError, match="not found"):
        _pipeline_common.write_pipeline(tmp_path, "127.0.0.1:1", "t")


def test_write_pipeline_can_drop_query_kinds(tmp_path):
    path = pipeline.write_pipeline(tmp_path, "127.0.0.1:1", "t2",
                                   drop_kinds=("logistic_regression", "quantile_regression"))
    kinds = [q.kind for q in pipeline.load_config(path).queries]
    assert len(kinds) == 5
    assert "logistic_regression" not in kinds and "quantile_regression" not in kinds
