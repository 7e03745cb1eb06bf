"""How the demo waits for its child processes (``aggregator.demo.children``): as long as a child
is alive and starting, saying once what it does when the wait is long; at once with the tail of
its log when one has died."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from aggregator.demo.children import Child, ChildExited, exited_ok, stop_all, wait_ready
from ingest.local.processes import spawn_process


class FakeProc:
    """A ``Popen`` stand-in: running until ``exit_at`` (fake clock seconds), then ``status``."""

    def __init__(self, clock, exit_at: float | None = None, status: int = 0) -> None:
        self.clock, self.exit_at, self.status = clock, exit_at, status
        self.returncode = None

    def poll(self):
        if self.exit_at is not None and self.clock() >= self.exit_at:
            self.returncode = self.status
        return self.returncode


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def _child(tmp_path: Path, name: str, proc, log: str = "") -> Child:
    path = tmp_path / f"{name}.log"
    path.write_text(log)
    return Child(name, proc, path)


def test_an_alive_but_slow_child_is_waited_for_and_the_long_wait_named_once(tmp_path):
    clock = FakeClock()
    # serve: alive, compiling for 300 s (five times the old fixed 60 s); the worker is up at once
    serve = _child(tmp_path, "serve", FakeProc(clock),
                   "ldp-stream serve: compiling the numba kernels (first start only; numba caches "
                   "them for the next) …\n")
    worker = _child(tmp_path, "worker-1", FakeProc(clock))
    said: list[str] = []
    waited = wait_ready([serve, worker], lambda c: c is worker or clock() >= 300.0, say=said.append,
                        slow_after_s=10.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert waited == pytest.approx(300.0, abs=0.6)
    assert len(said) == 1  # once, however long the wait
    assert said[0].startswith("waiting for serve (10 s so far; alive")
    assert "serve: compiling the numba kernels (first start only" in said[0]
    assert "worker-1" not in said[0]  # ready: no longer awaited


def test_a_child_that_dies_fails_the_wait_at_once_with_its_log_tail(tmp_path):
    clock = FakeClock()
    lines = "".join(f"line {i}\n" for i in range(20)) + "ldp-stream serve: error: port 8080 is taken\n"
    serve = _child(tmp_path, "serve", FakeProc(clock, exit_at=2.0, status=2), lines)
    worker = _child(tmp_path, "worker-1", FakeProc(clock))
    with pytest.raises(ChildExited) as err:
        wait_ready([serve, worker], lambda c: False, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock() == pytest.approx(2.0, abs=0.6)  # the first check after its exit, no deadline
    msg = str(err.value)
    assert msg.startswith("serve exited with status 2; last lines of ")
    assert msg.endswith("ldp-stream serve: error: port 8080 is taken")
    assert "line 13" in msg and "line 12" not in msg  # its last 8 lines
    assert err.value.child is serve


def test_a_child_that_must_stay_up_fails_the_wait_when_it_dies(tmp_path):
    clock = FakeClock()
    up = _child(tmp_path, "worker-1", FakeProc(clock, exit_at=5.0, status=-9))  # killed meanwhile
    slow = _child(tmp_path, "serve", FakeProc(clock))
    with pytest.raises(ChildExited, match=r"^worker-1 exited with status -9; its log .* is empty$"):
        wait_ready([slow], lambda c: False, keep_alive=[up], clock=clock, sleep=clock.sleep)


def test_a_one_shot_child_is_ready_once_it_exited_zero(tmp_path):
    clock = FakeClock()
    ok = _child(tmp_path, "kernels", FakeProc(clock, exit_at=40.0, status=0))
    assert wait_ready([ok], exited_ok, clock=clock, sleep=clock.sleep) == pytest.approx(40.0, abs=0.3)
    bad = _child(tmp_path, "kernels", FakeProc(clock, exit_at=clock() + 3.0, status=1),
                 "numba.core.errors.TypingError: Failed in nopython mode\n")
    with pytest.raises(ChildExited, match=r"(?s)status 1; last lines .*TypingError"):
        wait_ready([bad], exited_ok, clock=clock, sleep=clock.sleep)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
def test_real_processes_a_slow_one_waited_for_a_dead_one_reported(tmp_path):
    flag = tmp_path / "up"
    slow = ("import pathlib, time; print('ldp-stream serve: compiling the numba kernels …', flush=True); "
            f"time.sleep(1.0); pathlib.Path({str(flag)!r}).touch(); time.sleep(60)")
    dies = "import sys, time; time.sleep(0.3); print('Traceback: boom', flush=True); sys.exit(3)"
    children = []
    for name, code in (("serve", slow), ("worker-1", dies)):
        log = tmp_path / f"{name}.log"
        children.append(Child(name, spawn_process([sys.executable, "-c", code], log_path=log), log))
    serve, worker = children
    try:
        said: list[str] = []
        assert wait_ready([serve], lambda c: flag.exists(), say=said.append, slow_after_s=0.5,
                          poll_s=0.05) >= 0.9
        assert said and "serve: compiling the numba kernels …" in said[0]
        worker.proc.wait(30)
        t0 = time.monotonic()
        with pytest.raises(ChildExited, match=r"worker-1 exited with status 3; .*\nTraceback: boom$"):
            wait_ready([serve], lambda c: False, keep_alive=[worker], poll_s=0.05)
        assert time.monotonic() - t0 < 1.0
    finally:
        stop_all(children, timeout=5)
    assert serve.proc.returncode == -signal.SIGTERM
