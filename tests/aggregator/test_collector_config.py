"""``[collector]`` of the pipeline config and ``ldp-stream collect``'s start-up checks
(docs/collector.md §4, §11): every refusal is one line with exit status 2, before Kafka."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aggregator.cli import main
from aggregator.collector.tokens import mint_token
from aggregator.config import PipelineConfig
from aggregator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "examples" / "flights.schema.toml"
BASE = {"pipeline": {"name": "p", "schema": str(SCHEMA)}}


def cfg(**collector) -> PipelineConfig:
    return PipelineConfig.from_dict({**BASE, "collector": collector}, validate=False)


def test_a_config_without_collector_loads_with_the_defaults(tmp_path):
    p = tmp_path / "p.pipeline.toml"
    p.write_text(f'[pipeline]\nname = "p"\nschema = "{SCHEMA}"\n')
    s = PipelineConfig.load(p).collector
    assert (s.host, s.port, s.token_file, s.max_body_bytes) == ("127.0.0.1", 8090, None, 8 << 20)
    assert (s.idempotency_window_s, s.ack_timeout_s) == (900.0, 10.0)
    assert s.delivery_timeout_s < s.idempotency_window_s


def test_the_example_pipeline_has_a_loopback_collector_with_its_token_file_beside_it():
    """README's ``ldp-stream collect --config`` on a copy of the example needs no edit of it."""
    example = ROOT / "examples" / "flights.pipeline.toml"
    c = PipelineConfig.load(example)
    s = c.collector
    assert s.host == "127.0.0.1" and s.port == 8090
    assert s.token_file == example.parent / "flights.tokens"
    assert s.tls_certfile is None and s.max_body_bytes <= c.worker.max_record_bytes


def test_the_collector_skew_limit_is_the_workers_with_windowed_queries_only():
    """The collector refuses event-time skew exactly when the workers would dead-letter it."""
    from aggregator.collector.config import event_time_skew_limit

    example = PipelineConfig.load(ROOT / "examples" / "flights.pipeline.toml")  # windowed queries
    assert event_time_skew_limit(example) == example.worker.max_event_time_skew_s == 3600.0
    plain = PipelineConfig.from_dict({**BASE, "worker": {"max_event_time_skew_s": 60.0}}, validate=False)
    assert event_time_skew_limit(plain) is None


def test_the_default_body_limit_follows_a_smaller_worker_record_limit():
    c = PipelineConfig.from_dict({**BASE, "worker": {"max_record_bytes": 4096}}, validate=False)
    assert c.collector.max_body_bytes == 4096


@pytest.mark.parametrize(("section", "extra", "words"), [
    ({"max_body_bytes": 9 << 20}, {},
     "max_body_bytes (9437184) must be <= worker.max_record_bytes (8388608)"),
    ({"max_body_bytes": 4096}, {"worker": {"max_record_bytes": 2048}}, "worker.max_record_bytes (2048)"),
    ({"max_body_bytes": 100}, {}, "collector.max_body_bytes: must be >= 1024"),
    ({"port": 70000}, {}, "collector.port: must be <= 65535"),
    ({"delivery_timeout_s": 900.0}, {}, "delivery_timeout_s (900) must be < idempotency_window_s (900)"),
    ({"idempotency_window_s": 10.0}, {}, "delivery_timeout_s (30) must be < idempotency_window_s (10)"),
    ({"ack_timeout_s": 0.0}, {}, "collector.ack_timeout_s: must be a finite number in (0, 3600]"),
    ({"body_timeout_s": "5"}, {}, "collector.body_timeout_s: must be a number"),
    ({"rate_limit_burst": 0}, {}, "collector.rate_limit_burst: must be >= 1"),
    ({"max_inflight_bytes": 2048}, {}, "max_inflight_bytes (2048) must be >= max_body_bytes"),
    ({"idempotency_max_keys": 0}, {}, "collector.idempotency_max_keys: must be >= 1"),
    ({"tls_certfile": "c.pem"}, {}, "tls_certfile and tls_keyfile must be given together"),
    ({"tokens": "x"}, {}, "collector.tokens"),
])
def test_bad_values_are_one_config_error_naming_the_key(section, extra, words):
    with pytest.raises(ConfigError) as info:
        PipelineConfig.from_dict({**BASE, **extra, "collector": section}, validate=False)
    assert words in str(info.value), str(info.value)


def test_relative_paths_are_relative_to_the_config_file(tmp_path):
    p = tmp_path / "sub" / "p.pipeline.toml"
    p.parent.mkdir()
    p.write_text(f'[pipeline]\nname = "p"\nschema = "{SCHEMA}"\n[collector]\ntoken_file = "tokens"\n'
                 'tls_certfile = "/etc/c.pem"\ntls_keyfile = "k.pem"\n')
    s = PipelineConfig.load(p).collector
    assert s.token_file == p.parent / "tokens" and s.tls_certfile == Path("/etc/c.pem")
    assert s.tls_keyfile == p.parent / "k.pem"


def pipeline(tmp_path: Path, collector: str) -> Path:
    p = tmp_path / "p.pipeline.toml"
    p.write_text(f'[pipeline]\nname = "p"\nschema = "{SCHEMA}"\n[kafka]\nbootstrap_servers = '
                 f'"127.0.0.1:1"\n[collector]\nport = 0\n{collector}')
    return p


def one_line_exit_2(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err


def test_collect_refuses_a_token_file_others_may_read(tmp_path, capsys):
    tokens = tmp_path / "tokens"
    mint_token(tokens, "a")
    os.chmod(tokens, 0o644)
    err = one_line_exit_2(capsys, ["collect", "--config", str(pipeline(tmp_path, 'token_file = "tokens"\n'))])
    assert "mode 0644" in err and "chmod 600" in err and "collect: error:" in err


@pytest.mark.parametrize(("collector", "words"), [
    ("", "collector.token_file: required"),
    ('token_file = "missing"\n', "cannot be read"),
    ('token_file = "tokens"\ntls_certfile = "c.pem"\ntls_keyfile = "k.pem"\n',
     "collector.tls_certfile: cannot read"),
    ('token_file = "tokens"\n', "cannot reach Kafka at 127.0.0.1:1"),
])
def test_collect_start_up_refusals_are_one_line(tmp_path, capsys, collector, words):
    mint_token(tmp_path / "tokens", "a")
    err = one_line_exit_2(capsys, ["collect", "--config", str(pipeline(tmp_path, collector))])
    assert words in err, err


def test_collect_bad_flags_are_one_line(tmp_path, capsys):
    mint_token(tmp_path / "tokens", "a")
    p = str(pipeline(tmp_path, 'token_file = "tokens"\n'))
    err = one_line_exit_2(capsys, ["collect", "--config", p, "--port", "-5"])
    assert "--port must be in [0, 65535]" in err
    assert "--host must be" in one_line_exit_2(capsys, ["collect", "--config", p, "--host", " "])
    with pytest.raises(SystemExit) as info:
        main(["collect", "--config", p, "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "unrecognized arguments" in err


def test_collect_help_names_every_flag_and_endpoint(capsys):
    with pytest.raises(SystemExit):
        main(["collect", "--help"])
    out = capsys.readouterr().out
    for words in ("--config", "--host", "--port", "/v1/reports", "/healthz", "/readyz", "/metrics",
                  "token_file", "SIGTERM"):
        assert words in out
    with pytest.raises(SystemExit):
        main(["collect-token", "--help"])
    out = capsys.readouterr().out
    for words in ("--token-file", "--id", "--expires", "0600"):
        assert words in out
