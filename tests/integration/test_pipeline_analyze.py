"""``ldp-stream analyze``: replaying the reports topic gives the batch fits (docs/mechanisms.md §4, §6)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from aggregator.analyze import analyze_query, replay
from aggregator.cli import main
from aggregator.config import PipelineConfig
from aggregator.worker import PipelineRuntime, ensure_topics
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_analyze_replays_topic_and_fits(tmp_path, bootstrap_servers, topic_name, capsys):
    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=3)
    cfg = PipelineConfig.load(cfg_path)
    ensure_topics(cfg)
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(cfg.telemetry_schema, n_records=60, per_record=100, seed=31)
    where = ps.produce(bootstrap_servers, cfg.topics.reports, [*records, b"junk" * 10], partitions=3)
    from ingest.kafka.clients import producer_client
    from ingest.kafka.settings import KafkaSettings

    with_key = producer_client(KafkaSettings(bootstrap_servers=bootstrap_servers))
    with_key.send(cfg.topics.reports, key=b"k", value=None, partition=0).get(10)  # no value
    with_key.close()
    rep = replay(runtime, cfg.kafka, cfg.topics.reports, timeout_s=60)
    # a record without a value is counted as the worker dead-letters it ("empty"), not dropped
    assert rep.n == 6000 and rep.records == 60
    assert rep.skipped == {"bad_magic": 1, "empty": 1}

    # the batch SDR mean is the mean of X̃₁ — and equals the streaming state over the same reports
    by_part: dict[int, list[bytes]] = {}
    for rec, (p, _) in zip(records, where[:-1]):
        by_part.setdefault(p, []).append(rec)
    stream = ps.reference_pass(runtime, by_part)
    res = analyze_query(rep, runtime, cfg.query("arr_delay_mean"))
    j = list(runtime.schema.numeric_names).index("arr_delay")
    assert res["n"] == 6000
    np.testing.assert_allclose(res["value"][0], rep.batch.numeric[:, j].mean(), rtol=1e-12)
    np.testing.assert_allclose(res["value"], stream["arr_delay_mean"].estimate().value, rtol=1e-9)
    # the sandwich divides by n, the streaming state by n − 1: equal up to sqrt(n/(n−1))
    np.testing.assert_allclose(res["stderr"], stream["arr_delay_mean"].estimate().stderr, rtol=2 / 6000)

    # CLI, JSON, with a new loss never configured: the DR median of arr_delay (truth: Beta(2,5) median)
    code = main(["analyze", "--config", str(cfg_path), "--query", "arr_delay_mean", "--loss",
                 "mechanisms.losses:CheckLoss", "--fields", "arr_delay", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reports"] == 6000 and out["analyses"][0]["query"] == "arr_delay_mean"
    med = out["analyses"][1]
    truth = -60 + 300 * stats.beta.ppf(0.5, 2, 5)
    assert med["estimator"] == "dr" and med["n"] == 6000
    assert abs(med["value"][0] - truth) < 4 * med["stderr"][0]
    assert med["ci_low"][0] < med["value"][0] < med["ci_high"][0]


def test_analyze_usage_errors(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(f'[pipeline]\nname = "x"\nschema = "{ps.SCHEMA}"\n'
                    '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    assert main(["analyze", "--config", str(path), "--loss", "mechanisms.losses:CheckLoss"]) == 2
    assert "--fields" in capsys.readouterr().err
    assert main(["analyze", "--config", str(path), "--loss", "nope_mod:f", "--fields", "arr_delay"]) == 2
    assert "nope_mod" in capsys.readouterr().err
    # fields that do not fit the loss are refused before any broker is contacted (9 is closed)
    for fields, match in (("arr_delay,dep_delay", "do not fit the loss"), ("", "at least one"),
                          ("arr_delay,arr_delay", "distinct"), ("carrier", "categorical"),
                          ("nope", "not a field")):
        assert main(["analyze", "--config", str(path), "--loss", "mechanisms.losses:CheckLoss",
                     "--fields", fields]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ldp-stream analyze: error: --fields: ") and match in err, err
        assert err.count("\n") == 1 and "no Kafka broker" not in err
