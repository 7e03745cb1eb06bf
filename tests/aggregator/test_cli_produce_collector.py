"""``ldp-stream produce --collector URL --token-file F`` against a fake collector on loopback
(docs/devices.md §6): every report delivered, the counts line, the device ledger and the outbox
beside it, and the one-line refusals."""

from __future__ import annotations

import json
import re

import pytest

from aggregator.cli import main
from ingest.client.codec import decode
from ingest.client.schema import TelemetrySchema
from ingest.device.ledger import DeviceLedger
from ingest.device.outbox import Outbox
from ingest.device.sender import CollectorSender
from tests.fake_collector import FakeCollector

SCHEMA_TOML = """name = "dev"
[numeric]
zero_prob = 0.2
scale = 0.5
[[numeric.fields]]
name = "a"
low = 0.0
high = 1.0
"""
DEVICE_TOML = SCHEMA_TOML + '[privacy]\nunit = "device"\nperiod = "1d"\nreports_per_period = 1000\n'
COUNTS = re.compile(r"produced=(\d+) records=(\d+) (skipped\S*=\d+ )+failed=(\d+) collector=(\S+) "
                    r"queued=(\d+) rejected=(\d+) duplicates=(\d+) outbox=(\S+) elapsed_s=")


@pytest.fixture
def files(tmp_path):
    """(schema path, events path with 250 rows of which 3 lack the field, token file path)."""
    schema = tmp_path / "s.toml"
    schema.write_text(SCHEMA_TOML)
    events = tmp_path / "e.jsonl"
    rows = [{"a": (i % 97) / 97} if i % 100 != 7 else {"b": 1} for i in range(253)]
    events.write_text("".join(json.dumps(r) + "\n" for r in rows))
    token = tmp_path / "token"
    token.write_text("device-17-token\n")
    token.chmod(0o600)
    return schema, events, token


def produce(schema, events, token, url, *extra):
    return main(["produce", "--schema", str(schema), "--source", str(events), "--collector", url,
                 "--token-file", str(token), "--seed", "3", "--no-progress", *extra])


def test_every_report_reaches_the_collector_and_the_counts_say_so(files, capsys):
    schema, events, token = files
    known = {TelemetrySchema.load(schema).fingerprint: TelemetrySchema.load(schema)}
    with FakeCollector(script=[503, "drop", 429], retry_after=0, schemas=known) as fc:
        rc = produce(schema, events, token, fc.url, "--batch-size", "40")
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0, out
    m = COUNTS.match(out)
    assert m, out
    produced, records, failed = int(m.group(1)), int(m.group(2)), int(m.group(4))
    assert (produced, failed, m.group(5), m.group(6), m.group(7), m.group(9)) == (
        250, 0, fc.url, "0", "0", ":memory:")
    assert "skipped[missing]=3 " in out
    keys = fc.accepted_keys()
    assert len(keys) == len(set(keys)) == records == 7  # 6 of 40 reports, then 10
    assert sum(decode(fc.accepted[k], known).n for k in keys) == 250
    assert all(r.headers["Authorization"] == "Bearer device-17-token" for r in fc.requests)


def test_undelivered_reports_stay_in_the_outbox_beside_the_ledger_and_resending_spends_no_budget(
        files, tmp_path, capsys):
    _, events, token = files
    schema = tmp_path / "device.toml"
    schema.write_text(DEVICE_TOML)
    ledger = tmp_path / "ledger.db"
    with FakeCollector(default=503, retry_after=0) as fc:
        rc = produce(schema, events, token, fc.url, "--device-ledger", str(ledger), "--flush-timeout", "0.3",
                     "--batch-size", "100")
    cap = capsys.readouterr()
    m = COUNTS.search(cap.out)
    assert rc == 1 and m, cap
    assert (int(m.group(1)), int(m.group(4)), int(m.group(6))) == (0, 250, 250)
    assert m.group(9) == str(tmp_path / "ledger.outbox.db")
    ts = TelemetrySchema.load(schema)
    spent = DeviceLedger(ledger, ts).spent()
    assert spent == 250  # spent once, at privatize time
    box = Outbox(tmp_path / "ledger.outbox.db")
    assert box.counts()["queued_reports"] == 250
    keys = [b.key for b in box.batches()]
    assert set(r.key for r in fc.requests) <= set(keys)
    with FakeCollector(schemas={ts.fingerprint: ts}) as ok:
        with CollectorSender(ok.url, "device-17-token", ts, outbox=box) as sender:
            sender.flush(10)
        assert ok.accepted_keys() == keys
        assert sum(decode(ok.accepted[k], {ts.fingerprint: ts}).n for k in keys) == 250
    assert DeviceLedger(ledger, ts).spent() == spent  # resending spent nothing


def test_a_refused_token_exits_1_with_the_reason(files, capsys, caplog):
    schema, events, token = files
    with FakeCollector(default=401) as fc:
        rc = produce(schema, events, token, fc.url)
    cap = capsys.readouterr()
    assert rc == 1 and len(fc.requests) == 1
    logged = caplog.text + cap.err
    assert "401 invalid_token" in logged and "delivery stopped" in logged
    assert "device-17-token" not in logged + cap.out
    m = COUNTS.search(cap.out)
    assert m and (int(m.group(1)), int(m.group(4))) == (0, 250)


@pytest.mark.parametrize(("extra", "match"), [
    (["--bootstrap-servers", "127.0.0.1:9092"], r"--bootstrap-servers: Kafka flags are not used with "
                                                r"--collector"),
    (["--topic", "t", "--partitions", "2"], r"--topic, --partitions: Kafka flags are not used"),
    (["--kafka-config", "k.toml"], r"--kafka-config: Kafka flags"),
    (["--key", "dev"], r"--key: Kafka flags"),
    (["--flush-timeout", "-1"], r"--flush-timeout must be a finite number of seconds >= 0"),
    (["--outbox", ""], r"--outbox must be a file path, got ''"),
])
def test_kafka_flags_and_bad_values_with_a_collector_are_one_line_exit_2(files, capsys, extra, match):
    schema, events, token = files
    with FakeCollector() as fc:
        rc = produce(schema, events, token, fc.url, *extra)
        assert fc.requests == []
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and re.search(match, err[0]), err


def test_bad_collector_arguments_are_one_line_exit_2(files, tmp_path, capsys):
    schema, events, token = files
    cases = [
        (["--collector", "http://127.0.0.1:9"], r"--collector needs --token-file FILE"),
        (["--token-file", str(token), "--bootstrap-servers", "h:1", "--topic", "t"],
         r"--token-file is only for --collector URL"),
        (["--collector", "ftp://h", "--token-file", str(token)], r"url must be an http:// or https:// URL"),
        (["--collector", "http://h", "--token-file", str(token), "--ca-file", "ca.pem"],
         r"ca_file is given but url 'http://h' is not https://"),
    ]
    loose = tmp_path / "loose"
    loose.write_text("t\n")
    loose.chmod(0o644)
    cases.append((["--collector", "http://h", "--token-file", str(loose)],
                  rf"token file '{re.escape(str(loose))}' has mode 0644"))
    for extra, match in cases:
        rc = main(["produce", "--schema", str(schema), "--source", str(events), "--no-progress", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and re.search(match, err[0]), (extra, err)


def test_the_help_says_where_unsent_batches_go(capsys):
    with pytest.raises(SystemExit):
        main(["produce", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--collector URL" in text and "--token-file FILE" in text and "--ca-file FILE" in text
    assert "without a file, batches not sent by the exit are lost" in text
    assert "reports per Kafka record, or per POST with --collector" in text


def test_a_later_run_on_the_same_outbox_first_sends_what_an_earlier_run_left(files, tmp_path, capsys):
    schema, events, token = files
    outbox = tmp_path / "o.db"
    with FakeCollector(default=503, retry_after=0) as down:
        rc = produce(schema, events, token, down.url, "--outbox", str(outbox), "--flush-timeout", "0.2")
    assert rc == 1
    left = [b.key for b in Outbox(outbox).batches()]
    assert len(left) == 1  # 250 reports, up to 1000 per POST
    ts = TelemetrySchema.load(schema)
    with FakeCollector(schemas={ts.fingerprint: ts}) as up:
        assert produce(schema, events, token, up.url, "--outbox", str(outbox)) == 0
    m = COUNTS.search(capsys.readouterr().out.strip().splitlines()[-1])
    assert m and (int(m.group(1)), int(m.group(4)), m.group(9)) == (500, 0, str(outbox))
    assert up.accepted_keys()[:1] == left and len(up.accepted_keys()) == 2
    assert Outbox(outbox).counts()["queued"] == 0
