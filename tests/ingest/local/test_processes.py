"""The one set of port and child-process helpers (``ingest.local.processes``)."""

from __future__ import annotations

import signal
import socket
import sys
import time

from ingest.local.processes import free_port, port_is_free, spawn_process, stop_process, stop_processes


def test_free_port_is_bindable():
    port = free_port()
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free("127.0.0.1", port)


def test_spawn_logs_and_stop_reports_the_exit_status(tmp_path):
    log = tmp_path / "child.log"
    code = "import sys, time; print('up', flush=True); sys.stderr.write('err\\n'); time.sleep(60)"
    proc = spawn_process([sys.executable, "-c", code], log_path=log)
    try:
        for _ in range(500):
            if "err" in log.read_text():
                break
            time.sleep(0.01)
        assert stop_process(proc, timeout=10) == -signal.SIGTERM
        assert stop_process(proc, timeout=10) == -signal.SIGTERM  # already gone: its status
    finally:
        stop_process(proc, timeout=1, sig=signal.SIGKILL)
    assert log.read_text().split() == ["up", "err"]


def test_spawn_passes_the_parent_to_watch(tmp_path):
    import os

    from ingest.local.processes import EXIT_WITH_PARENT_ENV

    log = tmp_path / "env.log"
    code = f"import os; print(os.environ.get({EXIT_WITH_PARENT_ENV!r}))"
    proc = spawn_process([sys.executable, "-c", code], log_path=log, exit_with_parent=True)
    assert proc.wait(30) == 0
    assert log.read_text().strip() == str(os.getpid())
    proc = spawn_process([sys.executable, "-c", code], log_path=log, env={"PATH": os.environ["PATH"]})
    assert proc.wait(30) == 0
    assert log.read_text().split()[-1] == "None"
    assert stop_process(proc, timeout=1, sig=signal.SIGKILL) == 0


def test_stop_processes_stops_them_at_once_and_kills_the_stubborn(tmp_path):
    # two children that take 1.5 s to stop on SIGTERM stop together (≈ 1.5 s, not 3 s); one
    # that ignores SIGTERM is killed when the shared timeout is over
    slow = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), "
            "sys.exit(0))); print('up', flush=True); time.sleep(60)")
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
    logs = [tmp_path / f"c{i}.log" for i in range(3)]
    procs = [spawn_process([sys.executable, "-c", code], log_path=log)
             for code, log in zip((slow, slow, stubborn), logs, strict=True)]
    try:
        for log in logs:  # every handler is installed
            for _ in range(1000):
                if "up" in log.read_text():
                    break
                time.sleep(0.01)
        t0 = time.monotonic()
        assert stop_processes(procs[:2], timeout=10) == [0, 0]
        assert time.monotonic() - t0 < 2.8
        t0 = time.monotonic()
        assert stop_processes(procs, timeout=0.5) == [0, 0, -signal.SIGKILL]
        assert time.monotonic() - t0 < 5
    finally:
        for p in procs:
            stop_process(p, timeout=1, sig=signal.SIGKILL)
