"""The collector's request checks over HTTP (docs/collector.md §2-§3, §7-§10), against a fake
Kafka transport: each refusal answers JSON ``{"error", "reason"}`` and forwards nothing."""

from __future__ import annotations

import json
import time

import pytest

from aggregator.collector.tokens import mint_token
from ingest.client import codec
from ingest.errors import DecodeError
from ingest.kafka.transport import Transport
from tests.aggregator.collector_support import (
    OTHER,
    SCHEMA,
    FakeTransport,
    Served,
    body,
    metric,
    read_response,
)

LIMITS = dict(max_body_bytes=4096, max_inflight_bytes=1 << 20, body_timeout_s=0.3)


@pytest.fixture(scope="module")
def _server(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("collector"), **LIMITS)
    yield s
    s.close()


@pytest.fixture
def served(_server):
    _server.reset()
    return _server


@pytest.fixture
def own(tmp_path):
    """A collector of its own (fresh metrics and token file)."""
    s = Served(tmp_path, **LIMITS)
    yield s
    s.close()


def test_the_fake_is_a_transport():
    assert isinstance(FakeTransport(), Transport)


def test_an_accepted_batch_is_forwarded_byte_for_byte_after_the_ack(served):
    data = body(7)
    status, js, _ = served.post(data, "batch-1")
    assert (status, js) == (202, {"accepted": 7, "idempotency_key": "batch-1", "duplicate": False})
    assert served.transport.delivered == [data]


@pytest.mark.parametrize(("token", "code", "words"), [
    ("", "missing_token", "Authorization"),
    ("not-a-token", "invalid_token", "unknown"),
])
def test_a_missing_or_unknown_token_is_401_and_nothing_is_forwarded(served, token, code, words):
    status, js, headers = served.post(body(3), headers=served.headers(token=token) if token else
                                      {k: v for k, v in served.headers().items() if k != "Authorization"})
    assert status == 401 and js["error"] == code and words in js["reason"]
    assert headers["www-authenticate"].startswith("Bearer")
    assert served.transport.sent == []


def test_an_expired_token_is_401_saying_expired(own):
    served = own
    old = mint_token(served.tokens_path, "old-device", expires=int(time.time()) - 60)
    served.collector.tokens.maybe_reload(force=True)
    status, js, headers = served.post(body(3), headers=served.headers(token=old))
    assert status == 401 and js["error"] == "invalid_token" and "expired" in js["reason"]
    assert "old-device" in js["reason"] and old not in js["reason"]
    assert headers["www-authenticate"].startswith("Bearer")
    assert served.transport.sent == []


def test_a_wrong_scheme_is_401(served):
    basic = {**served.headers(), "Authorization": f"Basic {served.token}"}
    status, js, _ = served.post(body(3), headers=basic)
    assert status == 401 and js["error"] == "invalid_token"
    assert served.transport.sent == []


def test_a_wrong_content_type_is_415(served):
    status, js, _ = served.post(body(3), headers=served.headers(ctype="application/json"))
    assert status == 415 and js["error"] == "unsupported_media_type"
    assert served.transport.sent == []


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 129, "é"])
def test_a_missing_or_bad_idempotency_key_is_400(served, key):
    h = served.headers(key=None)
    if key is not None:
        h["Idempotency-Key"] = key.encode().decode("latin-1")
    status, js, _ = served.post(body(3), headers=h)
    assert status == 400 and js["error"] == "bad_request" and "Idempotency-Key" in js["reason"]
    assert served.transport.sent == []


def test_an_oversized_content_length_is_413_before_the_body_is_read(own):
    served = own
    # body_timeout_s is 0.3 s: had the server waited for the body it would answer 408, not 413
    s = served.raw(served.raw_head("Content-Length: 10000000\r\n") + "LDPR")
    status, headers, raw, closed = read_response(s)
    s.close()
    assert status == 413 and b"body_too_large" in raw and "4096" in raw.decode()
    assert closed and headers.get("connection") == "close"
    assert served.transport.sent == []
    assert metric(served.get("/metrics")[1], "ldp_collector_refused_total", reason="body_too_large") == 1


def test_a_chunked_body_is_cut_at_the_limit(served):
    chunk = b"x" * 1500
    wire = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))  # 4500 > 4096, no end
    s = served.raw(served.raw_head("Transfer-Encoding: chunked\r\n"))
    s.sendall(wire)
    status, _, raw, closed = read_response(s)
    s.close()
    assert status == 413 and b"body_too_large" in raw and closed
    assert served.transport.sent == []


def test_a_chunked_body_within_the_limit_is_accepted(served):
    data = body(5)
    wire = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
    s = served.raw(served.raw_head("Transfer-Encoding: chunked\r\n"))
    s.sendall(wire)
    status, _, _, _ = read_response(s, wait_close=False)
    s.close()
    assert status == 202 and served.transport.delivered == [data]


def test_a_slow_body_is_cut_by_body_timeout(served):
    data = body(5)
    s = served.raw(served.raw_head(f"Content-Length: {len(data)}\r\n"))
    t0 = time.monotonic()
    s.settimeout(0.05)
    answer = b""
    for i in range(len(data) - 1):  # one byte per 20 ms: the 0.3 s budget runs out first
        try:
            s.sendall(data[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        try:
            answer += s.recv(65536)
            break
        except TimeoutError:
            time.sleep(0.02)
    elapsed = time.monotonic() - t0
    assert b" 408 " in answer.split(b"\r\n")[0] and b"body_timeout" in answer + s.recv(65536)
    assert 0.25 < elapsed < 2.0
    s.settimeout(1.0)
    assert s.recv(1) == b""  # closed
    s.close()
    assert served.transport.sent == []


def test_a_missing_content_length_without_chunks_is_400(served):
    s = served.raw(served.raw_head(""))
    status, _, raw, _ = read_response(s, wait_close=False)
    s.close()
    assert status == 400 and b"Content-Length" in raw
    assert served.transport.sent == []


@pytest.mark.parametrize("head", [
    "POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    "POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "POST /v1/reports HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    "NOT HTTP AT ALL\r\n\r\n",
], ids=["letters", "conflicting", "negative", "bad-header-line", "bad-request-line"])
def test_malformed_http_framing_is_a_json_400_and_closes_the_connection(own, head):
    """The HTTP layer's refusals (before any route runs) have the body of every error: JSON
    ``{"error": "bad_request", "reason": ...}``, counted like the application's refusals."""
    s = own.raw(head)
    status, headers, raw, closed = read_response(s)
    s.close()
    assert status == 400 and headers["content-type"] == "application/json", (headers, raw)
    js = json.loads(raw)
    assert js["error"] == "bad_request" and "malformed HTTP request" in js["reason"], js
    assert closed and headers.get("connection") == "close"
    assert own.transport.sent == []
    text = own.get("/metrics")[1]
    assert metric(text, "ldp_collector_refused_total", reason="bad_request") == 1


def test_a_malformed_chunk_is_a_json_400(own):
    s = own.raw(own.raw_head("Transfer-Encoding: chunked\r\n"))
    s.sendall(b"zz\r\nnot a chunk size\r\n")
    status, headers, raw, closed = read_response(s)
    s.close()
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(raw)["error"] == "bad_request" and closed
    assert own.transport.sent == []
    # counted once, as the HTTP layer's refusal (not also as the route's client_disconnected)
    text = own.get("/metrics")[1]
    assert metric(text, "ldp_collector_refused_total", reason="bad_request") == 1
    assert metric(text, "ldp_collector_refused_total", reason="client_disconnected") == 0


def _reason_of(data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        codec.decode(data, {SCHEMA.fingerprint: SCHEMA})
    return info.value


@pytest.mark.parametrize("data", [b"not a wire record at all", body(4)[:-3], body(4, schema=OTHER)],
                         ids=["garbage", "truncated", "foreign-fingerprint"])
def test_a_body_the_workers_would_refuse_is_422_with_the_decoder_reason(served, data):
    expected = _reason_of(data)
    status, js, _ = served.post(data)
    assert status == 422 and js["error"] == expected.reason
    assert js["reason"] == " ".join(str(expected).split())
    assert served.transport.sent == []


def test_the_foreign_schema_reason_is_unknown_fingerprint(served):
    status, js, _ = served.post(body(4, schema=OTHER))
    assert (status, js["error"]) == (422, "unknown_fingerprint")


def test_an_empty_batch_is_422(served):
    status, js, _ = served.post(body(0))
    assert (status, js["error"]) == (422, "empty_batch")
    assert served.transport.sent == []


def test_too_many_reports_is_422_too_large(tmp_path):
    s = Served(tmp_path, max_reports_per_batch=3)
    try:
        status, js, _ = s.post(body(4))
        assert (status, js["error"]) == (422, "too_large")
        assert s.transport.sent == []
    finally:
        s.close()


def test_a_urap_report_with_two_non_sensitive_bits_is_422_impossible_report(tmp_path):
    """The decoder's refusal of a report uRAP cannot produce reaches the device: nothing is
    forwarded, so no worker has to dead-letter it."""
    import numpy as np

    from ingest.client.batch import ReportBatch
    from ingest.client.schema import TelemetrySchema
    from mechanisms.uldp import SparseBits

    schema = TelemetrySchema.from_dict({"name": "colu", "categorical": [{
        "name": "c", "categories": ["v0", "v1", "v2", "v3"], "sensitive": ["v0"],
        "mechanism": "urap", "epsilon": 1.0}]})

    def record(*reports):  # one report per tuple of set bits (v0 sensitive, v1-v3 not)
        idx = np.array([b for r in reports for b in r], dtype=np.int32)
        offsets = np.cumsum([0, *map(len, reports)])
        return codec.encode(ReportBatch(schema.fingerprint, np.zeros((len(reports), 0)),
                                        {"c": SparseBits(idx, offsets, 4)}))

    s = Served(tmp_path, schema=schema)
    try:
        status, js, _ = s.post(record((0, 1), (0, 1, 2), (3,)), "imp-1")
        assert (status, js["error"]) == (422, "impossible_report"), js
        assert "report 1 has 2 non-sensitive bits" in js["reason"]
        assert s.transport.sent == []
        assert s.post(record((0, 1), (1,), (0,)), "imp-2")[0] == 202  # at most one: possible
        assert metric(s.get("/metrics")[1], "ldp_collector_refused_total", reason="impossible_report") == 1
    finally:
        s.close()


def test_an_event_time_too_far_ahead_of_the_collector_clock_is_422_event_time_skew(tmp_path):
    """With windowed queries a worker dead-letters a record whose latest event time is more than
    ``max_event_time_skew_s`` ahead of its Kafka timestamp; the collector refuses such a body
    against its own clock, so a 202 is never followed by a dead letter."""
    import numpy as np

    from ingest.client.privatizer import Privatizer
    from ingest.client.schema import TelemetrySchema

    schema = TelemetrySchema.from_dict({
        "name": "colt", "event_time": {"field": "t", "resolution": "1s"},
        "numeric": {"zero_prob": 0.2, "scale": 0.5, "fields": [{"name": "a", "low": 0.0, "high": 1.0}]}})
    skew = 3600.0

    def record(ahead_s: float) -> bytes:  # 3 reports, the last one ``ahead_s`` after now
        now = time.time()
        rng = np.random.default_rng(5)
        times = [now - 600, now, now + ahead_s]
        batch = Privatizer(schema, rng).privatize_batch({"a": rng.random(3), "t": times})
        return codec.encode(batch, time_resolution=schema.time_resolution_s)

    s = Served(tmp_path, schema=schema, max_event_time_skew_s=skew)
    try:
        status, js, _ = s.post(record(skew + 60), "skew-1")
        assert (status, js["error"]) == (422, "event_time_skew"), js
        assert "max_event_time_skew_s = 3600 s" in js["reason"]
        assert s.transport.sent == []
        status, js, _ = s.post(record(skew - 60), "skew-2")
        assert (status, js["accepted"]) == (202, 3)
        assert len(s.transport.delivered) == 1
        assert metric(s.get("/metrics")[1], "ldp_collector_refused_total", reason="event_time_skew") == 1
    finally:
        s.close()
    (tmp_path / "unwindowed").mkdir()
    s = Served(tmp_path / "unwindowed", schema=schema)  # no windowed query: no limit
    try:
        assert s.post(record(10 * skew), "skew-3")[0] == 202
    finally:
        s.close()


def test_unknown_paths_and_methods_answer_json(served):
    status, js, _ = served.post(body(1), path="/v2/reports")
    assert status == 404 and js["error"] == "not_found"
    status, js, headers = served.post(b"", method="GET")
    assert status == 405 and js["error"] == "method_not_allowed" and "POST" in headers.get("allow", "")
    assert served.transport.sent == []


def test_health_readiness_and_metrics(own):
    served = own
    assert served.get("/healthz")[0] == 200
    assert served.get("/readyz")[0] == 200
    served.transport.partitions = set()
    deadline = time.monotonic() + 2
    while served.get("/readyz")[0] != 503:
        assert time.monotonic() < deadline, "readyz stayed 200 without partitions"
        time.sleep(0.02)
    assert "no partitions" in served.get("/readyz")[1]
    served.transport.partitions = {0}
    served.post(body(6), "m-1")
    served.post(body(6), "m-1")
    served.post(body(6), "m-2", headers=served.headers(ctype="text/plain"))
    text = served.get("/metrics")[1]
    assert metric(text, "ldp_collector_reports_accepted_total") == 6
    assert metric(text, "ldp_collector_batches_total", outcome="accepted") == 1
    assert metric(text, "ldp_collector_batches_total", outcome="duplicate") == 1
    assert metric(text, "ldp_collector_batches_total", outcome="refused") == 1
    assert metric(text, "ldp_collector_refused_total", reason="unsupported_media_type") == 1
    assert metric(text, "ldp_collector_request_seconds_count") == 3
    assert metric(text, "ldp_collector_inflight_bytes") == 0
    assert metric(text, "ldp_collector_idempotency_keys", state="accepted") == 1
    assert served.token not in text


def test_readyz_is_503_while_the_broker_leaves_the_probe_unanswered(tmp_path):
    """The probe is a round trip to the broker (here a fake that can hang, as a frozen broker
    does): cached metadata and an open TCP port are not enough for 200."""
    import threading

    answering = threading.Event()
    answering.set()
    asked = []

    def probe(partitions, timeout_s):
        asked.append((set(partitions), timeout_s))
        if not answering.wait(timeout_s):
            raise TimeoutError(f"no answer within {timeout_s:g} s")

    s = Served(tmp_path, ack_timeout_s=0.2, probe=probe)
    try:
        assert s.get("/readyz")[0] == 200 and asked[0] == ({0}, 0.2)
        answering.clear()  # the broker stops answering; its metadata stays cached
        deadline = time.monotonic() + 10
        while (got := s.get("/readyz"))[0] != 503:
            assert time.monotonic() < deadline, "readyz stayed 200 while the broker did not answer"
            time.sleep(0.02)
        js = json.loads(got[1])
        assert js["error"] == "not_ready" and "did not answer" in js["reason"], js
        answering.set()
        while s.get("/readyz")[0] != 200:
            assert time.monotonic() < deadline + 10, "readyz did not come back"
            time.sleep(0.02)
    finally:
        answering.set()
        s.close()


def test_a_rotated_token_file_is_reloaded_without_restart(own):
    served = own
    status, _, _ = served.post(body(2), "r-1")
    assert status == 202
    new = mint_token(served.tokens_path, "dev-b")
    status, js, _ = served.post(body(2), "r-2", headers=served.headers(key="r-2", token=new))
    assert status == 202, js
    served.tokens_path.write_text("\n")  # every token revoked
    served.collector.tokens._sig = None  # mtime granularity: force the next look to reload
    status, js, _ = served.post(body(2), "r-3", headers=served.headers(key="r-3", token=new))
    assert status == 401
    text = served.get("/metrics")[1]
    assert metric(text, "ldp_collector_token_reloads_total", outcome="ok") == 2


def test_a_stopping_server_still_answers_the_batch_awaiting_its_ack(own):
    """What SIGTERM does (uvicorn's should_exit): stop listening, let the request in progress get
    its acknowledgement and answer 202, then close the producer."""
    import threading

    own.transport.mode = "hold"
    data = body(3)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", own.post(data, "stop-1")), daemon=True)
    t.start()
    deadline = time.monotonic() + 3
    while not own.transport.pending:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    own.server.server.should_exit = True
    time.sleep(0.2)
    assert t.is_alive()  # still waiting for Kafka, not cut off
    own.transport.ack_all()
    t.join(5)
    assert out["r"][:2] == (202, {"accepted": 3, "idempotency_key": "stop-1", "duplicate": False})
    own.server.thread.join(5)
    assert not own.server.thread.is_alive()
    own.collector.close(1.0)
    assert own.transport.flushed == 1 and own.transport.closed
    assert own.collector.readiness_state()[0] == 503
