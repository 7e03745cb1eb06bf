"""EmbeddedBroker storage_url / env / kill / restart arguments, without a broker or an S3 server.

The launched command is captured by a fake ``subprocess.Popen`` that "exits" at once, so these
tests need neither the Tansu binary nor moto (the S3 round trip is measured by hand, see
``benchmarks/_s3.py``).
"""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from ingest.errors import BrokerError, ConfigError
from ingest.local import broker as broker_mod
from ingest.local.broker import EmbeddedBroker
from ingest.local.processes import free_port


class _ExitedAtOnce:
    """Stands in for the broker process: records its argv/env and reports exit status 3."""

    calls: ClassVar[list[dict]] = []

    def __init__(self, cmd, **kwargs):
        _ExitedAtOnce.calls.append({"cmd": list(cmd), "env": dict(kwargs["env"])})
        self.pid = 999999
        self.returncode = 3

    def poll(self):
        return 3

    def wait(self, timeout=None):
        return 3


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """Run ``EmbeddedBroker(**kw).start()`` against the fake process; return its argv and env."""
    binary = tmp_path / "tansu"
    binary.write_text("#!/bin/sh\nexit 3\n")
    binary.chmod(0o755)
    monkeypatch.setattr(broker_mod.subprocess, "Popen", _ExitedAtOnce)
    monkeypatch.setenv("STORAGE_ENGINE", "postgres://should-not-leak")

    def run(**kw):
        _ExitedAtOnce.calls.clear()
        port = free_port()
        b = EmbeddedBroker(port=port, binary=str(binary), startup_timeout=2.0, **kw)
        with pytest.raises(BrokerError, match="exited with status 3"):
            b.start()
        assert len(_ExitedAtOnce.calls) == 1
        return port, str(binary), _ExitedAtOnce.calls[0]

    return run


def test_default_command_and_environment_are_unchanged(captured):
    port, binary, call = captured()
    url = f"tcp://127.0.0.1:{port}"
    assert call["cmd"] == [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                           "--storage-engine", "memory://tansu/"]
    expected = {k: v for k, v in os.environ.items() if k not in broker_mod._TANSU_ENV}
    assert call["env"] == expected
    assert "STORAGE_ENGINE" not in call["env"]


def test_s3_storage_and_env_reach_the_process(captured):
    env = {"AWS_ENDPOINT": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true",
           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    _, _, call = captured(storage_url="s3://tansu/", env=env)
    assert call["cmd"][-2:] == ["--storage-engine", "s3://tansu/"]
    for k, v in env.items():
        assert call["env"][k] == v


def test_env_is_copied_at_construction():
    env = {"AWS_ALLOW_HTTP": "true"}
    b = EmbeddedBroker(storage_url="s3://tansu/", env=env)
    env["AWS_ALLOW_HTTP"] = "false"
    assert b._extra_env == {"AWS_ALLOW_HTTP": "true"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"storage_url": "sqlite://tansu.db"}, "storage_url must be"),
        ({"storage_url": "file:///tmp/x"}, "storage_url must be"),
        ({"storage_url": "s3://"}, "storage_url must be"),
        ({"storage_url": "memory://"}, "storage_url must be"),
        ({"storage_url": None}, "storage_url must be"),
        ({"env": [("AWS_ENDPOINT", "x")]}, "env must be a dict"),
        ({"env": {"AWS_ENDPOINT": 1}}, "env must map"),
        ({"env": {"": "x"}}, "env must map"),
        ({"env": {"STORAGE_ENGINE": "memory://x/"}}, "env must not set 'STORAGE_ENGINE'"),
        ({"env": {"LISTENER_URL": "tcp://0.0.0.0:1"}}, "env must not set 'LISTENER_URL'"),
    ],
)
def test_bad_storage_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EmbeddedBroker(**kwargs)


def test_kill_and_restart_need_a_broker_that_ran():
    b = EmbeddedBroker()
    with pytest.raises(BrokerError, match="cannot kill: broker is not running"):
        b.kill()
    with pytest.raises(BrokerError, match="cannot restart: the broker never ran"):
        b.restart()
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(ConfigError, match="timeout must be > 0"):
            b.restart(timeout=bad)

