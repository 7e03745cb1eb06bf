"""serve's liveness and readiness against a real Tansu broker that stops answering (SIGSTOP) and
comes back (docs/deploy.md, "Health of serve")."""

from __future__ import annotations

import time

import pytest

from aggregator.checkpoint import StateTopicReader
from aggregator.config import PipelineConfig
from aggregator.serve import EstimateStore
from aggregator.worker import PipelineRuntime
from ingest.local.broker import EmbeddedBroker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


def test_readiness_follows_a_frozen_broker(tmp_path, topic_name):
    from ingest.kafka.settings import KafkaSettings

    with EmbeddedBroker(startup_timeout=30.0) as broker:
        cfg = PipelineConfig.load(ps.write_config(tmp_path, broker.bootstrap_servers, topic_name))
        ps.create_topics(broker.bootstrap_servers, cfg)
        runtime = PipelineRuntime.from_config(cfg)
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=5000)
        reader = StateTopicReader.connect(settings, cfg.topics.state, runtime.name)
        store = EstimateStore(runtime, reader, refresh_interval_s=0.2, stale_after_s=1.5).start()
        try:
            body = ps.until(store.readiness, 200, 60)
            assert body["status"] == "ready" and store.health()[1]["status"] == "ok"
            broker.freeze()
            t0 = time.monotonic()
            body = ps.until(store.readiness, 503, 30)
            assert time.monotonic() - t0 >= 1.0  # not at once: after stale_after_s without answers
            assert "no answer from the broker" in body["reason"]
            # the probe that is under way fails at its timeout: degraded, but alive
            ps.until(lambda: (store.health()[1]["status"], None), "degraded", 30)
            code, health = store.health()
            assert code == 200 and health["last_error"]
            broker.thaw()
            ps.until(store.readiness, 200, 60)
            ps.until(lambda: (store.health()[1]["status"] == "ok", None), True, 30)
        finally:
            if broker.frozen:
                broker.thaw()
            store.stop()
