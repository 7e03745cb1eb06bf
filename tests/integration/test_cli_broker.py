"""``ldp-stream broker`` as a user runs it: what it says about storage, and every ordinary way of
stopping it (signals to it, a kill of its process group, SIGKILL) also stops its Tansu child
(docs/kafka.md §1)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from ingest.local.processes import free_port, port_is_free

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of ``pid`` from /proc, or ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], fields[19]  # state, starttime (clock ticks since boot)


class _Proc:
    """A process identified by pid and start time (a reused pid is another process)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        stat = _stat(pid)
        assert stat is not None, f"pid {pid} does not exist"
        self.start = stat[1]

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"

    def wait_gone(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()


def _port_freed(port: int, timeout: float = 10.0) -> bool:
    """Whether 127.0.0.1:``port`` can be bound again within ``timeout`` s (the kernel closes a
    killed process's listening socket as it reaps it, a moment after /proc shows it gone)."""
    deadline = time.monotonic() + timeout
    while not port_is_free("127.0.0.1", port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """``ldp-stream broker ARGS`` in a session (and process group) of its own, as a shell job is."""
    return subprocess.Popen([sys.executable, "-m", "aggregator.cli", "broker", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=env, start_new_session=True)


def _read_start(proc: subprocess.Popen) -> tuple[int, int, str]:
    """The port and Tansu pid a started CLI printed, and its stderr start-up lines."""
    m = re.fullmatch(r"bootstrap_servers=127\.0\.0\.1:(\d+)", proc.stdout.readline().strip())
    assert m, "no bootstrap_servers line"
    lines = [proc.stderr.readline().strip(), proc.stderr.readline().strip()]
    t = re.match(r"Tansu pid (\d+) on 127\.0\.0\.1:(\d+);", lines[0])
    assert t and t.group(2) == m.group(1), lines
    return int(m.group(1)), int(t.group(1)), "\n".join(lines)


def _cleanup(proc: subprocess.Popen, tansu: _Proc | None) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if tansu is not None and tansu.alive():
        os.kill(tansu.pid, signal.SIGKILL)
    proc.stdout.close()
    proc.stderr.close()


def test_broker_cli_says_its_storage_is_in_memory():
    proc = _start_cli("--port", "0")
    tansu = None
    try:
        port, pid, lines = _read_start(proc)
        tansu = _Proc(pid)
        assert lines.splitlines()[1] == (
            "storage memory://tansu/: in memory only, every topic and record is lost when this broker "
            "stops (the shipped Tansu build has no file, sqlite or postgres store; --storage-url "
            "s3://BUCKET/ keeps them in an S3 bucket)")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert tansu.wait_gone()
        assert _port_freed(port)
    finally:
        _cleanup(proc, tansu)


# (signal, sent to the CLI process alone or to its whole process group, the CLI's exit status)
STOPS = [
    (signal.SIGINT, "process", 0),
    (signal.SIGTERM, "process", 0),
    (signal.SIGHUP, "process", 0),
    (signal.SIGINT, "group", 0),
    (signal.SIGTERM, "group", 0),
    (signal.SIGHUP, "group", 0),
    (signal.SIGKILL, "process", -signal.SIGKILL),  # nothing of ours runs: PR_SET_PDEATHSIG
    (signal.SIGKILL, "group", -signal.SIGKILL),
]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's")
@pytest.mark.parametrize(("sig", "target", "status"), STOPS,
                         ids=[f"{s.name}-{t}" for s, t, _ in STOPS])
def test_stopping_the_broker_cli_stops_tansu(sig, target, status):
    proc = _start_cli("--port", str(free_port()))
    tansu = None
    try:
        port, pid, _ = _read_start(proc)
        tansu = _Proc(pid)
        assert tansu.alive()
        if target == "group":
            os.killpg(proc.pid, sig)  # kill -SIG -- -PGID (the CLI leads its own group)
        else:
            proc.send_signal(sig)
        assert proc.wait(timeout=30) == status
        assert tansu.wait_gone(), f"Tansu pid {pid} outlived ldp-stream broker stopped by {sig.name}"
        assert _port_freed(port)
    finally:
        _cleanup(proc, tansu)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_stop_signal_during_start_up_stops_tansu():
    """SIGTERM as soon as Tansu exists, before it answers: the CLI waits for the start, stops it, exits 0."""
    proc = _start_cli("--port", str(free_port()))
    tansu = None
    try:
        deadline = time.monotonic() + 30
        while tansu is None and time.monotonic() < deadline and proc.poll() is None:
            kids = _children(proc.pid)
            if kids:
                tansu = _Proc(kids[0])
            else:
                time.sleep(0.005)
        assert tansu is not None, "ldp-stream broker started no child"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert tansu.wait_gone()
    finally:
        _cleanup(proc, tansu)


@pytest.mark.slow
def test_broker_cli_s3_storage_keeps_a_topic_across_restarts():
    """``--storage-url s3://BUCKET/`` against moto's S3 server on 127.0.0.1: the records of a topic
    produced before the broker is stopped (SIGTERM) are read back from a broker started again."""
    from kafka.admin import NewTopic

    from benchmarks._s3 import MotoS3Server, find_moto_server
    from ingest.kafka.clients import admin_client, producer_client, topic_records
    from ingest.kafka.settings import KafkaSettings

    try:
        find_moto_server()
    except RuntimeError as exc:  # moto is no project dependency (benchmarks/_s3.py)
        pytest.skip(str(exc))

    port = free_port()
    with MotoS3Server(bucket="tansu") as s3:
        env = {**os.environ, **s3.broker_env()}
        assert env["AWS_ENDPOINT"].startswith("http://127.0.0.1:")
        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}")
        sent = [f"r{i}".encode() for i in range(20)]
        for run in range(2):
            proc = _start_cli("--port", str(port), "--storage-url", s3.storage_url, env=env)
            tansu = None
            try:
                _, pid, lines = _read_start(proc)
                tansu = _Proc(pid)
                assert lines.splitlines()[1] == (
                    f"storage s3://tansu/ at {s3.endpoint}: topics and records are kept in the bucket "
                    "and served again by a broker started with the same --storage-url")
                if run == 0:
                    admin = admin_client(settings)
                    try:
                        admin.create_topics([NewTopic("kept", num_partitions=2, replication_factor=1)])
                    finally:
                        admin.close()
                    producer = producer_client(settings)
                    try:
                        for i, value in enumerate(sent):
                            producer.send("kept", value=value, partition=i % 2)
                        producer.flush(timeout=30)
                    finally:
                        producer.close()
                else:
                    records = topic_records(settings, "kept", timeout_s=30)
                    assert {r.partition for r in records} == {0, 1}
                    assert sorted(r.value for r in records) == sorted(sent)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=30) == 0
                assert tansu.wait_gone()
            finally:
                _cleanup(proc, tansu)
