"""EmbeddedBroker: start/stop, no stray process, port-in-use errors, freeze/thaw (docs/kafka.md §1)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ingest.errors import BrokerError, ConfigError
from ingest.kafka.clients import admin_client
from ingest.kafka.settings import KafkaSettings
from ingest.local.broker import EmbeddedBroker
from ingest.local.processes import free_port


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _cluster(bootstrap: str) -> dict:
    admin = admin_client(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=5000)
    try:
        return admin.describe_cluster()
    finally:
        admin.close()


def test_session_broker_answers_metadata(broker):
    host, port = broker.bootstrap_servers.split(":")
    assert host == "127.0.0.1"
    assert int(port) == broker.port
    meta = _cluster(broker.bootstrap_servers)
    assert meta["brokers"][0]["port"] == broker.port
    assert meta["brokers"][0]["host"] == "127.0.0.1"


def test_start_stop_leaves_no_process():
    b = EmbeddedBroker()
    with pytest.raises(BrokerError, match="not running"):
        _ = b.bootstrap_servers
    b.start()
    pid = b.pid
    assert pid is not None and _alive(pid)
    assert b.running
    assert _cluster(b.bootstrap_servers)["brokers"]
    log_dir = b.log_path.parent
    b.stop()
    assert not _alive(pid)
    assert b.pid is None and not b.running
    assert not log_dir.exists()
    b.stop()  # idempotent


def test_context_manager_stops_broker_when_body_raises():
    pid = None
    with pytest.raises(RuntimeError, match="boom"), EmbeddedBroker() as b:
        pid = b.pid
        assert _alive(pid)
        raise RuntimeError("boom")
    assert pid is not None
    assert not _alive(pid)


def test_explicit_free_port_is_used():
    port = free_port()
    with EmbeddedBroker(port=port) as b:
        assert b.bootstrap_servers == f"127.0.0.1:{port}"
        assert _cluster(b.bootstrap_servers)["brokers"][0]["port"] == port


def test_port_in_use_raises_naming_the_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        b = EmbeddedBroker(port=port)
        with pytest.raises(BrokerError, match=rf"port {port} .*already in use.*omit"):
            b.start()
        assert b.pid is None


def test_port_of_running_broker_is_refused(broker):
    with pytest.raises(BrokerError, match=str(broker.port)):
        EmbeddedBroker(port=broker.port).start()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"host": "0.0.0.0"}, "host must be"),
        ({"port": 0}, "port must be"),
        ({"port": 70000}, "port must be"),
        ({"port": "9092"}, "port must be"),
        ({"startup_timeout": 0}, "startup_timeout must be > 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EmbeddedBroker(**kwargs)


def test_missing_binary_is_a_broker_error(tmp_path):
    with pytest.raises(BrokerError, match="not an executable"):
        EmbeddedBroker(binary=str(tmp_path / "nope")).start()


def test_kill_and_restart_on_the_same_port():
    with EmbeddedBroker() as b:
        port, pid = b.port, b.pid
        assert b.kill() == -signal.SIGKILL
        assert not b.running and _wait_gone(pid)
        with pytest.raises(BrokerError, match="not running"):
            b.bootstrap_servers  # noqa: B018
        assert b.restart() is b
        assert b.port == port and b.pid != pid
        assert _cluster(b.bootstrap_servers)["brokers"][0]["port"] == port
        with pytest.raises(BrokerError, match="cannot restart: broker is running"):
            b.restart()
    assert b.pid is None


def test_freeze_and_thaw():
    with EmbeddedBroker() as b:
        b.freeze()
        assert b.frozen and _state(b.pid) == "T"
        b.thaw()
        assert not b.frozen and _state(b.pid) != "T"
        assert _cluster(b.bootstrap_servers)["brokers"]
        b.freeze()
        pid = b.pid
    assert not _alive(pid)  # stop() of a frozen broker still ends it


def test_broker_dies_with_killed_parent():
    """A SIGKILLed owner process (no cleanup runs) still leaves no broker behind."""
    code = textwrap.dedent(
        """
        import sys, time
        from ingest.local.broker import EmbeddedBroker
        b = EmbeddedBroker().start()
        print(b.pid, b.log_path.parent, flush=True)
        time.sleep(120)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        line = child.stdout.readline()
        assert line.strip(), "child did not start a broker"
        pid_text, workdir = line.split(maxsplit=1)
        pid = int(pid_text)
        assert _alive(pid)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert _wait_gone(pid), f"broker pid {pid} survived its killed parent"
        # nothing of the killed owner could remove the broker's work directory (its log): we do
        assert os.path.isdir(workdir.strip()), workdir
        shutil.rmtree(workdir.strip())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
