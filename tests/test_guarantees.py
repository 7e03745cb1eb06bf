"""Guarantee enforcement (docs/reliability.md §7, docs/privacy.md §6.3).

* Values are clipped into the schema box before noise on every client code path: single event
  (``Privatizer.privatize``), batch (``privatize_batch``), ``ReportProducer.send_events`` and
  ``ldp-stream produce``. Two proofs: with the ZIL noise patched to zero every released value lies
  in the box; with real noise the exactly-released reports (probability ``zero_prob``) sit on the
  bound, never at the raw out-of-range value.
* Client noise: ``rng=None`` seeds from OS entropy (two default privatizers differ), ``rng="secure"``
  draws from ChaCha20 (randomgen) through every mechanism with the right distribution.
* The serve API binds 127.0.0.1 by default, is read-only and never returns a traceback.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from mechanisms import zil as zil_mod
from mechanisms.rng import as_generator, is_secure
from tests.http_server import ServedApp

LOW, HIGH = np.array([0.0, -5.0]), np.array([1.0, 5.0])


@pytest.fixture(scope="module")
def schema():
    return TelemetrySchema.from_dict({
        "name": "bounded",
        "numeric": {"zero_prob": 0.5, "scale": 1.0, "fields": [
            {"name": "x", "low": 0.0, "high": 1.0}, {"name": "y", "low": -5.0, "high": 5.0}]},
        "categorical": [{"name": "c", "categories": ["a", "b", "c"], "sensitive": ["a"],
                         "mechanism": "urr", "epsilon": 1.0}]})


def _raw(n: int, rng) -> dict:
    """Events far outside the box (and some inside), as columns."""
    x = rng.choice([-1e6, -3.5, 0.25, 7.5, 1e9], n)
    y = rng.choice([-1e12, -5.000001, 2.0, 5.5, 123.0], n)
    return {"x": x, "y": y, "c": np.asarray(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)]}


@pytest.fixture
def no_noise(monkeypatch):
    """ZIL noise patched to exactly zero: the release is the (clipped) input itself."""

    def zero(n, dim, variance, rng=None):
        as_generator(rng).standard_exponential(n)  # keep the stream moving like the real sampler
        return np.zeros((n, dim))

    monkeypatch.setattr(zil_mod, "sample_sl", zero)


def _in_box(a: np.ndarray) -> bool:
    return bool(np.all((a >= LOW) & (a <= HIGH)))


def test_zero_noise_single_and_batch_in_box(schema, no_noise):
    rng = np.random.default_rng(1)
    cols = _raw(500, rng)
    priv = Privatizer(schema, rng=rng)
    batch = priv.privatize_batch(cols)
    assert batch.n == 500 and _in_box(batch.numeric)
    np.testing.assert_array_equal(batch.numeric, np.clip(np.c_[cols["x"], cols["y"]], LOW, HIGH))
    assert priv.stats.clipped_rows > 0
    for i in range(50):
        one = priv.privatize({"x": float(cols["x"][i]), "y": float(cols["y"][i]), "c": cols["c"][i]})
        assert one.n == 1 and _in_box(one.numeric)


def test_zero_noise_producer_send_events_in_box(schema, no_noise):
    from ingest.client.codec import decode
    from ingest.kafka.producer import ReportProducer
    from tests.ingest.kafka.test_producer_unit import FakeTransport

    rng = np.random.default_rng(2)
    t = FakeTransport()
    with ReportProducer("127.0.0.1:9", "reports", schema, reports_per_record=64, transport=t,
                        create_topic=False, linger_s=0, rng=rng) as p:
        assert p.send_events(_raw(300, rng)) == 300
    got = np.concatenate([decode(v, {schema.fingerprint: schema}).numeric for _, v, _ in t.sent])
    assert got.shape == (300, 2) and _in_box(got)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_zero_noise_cli_produce_in_box(schema, no_noise, tmp_path, capsys):
    """``ldp-stream produce`` (in-process) from a CSV of out-of-range values: every report in the box."""
    import pandas as pd
    from kafka import TopicPartition

    from aggregator.cli import main
    from ingest.client.codec import decode
    from ingest.kafka.clients import reader_client
    from ingest.kafka.settings import KafkaSettings
    from ingest.local.broker import EmbeddedBroker

    rng = np.random.default_rng(3)
    csv = tmp_path / "events.csv"
    pd.DataFrame(_raw(400, rng)).to_csv(csv, index=False)
    schema_path = tmp_path / "bounded.schema.toml"
    schema_path.write_text(schema.dumps_toml())
    with EmbeddedBroker(startup_timeout=30.0) as b:
        code = main(["produce", "--schema", str(schema_path), "--source", str(csv), "--bootstrap-servers",
                     b.bootstrap_servers, "--topic", "bounded", "--batch-size", "50", "--partitions", "1",
                     "--seed", "4", "--no-progress"])
        assert code == 0, capsys.readouterr()
        c = reader_client(KafkaSettings(bootstrap_servers=b.bootstrap_servers))
        try:
            tp = TopicPartition("bounded", 0)
            c.assign([tp])
            rows, deadline = [], time.monotonic() + 30
            while sum(r.shape[0] for r in rows) < 400 and time.monotonic() < deadline:
                for recs in c.poll(timeout_ms=500).values():
                    rows += [decode(r.value, {schema.fingerprint: schema}).numeric for r in recs]
        finally:
            c.close()
    got = np.concatenate(rows)
    assert got.shape == (400, 2) and _in_box(got)


def test_exact_releases_sit_on_the_bound(schema):
    """Real noise: reports released without noise (prob. zero_prob) are the clipped values; no
    report ever equals a raw out-of-range input."""
    rng = np.random.default_rng(5)
    n = 20_000
    cols = {"x": np.full(n, 7.5), "y": np.full(n, -1e12),
            "c": np.asarray(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)]}
    out = Privatizer(schema, rng=rng).privatize_batch(cols).numeric
    exact = (out[:, 0] == 1.0) & (out[:, 1] == -5.0)
    assert not np.any(out[:, 0] == 7.5) and not np.any(out[:, 1] == -1e12)
    # with continuous noise a noisy coordinate is never exactly on the bound
    assert np.array_equal(out[:, 0] == 1.0, exact)
    se = np.sqrt(0.5 * 0.5 / n)
    assert abs(exact.mean() - 0.5) < 4 * se


# ------------------------------------------------------------------------------------ noise source
def test_default_privatizers_draw_different_noise(schema):
    cols = {"x": np.full(64, 0.5), "y": np.zeros(64), "c": np.asarray(["a"] * 64, dtype=object)}
    a = Privatizer(schema).privatize_batch(cols).numeric
    b = Privatizer(schema).privatize_batch(cols).numeric
    assert not np.array_equal(a, b)
    # and the mechanism-level default (rng=None) is not a fixed seed either
    mech = schema.zil_mechanism()
    assert not np.array_equal(mech.privatize(np.full((64, 2), 0.5)), mech.privatize(np.full((64, 2), 0.5)))


def test_secure_rng_everywhere(schema):
    from mechanisms.uldp import URAP, URR

    g = as_generator("secure")
    assert is_secure(g) and type(g.bit_generator).__name__ == "ChaCha"
    assert not is_secure(as_generator(None))
    assert not np.array_equal(as_generator("secure").random(8), as_generator("secure").random(8))
    priv = Privatizer(schema, rng="secure")
    assert is_secure(priv._rng)
    out = priv.privatize_batch(_raw(100, np.random.default_rng(6)))
    assert out.n == 100 and np.isfinite(out.numeric).all()
    mech = schema.zil_mechanism()
    assert mech.privatize(np.full((5, 2), 0.5), rng="secure").shape == (5, 2)
    assert zil_mod.sample_sl(5, 2, 1.0, rng="secure").shape == (5, 2)
    assert URR(k=4, sensitive=[0], epsilon=1.0).privatize(np.arange(4), rng="secure").shape == (4,)
    assert URAP(k=4, sensitive=[0], epsilon=1.0).privatize(np.arange(4), rng="secure").n == 4


def test_secure_rng_bad_values():
    from mechanisms.errors import ParameterError
    from mechanisms.rng import secure_generator

    with pytest.raises(ParameterError, match=r"rng must be .*'secure'"):
        as_generator("Secure!")
    with pytest.raises(ParameterError, match="algorithm must be one of"):
        secure_generator("des")
    assert type(secure_generator("aes").bit_generator).__name__ == "AESCounter"


def test_secure_rng_noise_has_the_sl_law():
    """ZIL noise through ChaCha20: P(exact) = δ and Var = (1 − δ)·λ²·range² (docs/mechanisms.md §1.2),
    4·SE."""
    from mechanisms.zil import ZILMechanism

    n, delta = 200_000, 0.3
    mech = ZILMechanism(zero_prob=delta, scale=1.0, low=0.0, high=2.0)
    z = mech.privatize(np.full((n, 1), 1.0), rng="secure")[:, 0] - 1.0
    p0 = np.mean(z == 0.0)
    assert abs(p0 - delta) < 4 * np.sqrt(delta * (1 - delta) / n)
    var_true = (1 - delta) * mech.noise_variance[0]
    # Var of the sample variance: (E z⁴ − σ⁴)/n; E z⁴ of ZIL = (1 − δ)·6·s² (W² has mean 2, G⁴ mean 3)
    s2 = mech.noise_variance[0]
    se = np.sqrt(((1 - delta) * 6 * s2**2 - var_true**2) / n)
    assert abs(np.mean(z**2) - var_true) < 4 * se


# ------------------------------------------------------------------------------------------ serve
def test_serve_defaults_bind_loopback():
    import inspect

    from aggregator.cli import serve as serve_cli
    from aggregator.config import ServeSection
    from aggregator.serve import run_server

    assert ServeSection().host == "127.0.0.1"
    assert inspect.signature(run_server).parameters["host"].default == "127.0.0.1"
    assert "127.0.0.1" in inspect.getsource(serve_cli)


def test_serve_read_only_and_never_a_traceback(monkeypatch):
    import json

    from aggregator.config import PipelineConfig
    from aggregator.serve import EstimateStore, build_app
    from aggregator.worker import PipelineRuntime
    from tests.integration import pipeline_support as ps

    class _Topic:
        def __call__(self, prefix="t"):
            return f"{prefix}-guarantees"

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        cfg = PipelineConfig.load(ps.write_config(Path(d), "127.0.0.1:9", _Topic()))
    store = EstimateStore(PipelineRuntime.from_config(cfg))
    srv = ServedApp(build_app(store))
    try:
        paths = ["/estimates", "/estimates/arr_delay_mean", "/privacy", "/healthz", "/metrics"]
        for path in paths:
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                status, body = srv.request(path, method)
                assert status == 405, (path, method, status)
                assert "Traceback" not in body and "error" in json.loads(body)
        for path in ("/nope", "/estimates/%ff%fe", "/estimates/" + "a" * 5000, "/../etc/passwd"):
            status, body = srv.request(path)
            assert status in (404, 414), (path, status)
            assert "Traceback" not in body and 'File "' not in body

        def boom(*a, **k):
            raise KeyError("internal detail /work/main/aggregator/serve.py")

        statuses = []
        for attr in ("estimates", "info"):
            with monkeypatch.context() as m:
                m.setattr(store, attr, boom)
                for path in paths[:2]:
                    status, body = srv.request(path)
                    statuses.append(status)
                    assert status in (404, 500), (attr, path, status)  # 404: the route does not use attr
                    assert "Traceback" not in body and "serve.py" not in body
                    assert "internal detail" not in body and "error" in json.loads(body)
        assert statuses.count(500) >= 2
    finally:
        with contextlib.suppress(Exception):
            srv.close()


def test_schema_client_rng_setting(schema):
    from ingest.errors import SchemaError

    data = schema.to_dict()
    secure = TelemetrySchema.from_dict({**data, "client": {"rng": "secure"}})
    assert is_secure(Privatizer(secure)._rng)
    assert not is_secure(Privatizer(schema)._rng)
    assert not is_secure(Privatizer(secure, rng=np.random.default_rng(0))._rng)  # explicit rng wins
    assert TelemetrySchema.loads(secure.dumps_toml()) == secure
    assert secure.fingerprint != schema.fingerprint  # a schema setting like any other
    assert TelemetrySchema.from_dict(data).fingerprint == schema.fingerprint  # absent: unchanged
    with pytest.raises(SchemaError, match="rng must be 'os' or 'secure'"):
        TelemetrySchema.from_dict({**data, "client": {"rng": "pcg"}})
