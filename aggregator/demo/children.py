"""The demo's child processes: starting them, waiting for them while they start, stopping them.

A child (:class:`Child`) is an ``ldp-stream`` command (or ``python -m aggregator.warm``) in its
own session with its output in ``<output>/logs/<name>.log``. :func:`wait_ready` waits for
children as long as they are alive — a first start after an install compiles the numba kernels
and takes much longer than the next ones, more so on a loaded machine — says once what they do
when the wait is long, and fails as soon as one has exited, with the last lines of its log.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aggregator.errors import ChildExited
from ingest.local.processes import spawn_process, stop_processes

__all__ = ["Child", "ChildExited", "answers_http", "check_alive", "exited_ok", "spawn", "stop_all",
           "wait_ready"]

#: Seconds after which :func:`wait_ready` says what it is waiting for.
SLOW_AFTER_S = 10.0


@dataclass
class Child:
    """A started child process.

    Attributes
    ----------
    name : str
        Shown in messages and the log's file name (``serve``, ``worker-1``, ``kernels``).
    proc : subprocess.Popen
    log_path : Path
        Its stdout and stderr.
    url : str or None
        What answers once it is up (serve's base URL, a worker's metrics URL).
    """

    name: str
    proc: object
    log_path: Path
    url: str | None = None

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def tail(self, lines: int = 8) -> str:
        """The last ``lines`` lines of its log ('' when there is none)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def doing(self) -> str:
        """What it says it does: its log's last non-blank line shorter than 200 characters, without
        the ``ldp-stream <command>:`` prefix, or ``"starting"``."""
        for line in reversed(self.tail(20).splitlines()):
            line = line.strip()
            if line and len(line) < 200:
                head, sep, rest = line.partition(": ")
                return rest if sep and head.startswith("ldp-stream ") else line
        return "starting"


def spawn(name: str, args: list[str], log_dir: Path, url: str | None = None,
          module: str = "aggregator.cli") -> Child:
    """Start ``python -m <module> <args>`` as :class:`Child` ``name``, its log started empty.

    It runs in its own session (``ingest.local.processes.spawn_process``): a terminal's Ctrl-C reaches
    only the demo, which stops its children; a child asks for SIGTERM when the demo dies without
    cleaning up.

    Parameters
    ----------
    name : str
    args : list of str
        Arguments after ``-m <module>``.
    log_dir : Path
        Directory of ``<name>.log``.
    url : str or None
        Stored on the child (:attr:`Child.url`).
    module : str
        The module to run (default the ``ldp-stream`` command line).

    Returns
    -------
    Child
    """
    log_path = Path(log_dir) / f"{name}.log"
    log_path.unlink(missing_ok=True)
    proc = spawn_process([sys.executable, "-m", module, *args], log_path=log_path, exit_with_parent=True)
    return Child(name, proc, log_path, url)


def check_alive(children: Iterable[Child]) -> None:
    """Fail when a child has exited.

    Parameters
    ----------
    children : iterable of Child

    Raises
    ------
    ChildExited
        For the first child of ``children`` that is no longer running.
    """
    for c in children:
        if not c.alive():
            raise ChildExited(c)


def answers_http(child: Child, path: str = "", timeout: float = 1.0) -> bool:
    """Whether the child answers HTTP.

    Parameters
    ----------
    child : Child
        Its :attr:`Child.url` is asked.
    path : str
        Appended to the URL (``"/healthz"``).
    timeout : float
        Seconds for the request.

    Returns
    -------
    bool
        True when ``GET child.url + path`` answers with a 2xx status.
    """
    try:
        with urllib.request.urlopen(child.url + path, timeout=timeout) as resp:
            resp.read()
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def exited_ok(child: Child) -> bool:
    """Whether a one-shot child is done.

    Parameters
    ----------
    child : Child

    Returns
    -------
    bool
        True once it has exited with status 0.
    """
    return child.proc.poll() == 0


def wait_ready(children: list[Child], ready: Callable[[Child], bool], *, keep_alive: Iterable[Child] = (),
               say: Callable[[str], None] | None = None, slow_after_s: float = SLOW_AFTER_S,
               poll_s: float = 0.2, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until ``ready(child)`` holds for every child, for as long as each is alive.

    There is no deadline: a child that is alive is starting (a first start compiles the numba
    kernels, for tens of seconds on a loaded machine); Ctrl-C stops the wait. Once the wait has
    lasted ``slow_after_s``, ``say`` is called once with the children still awaited and what
    their logs say they do (:meth:`Child.doing`), e.g. ``serve: compiling the numba kernels …``.

    Parameters
    ----------
    children : list of Child
        The children to wait for. One that has exited before ``ready`` held for it fails the
        wait (a one-shot child is ready once it exited 0: :func:`exited_ok`).
    ready : callable
        ``ready(child) -> bool``, asked again every ``poll_s`` until it holds (then not again).
    keep_alive : iterable of Child
        Children already up that must not exit meanwhile.
    say : callable or None
        Receives the one message of a long wait.
    slow_after_s : float
        When the wait counts as long.
    poll_s : float
        Pause between two rounds of checks.
    clock, sleep : callable
        Time source and pause (tests pass fakes).

    Returns
    -------
    float
        Seconds waited.

    Raises
    ------
    ChildExited
        As soon as a child of ``children`` (not yet ready) or of ``keep_alive`` has exited.
    """
    keep_alive = list(keep_alive)
    pending = list(children)
    t0 = clock()
    said = False
    while True:
        pending = [c for c in pending if not ready(c)]
        check_alive([*pending, *keep_alive])
        if not pending:
            return clock() - t0
        waited = clock() - t0
        if not said and waited >= slow_after_s and say is not None:
            said = True
            say(f"waiting for {', '.join(c.name for c in pending)} ({waited:.0f} s so far; alive, so "
                "the demo waits): " + "; ".join(f"{c.name}: {c.doing()}" for c in pending))
        sleep(poll_s)


def stop_all(children: list[Child], timeout: float = 10.0) -> None:
    """Stop every child at once: the workers' final checkpoints and serve's shutdown overlap
    (``ingest.local.processes.stop_processes``).

    Parameters
    ----------
    children : list of Child
        Those that already exited are skipped.
    timeout : float
        Seconds they get together after SIGTERM before SIGKILL.
    """
    stop_processes([c.proc for c in children], timeout=timeout)
