"""Ports and child processes: a free TCP port, starting and stopping children, and a child that
stops with its parent. Used by the embedded broker (``ingest.local.broker``), the demo, the tests and
the benchmarks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import time

__all__ = [
    "EXIT_WITH_PARENT_ENV",
    "exit_with_parent",
    "free_port",
    "port_is_free",
    "set_parent_death_signal",
    "spawn_process",
    "stop_process",
    "stop_processes",
]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bound to port 0 by the OS).

    Parameters
    ----------
    host : str
        Interface to probe: IPv4, or IPv6 when it contains ``:`` (the brokers use ``127.0.0.1``;
        ``serve --port 0`` its own host).

    Returns
    -------
    int
        A port number in the OS ephemeral range.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``host:port`` right now.

    Parameters
    ----------
    host : str
        Interface address (IPv4, or IPv6 when it contains ``:``).
    port : int
        TCP port in [1, 65535].

    Returns
    -------
    bool
        ``False`` if the bind fails with ``EADDRINUSE``/``EACCES``.

    Raises
    ------
    OSError
        For any other bind failure (e.g. an address that is not local).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # same semantics as a server socket (Tansu sets SO_REUSEADDR too): TIME_WAIT does not count
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


def set_parent_death_signal(sig: int, parent: int | None = None) -> None:  # pragma: no cover - forked child
    """Ask the Linux kernel to send ``sig`` to this process when its parent thread dies.

    For ``preexec_fn`` of a child process; a no-op where ``prctl`` is unavailable. The request
    outlives ``exec`` (not for set-user-id programs).

    Parameters
    ----------
    sig : int
        The signal (``signal.SIGKILL``, ``signal.SIGTERM``, ...).
    parent : int or None
        The pid of the process that forked this one, taken before the fork. When given and this
        process's parent is another one by the time the request is made (the parent died in
        between, so the kernel will never send ``sig``), ``sig`` is sent to this process now
        (also where ``prctl`` is unavailable).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


#: Environment variable naming the process whose death should stop this one
#: (:func:`exit_with_parent`).
EXIT_WITH_PARENT_ENV = "LDP_STREAM_EXIT_WITH_PARENT"


def exit_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child started with ``EXIT_WITH_PARENT_ENV=<parent pid>``: have the kernel send ``sig``
    to this process when its parent dies, and send it now if the parent is already gone.

    The child-side form of :func:`set_parent_death_signal`: its parent can then start it without
    ``preexec_fn``, which makes ``subprocess`` fork the whole process (not ``vfork``) and run
    the libraries' fork handlers — OpenBLAS's stops its threads, and a matrix product running
    meanwhile on another thread of the parent never returns. The variable is removed from the
    environment so that this process's own children do not inherit it. No-op when it is unset
    or not an integer, and where ``prctl`` is unavailable.
    """
    value = os.environ.pop(EXIT_WITH_PARENT_ENV, None)
    try:
        parent = int(value)
    except (TypeError, ValueError):  # unset, or not a pid
        return
    set_parent_death_signal(sig, parent)  # sent now if it died before the request


def stop_process(proc: subprocess.Popen, timeout: float, sig: int = signal.SIGTERM) -> int | None:
    """Stop ``proc``: SIGCONT (if frozen), ``sig``, wait ``timeout`` s, SIGKILL, wait.

    Parameters
    ----------
    proc : subprocess.Popen
    timeout : float
        Seconds to wait for an exit after ``sig`` before SIGKILL.
    sig : int
        The first signal (SIGTERM: a clean stop; SIGKILL: a crash).

    Returns
    -------
    int or None
        The exit status (``-signal`` for a signal), as ``Popen.returncode``.
    """
    if proc.poll() is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10.0)
    return proc.returncode


def stop_processes(procs: list[subprocess.Popen], timeout: float,
                   sig: int = signal.SIGTERM) -> list[int | None]:
    """Stop every process of ``procs`` at once: SIGCONT (if frozen) and ``sig`` to each, one
    shared wait of up to ``timeout`` s, then SIGKILL to those still running, and wait.

    Their clean stops (a worker's final checkpoint, serve's shutdown) then overlap instead of
    adding up as with :func:`stop_process` one after the other.

    Parameters
    ----------
    procs : list of subprocess.Popen
    timeout : float
        Seconds to wait, for all of them together, after ``sig`` before SIGKILL.
    sig : int
        The first signal.

    Returns
    -------
    list of int or None
        The exit status of each, in the order of ``procs`` (as ``Popen.returncode``).
    """
    running = [p for p in procs if p.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
    deadline = time.monotonic() + timeout
    for p in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=10.0)
    return [p.returncode for p in procs]


def spawn_process(cmd: list[str], *, log_path: str | os.PathLike | None = None, env: dict | None = None,
                  cwd: str | os.PathLike | None = None, exit_with_parent: bool = False) -> subprocess.Popen:
    """Start ``cmd`` as a child in its own session, output appended to ``log_path``.

    Its own session: Ctrl-C in a terminal reaches the parent, which stops its children in order
    (:func:`stop_process`), and a child can be signalled alone. No ``preexec_fn`` (with one,
    ``subprocess`` forks the whole process and a library's fork handler can hang a thread of the
    parent); with ``exit_with_parent`` the child is asked to stop when this process dies through
    :data:`EXIT_WITH_PARENT_ENV` (its ``ldp-stream`` entry point calls :func:`exit_with_parent`).

    Parameters
    ----------
    cmd : list of str
        argv (no shell).
    log_path : path or None
        File that receives stdout and stderr (appended); None: discarded.
    env : dict or None
        The child's environment; None: this process's.
    cwd : path or None
    exit_with_parent : bool

    Returns
    -------
    subprocess.Popen
    """
    env = dict(os.environ if env is None else env)
    if exit_with_parent:
        env[EXIT_WITH_PARENT_ENV] = str(os.getpid())
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True)
    finally:
        if log_path is not None:
            out.close()
