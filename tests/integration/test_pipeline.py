"""End-to-end: workers in one consumer group over 4 partitions, merged by serve, equal a single
in-process pass over the same records with the same doubling seeds (docs/reliability.md §1.2,
docs/mechanisms.md §2.2)."""

from __future__ import annotations

import signal
import threading

import numpy as np
import pytest

from aggregator.checkpoint import StateTopicReader
from aggregator.config import PipelineConfig
from aggregator.metrics import WorkerMetrics
from aggregator.serve import EstimateStore, merge_checkpoints
from aggregator.worker import PipelineRuntime, worker_from_config
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _run_worker(cfg, out: dict, key: str, **kw):
    w = worker_from_config(cfg, metrics=WorkerMetrics(), coalesce=kw.pop("coalesce", True))
    out[key] = w
    w.run(**kw)


def assert_states_equal(got: dict, want: dict, rtol: float = 1e-9) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].n == want[name].n, name
        eg, ew = got[name].estimate(), want[name].estimate()
        assert eg.params == ew.params
        np.testing.assert_allclose(eg.value, ew.value, rtol=rtol, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(eg.stderr, ew.stderr, rtol=rtol, atol=1e-12, err_msg=name)


def test_two_workers_then_serve_equal_single_pass(tmp_path, bootstrap_servers, topic_name):
    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=4)
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap_servers, cfg)
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(cfg.telemetry_schema, n_records=80, per_record=50, seed=11)
    where = ps.produce(bootstrap_servers, cfg.topics.reports, records, 4)
    by_part: dict[int, list[bytes]] = {}
    for rec, (p, _) in zip(records, where):
        by_part.setdefault(p, []).append(rec)

    workers: dict = {}
    threads = [threading.Thread(target=_run_worker, args=(cfg, workers, f"w{i}"),
                                kwargs={"exit_when_idle": 4.0}, daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    total = sum(w.processed_reports for w in workers.values())
    assert total >= 80 * 50  # a partition may be processed by both (revoke → replay) — never less

    reader = StateTopicReader.connect(cfg.kafka, cfg.topics.state, runtime.name)
    store = EstimateStore(runtime, reader)
    try:
        store.refresh()
    finally:
        store.stop()
    info = store.info()
    assert info["partitions"] == [0, 1, 2, 3]
    assert info["reports"] == 80 * 50
    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    merged, _ = merge_checkpoints(cks.values(), runtime)
    want = ps.reference_pass(runtime, by_part)
    assert_states_equal(merged, want)
    for name, est in store.estimates().items():
        assert "error" not in est, est
        assert est["n"] == want[name].n
        ew = want[name].estimate()
        np.testing.assert_allclose(est["value"], ew.value, rtol=1e-9, atol=1e-12)
        assert all(lo <= v <= hi for lo, v, hi in zip(est["ci_low"], est["value"], est["ci_high"]))


def test_serve_cli_over_http(tmp_path, bootstrap_servers, topic_name):
    import sys
    import time

    from ingest.local.processes import free_port, spawn_process

    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=2)
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap_servers, cfg)
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(cfg.telemetry_schema, n_records=20, per_record=30, seed=12)
    where = ps.produce(bootstrap_servers, cfg.topics.reports, records, 2)
    by_part: dict[int, list[bytes]] = {}
    for rec, (p, _) in zip(records, where):
        by_part.setdefault(p, []).append(rec)
    worker = worker_from_config(cfg, metrics=WorkerMetrics())
    worker.run(exit_when_idle=1.0)
    want = ps.reference_pass(runtime, by_part, coalesce=True)

    port = free_port()
    boot = "import sys; from aggregator.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = spawn_process([sys.executable, "-c", boot, "serve", "--config", str(cfg_path), "--port",
                          str(port)], log_path=tmp_path / "serve.log", cwd=ps.ROOT)
    try:
        deadline = time.monotonic() + 60
        body: dict = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                status, body = ps.get_json(port, "/estimates")
                if status == 200 and body["reports"] == 600:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert body.get("reports") == 600 and body["partitions"] == [0, 1]
        for name, st in want.items():
            est = body["estimates"][name]
            assert est["n"] == st.n
            np.testing.assert_allclose(est["value"], st.estimate().value, rtol=1e-9, atol=1e-12)
            assert len(est["ci_low"]) == len(est["ci_high"]) == len(est["params"])
        assert ps.get_json(port, "/estimates", method="POST")[0] == 405
        status, priv = ps.get_json(port, "/privacy")
        assert status == 200 and priv["numeric"]["zero_prob"] == pytest.approx(0.2)
        text = ps.scrape(port)
        assert ps.metric_value(text, "ldp_estimate_reports", 'query="arr_delay_mean"') == 600
        assert ps.has_family(text, "ldp_estimate_ci_upper")
    finally:
        ps.kill(proc, signal.SIGTERM)
