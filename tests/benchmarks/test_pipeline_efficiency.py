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
    assert len(cfg.queries) == 8  # the demo pipeline's queries are kept


def test_simulate_matches_the_stated_truth():
    rng = np.random.default_rng(7)
    n = 200_000
    x = efficiency.simulate(n, rng)
    assert x.shape == (n, 4)
    # logistic: the label frequency is the mean of σ(β₀ + c·β) over c ~ U(−1, 1)² (MC, 4 SE)
    c = rng.uniform(-1.0, 1.0, (n, 2))
    p = 1.0 / (1.0 + np.exp(-(efficiency.BETA_LOGIT[0] + c @ efficiency.BETA_LOGIT[1:])))
    lab = x[:, efficiency.LAB]
    assert abs(lab.mean() - p.mean()) < 4 * np.sqrt(2 * 0.25 / n)
    # median regression: the residual y − zᵀβ has median 0 (binomial SE of the sign fraction)
    z = np.column_stack([np.ones(n), x[:, [efficiency.C1, efficiency.C2]]])
    frac = np.mean(x[:, efficiency.Y] - z @ efficiency.BETA_LINEAR > 0)
    assert abs(frac - 0.5) < 4 * 0.5 / np.sqrt(n)


def test_one_rep_online_and_batch_estimate_every_query():
    from ingest.client.schema import TelemetrySchema

    schema = TelemetrySchema.from_dict(efficiency.SCHEMA)
    out = efficiency.one_rep(schema, schema.zil_mechanism(), efficiency.batch_problems(), 20_000, seed=3,
                             qs=efficiency.queries(warm_up=5000))
    fits = [out["batch"]] + [out["online"][p] for p in efficiency.PARTITIONS]
    for fit in fits:
        for k, truth in efficiency.TRUTH.items():
            f = fit[k]
            assert f["value"].shape == truth.shape
            assert np.all(np.isfinite(f["value"])) and np.all(f["se"] > 0) and np.all(f["lo"] < f["hi"])
            # 20000 reports: every estimate is within 5 of its SEs of the simulated truth
            assert np.all(np.abs(f["value"] - truth) < 5 * f["se"]), (k, f["value"], f["se"])
    # the online fit (warm-up of 5000, then renewal) agrees with the batch fit of the same reports
    for k in efficiency.TRUTH:
        on, b = out["online"][1][k], out["batch"][k]
        assert np.all(np.abs(on["value"] - b["value"]) < 1.5 * b["se"]), k


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
    assert len(kinds) == 6
    assert "logistic_regression" not in kinds and "quantile_regression" not in kinds
