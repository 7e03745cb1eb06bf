"""The collector against the real broker (docs/collector.md): the reports topic receives exactly
the POSTed bytes, once per key, each with its batch id header; a batch whose acknowledgement was
lost is found by reading the topic back and not written twice; ``ldp-stream collect`` starts,
prints its URL, answers ``/healthz`` and ``/readyz``, forwards a batch and stops on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from aggregator.collector.app import Collector, build_app
from aggregator.collector.config import CollectorSection
from aggregator.collector.forward import PRODUCER_OPTIONS
from aggregator.collector.readback import BATCH_ID_HEADER, batch_id, partition_of
from aggregator.collector.tokens import TokenStore, mint_token
from ingest.device.http_protocol import CONTENT_TYPE
from ingest.kafka.clients import topic_records, topic_values
from ingest.kafka.settings import KafkaSettings
from ingest.kafka.topics import ensure_topic
from ingest.kafka.transport import KafkaPythonTransport
from tests.aggregator.collector_support import body, metric
from tests.http_server import ServedApp

ROOT = Path(__file__).resolve().parents[2]
#: the schema of tests.aggregator.collector_support.SCHEMA, as a file
SCHEMA_TOML = """name = "col"
[numeric]
zero_prob = 0.2
scale = 0.5
[[numeric.fields]]
name = "a"
low = 0.0
high = 1.0
"""


def read_topic(bootstrap: str, topic: str) -> list[bytes]:
    return topic_values(bootstrap, topic, timeout_s=20)


def post(url: str, data: bytes, key: str, token: str, timeout: float = 10.0):
    req = urllib.request.Request(url + "/v1/reports", data=data, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": CONTENT_TYPE, "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, ca: Path | None = None) -> int:
    import ssl

    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def collector_on(bootstrap: str, topic: str, tokens_path: Path, transport=None) -> Collector:
    from tests.aggregator import collector_support as cs

    transport = transport or KafkaPythonTransport(bootstrap, linger_s=0.0, delivery_timeout_s=10.0,
                                                  **PRODUCER_OPTIONS)
    return Collector(CollectorSection(ack_timeout_s=10.0), cs.SCHEMA, transport, topic,
                     tokens=TokenStore(tokens_path), settings=KafkaSettings.coerce(bootstrap),
                     readiness_interval_s=0.2).start()


def test_the_topic_receives_exactly_the_posted_bytes_once(tmp_path, bootstrap_servers, topic_name):
    topic = topic_name("col")
    ensure_topic(bootstrap_servers, topic, 2)
    tokens_path = tmp_path / "tokens"
    token = mint_token(tokens_path, "dev")
    collector = collector_on(bootstrap_servers, topic, tokens_path)
    bodies = [body(n, seed=n) for n in (1, 5, 50, 500)]
    try:
        with ServedApp(build_app(collector)) as app:
            for i, data in enumerate(bodies):
                assert post(app.url, data, f"b-{i}", token) == (202, {
                    "accepted": [1, 5, 50, 500][i], "idempotency_key": f"b-{i}", "duplicate": False})
            for i, data in enumerate(bodies):  # every retry is a duplicate
                status, js = post(app.url, data, f"b-{i}", token)
                assert (status, js["duplicate"]) == (202, True)
            assert post(app.url, bodies[0], "b-1", token)[1]["error"] == "idempotency_key_reused"
            assert post(app.url, b"junk", "b-9", token)[0] == 422
            assert get(app.url + "/readyz") == 200
            with urllib.request.urlopen(app.url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            assert metric(text, "ldp_collector_reports_accepted_total") == 556
            assert metric(text, "ldp_collector_batches_total", outcome="duplicate") == 4
    finally:
        collector.close(5.0)
    got = topic_records(bootstrap_servers, topic, timeout_s=20)
    assert sorted(r.value for r in got) == sorted(bodies)  # each body once, byte for byte
    for r in got:  # on the partition its batch id names, with the id in a header
        i = bodies.index(r.value)
        bid = batch_id("dev", f"b-{i}")
        assert list(r.headers) == [(BATCH_ID_HEADER, bid)] and r.partition == partition_of(bid, {0, 1})


class LostAcks:
    """A transport that writes through the real producer but reports the first ``n`` records as
    failed, as when the broker stored them and died before answering."""

    def __init__(self, inner: KafkaPythonTransport, n: int) -> None:
        from tests.aggregator.collector_support import FakeFuture

        self.inner, self.left, self._future = inner, n, FakeFuture

    def send(self, topic, value, key=None, partition=None, headers=None):
        fut = self.inner.send(topic, value, key=key, partition=partition, headers=headers)
        if self.left <= 0:
            return fut
        self.left -= 1
        fut.get(timeout=10)  # it is in the topic
        lost = self._future()
        lost.resolve(ConnectionError("connection lost before the acknowledgement"))
        return lost

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_batch_whose_acknowledgement_was_lost_is_read_back_not_written_twice(
        tmp_path, bootstrap_servers, topic_name):
    topic = topic_name("colrb")
    ensure_topic(bootstrap_servers, topic, 2)
    tokens_path = tmp_path / "tokens"
    token = mint_token(tokens_path, "dev")
    inner = KafkaPythonTransport(bootstrap_servers, linger_s=0.0, delivery_timeout_s=10.0, **PRODUCER_OPTIONS)
    collector = collector_on(bootstrap_servers, topic, tokens_path, LostAcks(inner, 3))
    bodies = [body(20, seed=100 + i) for i in range(6)]
    try:
        with ServedApp(build_app(collector)) as app:
            first = [post(app.url, b, f"l-{i}", token)[0] for i, b in enumerate(bodies)]
            assert first == [503, 503, 503, 202, 202, 202]
            again = [post(app.url, b, f"l-{i}", token) for i, b in enumerate(bodies)]
            assert [(s, js["duplicate"]) for s, js in again] == [(202, True)] * 6
            with urllib.request.urlopen(app.url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            assert metric(text, "ldp_collector_readbacks_total", outcome="found") == 3
    finally:
        collector.close(5.0)
    assert sorted(read_topic(bootstrap_servers, topic)) == sorted(bodies)  # each once


def readyz(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.timeout(240)
def test_readyz_follows_a_frozen_broker_and_the_accepted_counter_the_topic(tmp_path, topic_name):
    """A frozen broker (SIGSTOP: connections open, metadata cached, nothing answered) makes
    ``/readyz`` 503 within a probe; once it is thawed the collector is ready again, the batch
    refused during the outage is delivered once, and ``ldp_collector_reports_accepted_total``
    equals the reports in the topic."""
    from ingest.client.codec import decode
    from ingest.local.broker import EmbeddedBroker
    from tests.aggregator.collector_support import SCHEMA

    def until(fn, what: str, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while not (got := fn()):
            assert time.monotonic() < deadline, what
            time.sleep(0.1)
        return got

    with EmbeddedBroker(startup_timeout=30.0) as broker:
        bootstrap = broker.bootstrap_servers
        topic = topic_name("colfz")
        ensure_topic(bootstrap, topic, 1)
        token = mint_token(tmp_path / "tokens", "dev")
        transport = KafkaPythonTransport(bootstrap, linger_s=0.0, delivery_timeout_s=10.0,
                                         **PRODUCER_OPTIONS)
        collector = Collector(CollectorSection(ack_timeout_s=1.0, delivery_timeout_s=10.0), SCHEMA,
                              transport, topic, tokens=TokenStore(tmp_path / "tokens"),
                              settings=KafkaSettings.coerce(bootstrap), readiness_interval_s=0.2).start()
        try:
            with ServedApp(build_app(collector)) as app:
                until(lambda: readyz(app.url)[0] == 200, "not ready with a live broker", 30)
                assert post(app.url, body(10, seed=1), "fz-0", token)[0] == 202
                late = body(7, seed=2)
                broker.freeze()
                try:
                    t0 = time.monotonic()
                    _, js = until(lambda: (r := readyz(app.url))[0] == 503 and r,
                                     "readyz stayed 200 with a frozen broker", 30)
                    assert js["error"] == "not_ready" and "did not answer" in js["reason"], js
                    assert time.monotonic() - t0 < 15
                    status, js = post(app.url, late, "fz-1", token)
                    assert (status, js["error"]) == (503, "broker_unavailable")
                finally:
                    broker.thaw()
                until(lambda: readyz(app.url)[0] == 200, "not ready again after the thaw", 60)
                until(lambda: post(app.url, late, "fz-1", token)[0] == 202, "the retry failed", 60)
                with urllib.request.urlopen(app.url + "/metrics", timeout=5) as r:
                    text = r.read().decode()
        finally:
            collector.close(5.0)
        values = read_topic(bootstrap, topic)
    assert sorted(values) == sorted([body(10, seed=1), late])  # each once
    in_topic = sum(decode(v, {SCHEMA.fingerprint: SCHEMA}).n for v in values)
    assert metric(text, "ldp_collector_reports_accepted_total") == in_topic == 17


@contextmanager
def collect_process(config: Path, ca: Path | None = None, ready_timeout_s: float = 20.0):
    """``ldp-stream collect --config CONFIG`` in a subprocess: yields ``(proc, url, first stderr
    line)`` once ``/healthz`` and ``/readyz`` answer 200; SIGTERM at the end must exit it with 0,
    having said it stopped, without a traceback."""
    with subprocess.Popen([sys.executable, "-m", "aggregator.cli", "collect", "--config", str(config)],
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        try:
            line = proc.stderr.readline()
            m = re.search(r"(https?://127\.0\.0\.1:\d+)/v1/reports", line)
            assert m, line + proc.stderr.read()
            url = m.group(1)
            deadline = time.monotonic() + ready_timeout_s
            while get(url + "/healthz", ca) != 200 or get(url + "/readyz", ca) != 200:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the collector did not become ready"
                time.sleep(0.05)
            yield proc, url, line
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            rest = proc.stderr.read()
            assert "stopped" in rest and "Traceback" not in rest, rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@contextmanager
def running_collect(tmp_path: Path, bootstrap: str, topic: str, extra: str = "", ca: Path | None = None):
    """:func:`collect_process` over a pipeline of :data:`SCHEMA_TOML` and ``topic`` written in
    ``tmp_path`` (plus ``extra`` config text)."""
    (tmp_path / "col.schema.toml").write_text(SCHEMA_TOML)
    config = tmp_path / "c.pipeline.toml"
    config.write_text('[pipeline]\nname = "cli"\nschema = "col.schema.toml"\n'
                      f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
                      f'[topics]\nreports = "{topic}"\nstate = "{topic}.s"\ndead_letter = "{topic}.d"\n'
                      '[collector]\nport = 0\ntoken_file = "tokens"\nack_timeout_s = 5.0\n' + extra)
    with collect_process(config, ca) as started:
        yield started


def test_the_cli_starts_prints_its_url_forwards_and_stops_on_sigterm(tmp_path, bootstrap_servers, topic_name):
    topic = topic_name("cli")
    data = body(20, seed=4)
    token = mint_token(tmp_path / "tokens", "dev")
    with running_collect(tmp_path, bootstrap_servers, topic) as (_, url, line):
        assert line.startswith("ldp-stream collect: pipeline 'cli', reports on http://127.0.0.1:")
        assert post(url, data, "cli-1", token)[0] == 202
        # the command serves the collector's HTTP layer: malformed framing is a JSON 400 too
        from tests.aggregator.collector_support import read_response

        host, port = url.rsplit("//", 1)[1].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
            status, headers, raw, _ = read_response(s)
        assert status == 400 and headers["content-type"] == "application/json", raw
        assert json.loads(raw)["error"] == "bad_request"
        assert token not in line
    assert read_topic(bootstrap_servers, topic) == [data]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_device_sender_delivers_over_https_once(tmp_path, bootstrap_servers, topic_name):
    """The real device side (ingest.device.sender) against the real collector over TLS: every report
    lands once, in records of reports_per_batch reports."""
    from ingest.client.batch import concat_batches
    from ingest.client.codec import decode
    from ingest.client.privatizer import Privatizer
    from ingest.device.sender import CollectorSender
    from tests.aggregator.collector_support import SCHEMA

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    topic = topic_name("tls")
    token = mint_token(tmp_path / "tokens", "dev")
    rng = np.random.default_rng(11)
    reports = Privatizer(SCHEMA, rng).privatize_batch({"a": rng.random(2500)})
    with running_collect(tmp_path, bootstrap_servers, topic,
                         'tls_certfile = "cert.pem"\ntls_keyfile = "key.pem"\n', ca=cert) as (_, url, _):
        assert url.startswith("https://")
        with CollectorSender(url, token, SCHEMA, ca_file=cert, reports_per_batch=1000) as sender:
            sender.send(reports)
            sender.flush(20)
            assert sender.stats.duplicates == 0
    values = read_topic(bootstrap_servers, topic)
    assert len(values) == 3
    got = concat_batches([decode(v, {SCHEMA.fingerprint: SCHEMA}) for v in values])
    assert got.n == 2500 and got == reports  # one partition: in order
