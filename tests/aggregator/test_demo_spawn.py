"""How the demo starts its processes: no fork that can hang a matrix product on another thread,
and children that stop when the demo dies (``aggregator.demo.children.spawn``,
``ingest.local.processes.exit_with_parent``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")


def _run(script: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_spawning_children_does_not_hang_a_matrix_product_on_another_thread(tmp_path):
    # The demo computes the non-private truth (OpenBLAS products over every flight) on a thread
    # while it starts workers and serve. Children started with preexec_fn make subprocess fork
    # the whole process and run OpenBLAS's fork handler, which can leave such a product spinning
    # forever at 100 % CPU. The script prints "stuck" unless the product thread finishes after 12
    # spawns.
    script = f"""
        import threading
        import numpy as np
        from pathlib import Path
        from aggregator.demo import children

        rng = np.random.default_rng(1)
        z = rng.standard_normal((327_346, 2))
        b = rng.standard_normal(2)
        stop = threading.Event()
        done = []

        def products():
            while not stop.is_set():
                (z.T * (z @ b)) @ z
                z.T @ z
            done.append(True)

        t = threading.Thread(target=products, daemon=True)
        t.start()
        for i in range(12):
            child = children.spawn(f"c{{i}}", ["--help"], Path({str(tmp_path)!r}))
            assert child.proc.wait(timeout=60) == 0, child.tail()
        stop.set()
        t.join(timeout=30)
        print("ok" if done else "stuck")
    """
    proc = _run(script, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_CHILD = ("from ingest.local.processes import exit_with_parent; import time; exit_with_parent(); "
          "print('started', flush=True); time.sleep(60)")


def _wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_child_stops_when_its_parent_dies():
    # the parent starts the child the way the demo does (env var, no preexec_fn), waits until
    # the child asked for the signal, prints its pid and dies without cleaning up
    script = f"""
        import os, subprocess, sys
        from ingest.local.processes import EXIT_WITH_PARENT_ENV
        env = {{**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())}}
        child = subprocess.Popen([sys.executable, "-c", {_CHILD!r}], env=env, stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
        assert child.stdout.readline().strip() == "started"
        print(child.pid, flush=True)
        os._exit(0)
    """
    proc = _run(script, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = int(proc.stdout.strip())
    try:
        assert _wait_gone(pid, 10), "the child outlived its parent"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_child_of_an_already_dead_parent_stops_at_once():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LDP_STREAM_EXIT_WITH_PARENT": "1"}  # pid 1: not our parent
    cmd = [sys.executable, "-c", _CHILD]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.wait(timeout=30) == -15  # SIGTERM before "started"
            assert child.stdout.read() == ""
        finally:
            if child.poll() is None:
                child.kill()


def test_without_the_variable_nothing_changes():
    env = {k: v for k, v in os.environ.items() if k != "LDP_STREAM_EXIT_WITH_PARENT"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", "from ingest.local.processes import exit_with_parent; "
                           "exit_with_parent(); print('fine')"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert proc.returncode == 0 and proc.stdout.strip() == "fine", proc.stderr


def test_truth_not_ready_in_time_gives_an_empty_truth_not_one_still_being_filled():
    import threading

    from rich.console import Console

    from aggregator.demo import run as demo

    release = threading.Event()
    truth: dict = {}

    def slow():
        release.wait(30)
        truth["q"] = {"p": 1.0}  # what the late thread would add while the report is written

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    console = Console(file=open(os.devnull, "w"))
    try:
        assert demo._join_truth(t, truth, deadline=time.monotonic() + 0.2, console=console) == {}
        release.set()
        t.join(10)
        assert demo._join_truth(t, truth, deadline=time.monotonic() + 0.2, console=console) is truth
        # never started (the run stopped before every process was up): no wait, no truth
        assert demo._join_truth(threading.Thread(target=slow), truth, time.monotonic() + 60, console) == {}
    finally:
        release.set()
        console.file.close()
