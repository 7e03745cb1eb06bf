"""The collector sender (ingest.device.sender, docs/devices.md §6) against a fake collector on loopback:
order and exactly-once per key under failures, keys and bodies reused on retries, Retry-After and
the back-off bounds, permanent refusals, 401, SIGKILL mid-run, two processes on one outbox,
OutboxFull, the token file, parameter messages."""

from __future__ import annotations

import itertools
import logging
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ingest.client.batch import concat_batches, slice_batch
from ingest.client.codec import decode
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.device.http_protocol import CONTENT_TYPE
from ingest.device.outbox import Outbox
from ingest.device.sender import CollectorSender, backoff_delay, parse_retry_after, read_token_file
from ingest.errors import ConfigError, OutboxFull, SenderError, TokenFileError
from tests.fake_collector import FakeCollector

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "tok-3f9a1c77e2"
SCHEMA_DICT = {"name": "snd", "numeric": {"zero_prob": 0.2, "scale": 0.5,
                                          "fields": [{"name": "a", "low": 0.0, "high": 1.0}]}}
SCHEMA = TelemetrySchema.from_dict(SCHEMA_DICT)
KNOWN = {SCHEMA.fingerprint: SCHEMA}
FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.02}


def reports(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return Privatizer(SCHEMA, rng).privatize_batch({"a": rng.random(n)})


def delivered(fc: FakeCollector):
    """The batch the collector accepted, in the order of the 202s (each key once)."""
    bodies = [fc.accepted[k] for k in fc.accepted_keys() if k is not None]
    return concat_batches([decode(b, KNOWN) for b in bodies])


def test_every_batch_is_delivered_once_per_key_and_in_order_under_failures():
    script = [503, "drop", 429, 500, ("slow", 0.05), 408, 502, "drop", 504]
    batch = reports(95)
    with FakeCollector(script=list(script), retry_after=0, schemas=KNOWN) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=10, rng=random.Random(1), **FAST)
        sender.send(batch)
        sender.flush(20)
        st = sender.stats
        sender.close()
    accepted = fc.accepted_keys()
    assert len(accepted) == len(set(accepted)) == 10  # exactly once per key
    firsts = list(dict.fromkeys(fc.keys()))
    assert accepted == firsts  # the order of the first attempts is the order of the 202s
    assert delivered(fc) == batch  # every report, in order
    for key in firsts:  # every retry sends the same body byte for byte
        assert len({r.body for r in fc.requests if r.key == key}) == 1
    assert len(fc.requests) == 10 + len(script) - 1  # a slow answer is a 202
    assert (st.batches_accepted, st.reports_accepted, st.queued, st.rejected, st.duplicates) == (
        10, 95, 0, 0, 0)
    assert st.retries >= len(script) - 3  # a drop on a kept-alive connection is retried at once
    r = fc.requests[0]
    assert r.headers["Authorization"] == f"Bearer {TOKEN}" and r.headers["Content-Type"] == CONTENT_TYPE
    assert r.path == "/v1/reports" and r.headers["Content-Length"] == str(len(r.body))


def test_a_duplicate_answer_is_counted_and_the_batch_deleted():
    with FakeCollector() as fc:
        box = Outbox()
        key = box.put(b"seen", 1)
        fc.accepted[key] = b"seen"  # the collector has it already (a re-POST after a crash)
        sender = CollectorSender(fc.url + "/", TOKEN, SCHEMA, outbox=box)
        sender.flush(10)
        assert (sender.stats.duplicates, sender.stats.batches_accepted, box.counts()["queued"]) == (1, 1, 0)
        sender.close()


def test_retry_after_is_honoured():
    with FakeCollector(script=[(503, 1), (429, 1)]) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, rng=random.Random(2), **FAST)
        sender.send(reports(3))
        sender.flush(10)
        sender.close()
    r = fc.requests
    assert [x.status for x in r] == [503, 429, 202] and len({x.key for x in r}) == 1
    gaps = [r[i + 1].arrived - r[i].done for i in range(2)]
    assert all(1.0 - 0.02 <= g < 1.6 for g in gaps), gaps  # never sooner; a back-off of <= 0.02 s


def test_back_off_is_full_jitter_within_its_bounds_with_a_seeded_source():
    rng = np.random.default_rng(3)
    for attempts in (1, 2, 3, 5, 30, 100):
        bound = min(2.0, 0.1 * 2 ** (attempts - 1))
        d = [backoff_delay(attempts, 0.1, 2.0, u) for u in rng.random(2000)]
        assert 0 <= min(d) and 0.95 * bound < max(d) < bound
        assert abs(np.mean(d) / bound - 0.5) < 0.05
    # the sender draws its delays from the source given: a copy predicts every gap
    predict = random.Random(9)
    with FakeCollector(script=[500, 500, 500, 500], retry_after=0) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, backoff_initial_s=0.1, backoff_max_s=0.25,
                                 rng=random.Random(9))
        sender.send(reports(2))
        sender.flush(10)
        sender.close()
    r = fc.requests
    expected = [predict.random() * b for b in (0.1, 0.2, 0.25, 0.25)]
    gaps = [r[i + 1].arrived - r[i].done for i in range(4)]
    assert all(e - 0.01 <= g <= e + 0.3 for e, g in zip(expected, gaps, strict=True)), (expected, gaps)
    assert sum(gaps) < sum(expected) + 0.2 < 0.1 + 0.2 + 0.25 + 0.25  # drawn, not the bounds themselves


def test_parse_retry_after():
    assert [parse_retry_after(v) for v in ("1", " 2.5 ", "0", None, "-1", "Wed, 21 Oct 2026 07:28:00 GMT",
                                           "inf")] == [1.0, 2.5, 0.0, None, None, None, None]


def test_a_permanent_refusal_is_kept_with_its_reason_and_the_rest_is_delivered(caplog):
    batch = reports(30)
    with FakeCollector(script=["accept", 422, "accept"], schemas=KNOWN) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=10, **FAST)
        with caplog.at_level(logging.ERROR, logger="ingest.device.sender"):
            sender.send(batch)
            with pytest.raises(SenderError, match=r"0 batches \(0 reports\) still queued .* 1 batches \(10 "
                                                  r"reports\) rejected since the last flush") as exc:
                sender.flush(10)
        assert (exc.value.rejected, exc.value.rejected_reports, exc.value.undelivered) == (1, 10, 10)
        sender.flush(1)  # nothing new since
        (rej,) = sender.outbox.rejected()
        assert (rej.status, rej.error, rej.reason, rej.reports) == (422, "empty_batch", "scripted 422", 10)
        assert rej.key == fc.requests[1].key and rej.body == fc.requests[1].body
        assert sender.stats.rejected == 1 and sender.stats.reports_rejected == 10
        assert [r.status for r in fc.requests] == [202, 422, 202]  # not retried
        with pytest.raises(SenderError, match=r"10 reports not delivered .* 1 batches \(10 reports\) "
                                              r"rejected"):
            sender.close()
    assert any("refused for good" in m and "scripted 422" in m for m in caplog.messages)
    assert delivered(fc) == concat_batches([slice_batch(batch, 0, 10), slice_batch(batch, 20, 30)])


def test_a_refused_token_stops_delivery_keeps_the_queue_and_a_new_sender_delivers_it(tmp_path, caplog):
    path = tmp_path / "o.db"
    with FakeCollector(script=[401]) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, outbox=path, reports_per_batch=5, **FAST)
        with caplog.at_level(logging.DEBUG, logger="ingest"):
            sender.send(reports(20))
            t = time.monotonic()
            with pytest.raises(SenderError, match=r"4 batches \(20 reports\) still queued .*answered 401 "
                                                  r"invalid_token: scripted 401; .*delivery stopped") as exc:
                sender.flush(10)
            assert time.monotonic() - t < 2 and exc.value.queued == 4
            time.sleep(0.3)
            assert len(fc.requests) == 1  # nothing after the 401
            st = sender.stats
            assert st.stopped and st.last_error == "401 invalid_token: scripted 401" and st.queued == 4
            with pytest.raises(SenderError, match=r"kept in .*o\.db"):
                sender.close(timeout=0.1)
        assert TOKEN not in caplog.text and TOKEN not in repr(sender) and TOKEN not in str(exc.value)
        keys = [b.key for b in Outbox(path).batches()]
    with FakeCollector(schemas=KNOWN) as fc2:
        with CollectorSender(fc2.url, "new-token", SCHEMA, outbox=path) as again:
            again.flush(10)
        assert fc2.accepted_keys() == keys and fc.requests[0].key == keys[0]
        assert fc2.accepted[keys[0]] == fc.requests[0].body


def test_max_attempts_moves_the_batch_to_rejected():
    with FakeCollector(default=503, retry_after=0) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, max_attempts=3, **FAST)
        sender.send(reports(4))
        with pytest.raises(SenderError, match=r"1 batches \(4 reports\) rejected"):
            sender.flush(10)
        (rej,) = sender.outbox.rejected()
        assert (rej.status, rej.error, rej.attempts) == (503, "max_attempts", 3)
        assert rej.reason == "gave up after 3 attempts; the last got 503 overloaded: scripted 503"
        assert len(fc.requests) == 3
        with pytest.raises(SenderError):
            sender.close()


def test_a_stalled_collector_times_the_flush_out_and_close_breaks_the_post_off(tmp_path):
    with FakeCollector(default="stall") as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, outbox=tmp_path / "o.db", timeout_s=30)
        sender.send(reports(7))
        with pytest.raises(SenderError, match=r"1 batches \(7 reports\) still queued") as exc:
            sender.flush(0.3)
        assert exc.value.undelivered == 7
        t = time.monotonic()
        with pytest.raises(SenderError):
            sender.close(timeout=0.2)
        assert time.monotonic() - t < 2
    assert Outbox(tmp_path / "o.db").counts()["queued"] == 1


def test_close_breaks_off_a_post_on_a_kept_alive_connection_without_posting_again():
    with FakeCollector(script=["accept", "stall"]) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=2, timeout_s=30)
        sender.send(reports(4))
        deadline = time.monotonic() + 10
        while len(fc.requests) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t = time.monotonic()
        with pytest.raises(SenderError, match=r"1 batches \(2 reports\) still queued"):
            sender.close(timeout=0.1)
        assert time.monotonic() - t < 2
        time.sleep(0.1)
        assert len(fc.requests) == 2 and fc.requests[0].key != fc.requests[1].key


def test_outbox_full_refuses_the_send_and_loses_nothing():
    with FakeCollector(default="stall") as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=10, max_batches=3)
        sender.send(reports(20))
        with pytest.raises(OutboxFull, match=r"holds 2 batches .* 2 more"):
            sender.send(reports(20, seed=1))
        sender.send(reports(5, seed=2))
        assert [b.reports for b in sender.outbox.batches()] == [10, 10, 5]
        with pytest.raises(SenderError):
            sender.close(timeout=0)


def test_lingering_reports_wait_for_a_full_batch_or_the_linger_time():
    batch = reports(25)
    with FakeCollector(schemas=KNOWN) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=10, linger_s=0.3)
        sender.send(slice_batch(batch, 0, 7))
        sender.send(slice_batch(batch, 7, 25))
        time.sleep(0.15)
        assert [decode(fc.accepted[k], KNOWN).n for k in fc.accepted_keys()] == [10, 10]
        sender.flush(5)
        sender.close()
    assert [decode(fc.accepted[k], KNOWN).n for k in fc.accepted_keys()] == [10, 10, 5]
    assert delivered(fc) == batch


def test_send_is_thread_safe():
    with FakeCollector(schemas=KNOWN) as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA, reports_per_batch=7)
        threads = [threading.Thread(target=lambda s=s: [sender.send(reports(13, seed=s * 10 + i))
                                                        for i in range(5)]) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sender.close()
    assert sender.stats.reports_accepted == 4 * 5 * 13 == delivered(fc).n
    assert len(fc.accepted_keys()) == len(set(fc.accepted_keys())) == 4 * 5 * 2


_CHILD = """
import sys, time
from ingest.client.schema import TelemetrySchema
from ingest.device.sender import CollectorSender
from tests.ingest.device.test_sender import SCHEMA_DICT, reports
sender = CollectorSender(sys.argv[1], "tok", TelemetrySchema.from_dict(SCHEMA_DICT), outbox=sys.argv[2],
                         reports_per_batch=int(sys.argv[3]), backoff_initial_s=0.01, backoff_max_s=0.02)
for i in range(int(sys.argv[4])):
    sender.send(reports(int(sys.argv[3]), seed=100 * int(sys.argv[5]) + i))
print("queued", flush=True)
sender.flush(60)
sender.close()
print("done", flush=True)
"""


def _child(url: str, outbox, per: int, batches: int, seed: int) -> subprocess.Popen:
    argv = [url, str(outbox), str(per), str(batches), str(seed)]
    return subprocess.Popen([sys.executable, "-c", _CHILD, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_sigkill_mid_run_leaves_the_rows_and_a_second_process_delivers_them_with_the_same_keys(tmp_path):
    path = tmp_path / "o.db"
    with FakeCollector(default="stall") as stalled:
        child = _child(stalled.url, path, 4, 5, seed=1)
        try:
            assert child.stdout.readline().strip() == "queued"
            deadline = time.monotonic() + 10
            while not stalled.requests:  # the first POST is open, unanswered
                assert time.monotonic() < deadline
                time.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            assert child.wait(10) == -signal.SIGKILL
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
            child.stderr.close()
        first_key, first_body = stalled.requests[0].key, stalled.requests[0].body
    box = Outbox(path)
    keys = [b.key for b in box.batches()]
    assert len(keys) == 5 and keys[0] == first_key
    with FakeCollector(schemas=KNOWN) as fc:
        with CollectorSender(fc.url, TOKEN, SCHEMA, outbox=box) as sender:
            sender.flush(10)
        assert fc.accepted_keys() == keys and fc.accepted[first_key] == first_body
        assert delivered(fc) == concat_batches([reports(4, seed=100 + i) for i in range(5)])


def test_two_processes_on_one_outbox_never_deliver_one_row_at_the_same_time(tmp_path):
    path = tmp_path / "o.db"
    Outbox(path).close()
    with FakeCollector(default=("slow", 0.02), schemas=KNOWN) as fc:
        children = [_child(fc.url, path, 3, 12, seed=s) for s in (1, 2)]
        try:
            outs = [c.communicate(timeout=60) for c in children]
        finally:
            for c in children:
                c.kill()
                c.wait()
        assert [c.returncode for c in children] == [0, 0], outs
        assert fc.overlaps == []
        spans = sorted((r.arrived, r.done) for r in fc.requests)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no two POSTs open at once
        accepted = fc.accepted_keys()
        assert len(accepted) == len(set(accepted)) == len(fc.requests) == 24
    assert Outbox(path).counts()["queued"] == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_verifies_the_certificate_against_the_ca_file(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    with FakeCollector(tls=(str(cert), str(key)), schemas=KNOWN) as fc:
        assert fc.url.startswith("https://")
        # without the CA file the self-signed certificate is not trusted: retried, never delivered
        untrusting = CollectorSender(fc.url, TOKEN, SCHEMA, **FAST)
        untrusting.send(reports(3))
        with pytest.raises(SenderError, match=r"1 batches \(3 reports\) still queued.*"
                                              r"CERTIFICATE_VERIFY_FAILED"):
            untrusting.flush(0.5)
        assert fc.accepted_keys() == [] and untrusting.stats.retries >= 1
        with pytest.raises(SenderError):
            untrusting.close(timeout=0)
        with CollectorSender(fc.url, TOKEN, SCHEMA, ca_file=cert) as sender:
            sender.send(reports(3))
            sender.flush(10)
        assert delivered(fc) == reports(3)


def test_a_token_file_readable_by_others_is_refused_naming_the_path(tmp_path):
    f = tmp_path / "token"
    f.write_text(f"  {TOKEN}\n")
    f.chmod(0o644)
    with pytest.raises(TokenFileError, match=r"token file '.*token' has mode 0644: group or others may read "
                                             r"it; run chmod 600") as exc:
        read_token_file(f)
    assert exc.value.path == str(f) and TOKEN not in str(exc.value)
    f.chmod(0o600)
    assert read_token_file(f) == TOKEN
    for content, what in ((b" \n", "is empty"), (b"a\nb\n", "one token"), (b"a b", "one token")):
        f.write_bytes(content)
        with pytest.raises(TokenFileError, match=what):
            read_token_file(f)
    with pytest.raises(TokenFileError, match="cannot be read: No such file"):
        read_token_file(tmp_path / "missing")
    with pytest.raises(TokenFileError, match="not a regular file"):
        read_token_file(tmp_path)


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    (("ftp://h", TOKEN), {}, r"url must be an http:// or https:// URL"),
    (("http://", TOKEN), {}, r"url must be an http:// or https:// URL"),
    (("http://h:99999", TOKEN), {}, r"url must be .* port in \[1, 65535\]"),
    (("http://h:0", TOKEN), {}, r"url must be .* port in \[1, 65535\]"),
    (("http://u:p@h", TOKEN), {}, r"no user, query or fragment"),
    (("http://h?x=1", TOKEN), {}, r"no user, query or fragment"),
    ((3, TOKEN), {}, r"url must be"),
    (("http://h", ""), {}, r"token must be a non-empty string"),
    (("http://h", "a b"), {}, r"token must be .*\(no spaces"),
    (("http://h", TOKEN), {"reports_per_batch": 0}, r"reports_per_batch must be an integer in "
                                                     r"\[1, 1000000\]"),
    (("http://h", TOKEN), {"linger_s": -1}, r"linger_s must be a finite number of seconds in \[0, 3600\]"),
    (("http://h", TOKEN), {"timeout_s": 0}, r"timeout_s must be a finite number of seconds in \(0, 3600\]"),
    (("http://h", TOKEN), {"backoff_initial_s": float("inf")}, r"backoff_initial_s must be"),
    (("http://h", TOKEN), {"backoff_initial_s": 2, "backoff_max_s": 1}, r"backoff_max_s must be >= "
                                                                         r"backoff_initial_s"),
    (("http://h", TOKEN), {"max_attempts": 0}, r"max_attempts must be an integer in \[1, 1000000\] "
                                                r"\(or None"),
    (("http://h", TOKEN), {"ca_file": "ca.pem"}, r"ca_file is given but url 'http://h' is not https://"),
    (("https://h", TOKEN), {"ca_file": "/no/such/ca.pem"}, r"ca_file '/no/such/ca.pem' cannot be loaded"),
    (("http://h", TOKEN), {"rng": 5}, r"rng must be a random.Random or numpy Generator"),
    (("http://h", TOKEN), {"max_batches": 0}, r"max_batches must be an integer"),
])
def test_bad_parameters_name_themselves(args, kwargs, match):
    with pytest.raises(ConfigError, match=match) as exc:
        CollectorSender(*args, SCHEMA, **kwargs)
    assert TOKEN not in str(exc.value)


def test_a_batch_of_another_schema_or_a_closed_sender_is_refused():
    from ingest.errors import SchemaError

    other = TelemetrySchema.from_dict({**SCHEMA_DICT, "name": "other"})
    with FakeCollector() as fc:
        sender = CollectorSender(fc.url, TOKEN, SCHEMA)
        rng = np.random.default_rng(0)
        with pytest.raises(SchemaError, match="does not match the sender's schema"):
            sender.send(Privatizer(other, rng).privatize_batch({"a": rng.random(2)}))
        with pytest.raises(SchemaError, match="must be a ReportBatch"):
            sender.send({"a": [1.0]})
        sender.close()
        with pytest.raises(SenderError, match="closed"):
            sender.send(reports(1))
