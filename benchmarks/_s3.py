"""A local S3-compatible server (moto) for benchmarks that need a durable embedded broker.

Benchmark-only; not a public API of ldp-stream and not a project dependency. moto is run from
whatever Python has it installed (e.g. a throwaway venv: ``python3 -m venv /tmp/motovenv &&
/tmp/motovenv/bin/pip install 'moto[server]'``): the ``moto_server`` executable is taken from the
environment variable ``LDP_MOTO_SERVER`` or found on ``PATH``.

Usage::

    with MotoS3Server(bucket="tansu") as s3, \\
            EmbeddedBroker(storage_url=s3.storage_url, env=s3.broker_env()) as broker:
        ...
        broker.kill()
        broker.restart()  # same port, same bucket: acknowledged records are still there

Measured with Tansu 0.6.0 and moto 5.2.5 on 127.0.0.1: records acknowledged before a SIGKILL are
all served exactly once after a restart. A batch in flight at the kill can be lost by
kafka-python's default idempotent producer (Tansu answers its retry with
DUPLICATE_SEQUENCE_NUMBER without having stored it); see :class:`ingest.local.broker.EmbeddedBroker`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ingest.local.processes import free_port, set_parent_death_signal, stop_process

ENV_VAR = "LDP_MOTO_SERVER"
_HOST = "127.0.0.1"


def find_moto_server() -> str:
    """Path of the ``moto_server`` executable: ``$LDP_MOTO_SERVER``, else ``moto_server`` on PATH.

    Raises
    ------
    RuntimeError
        If ``LDP_MOTO_SERVER`` names no executable file, or it is unset and ``moto_server`` is not
        on PATH (the message says how to install it).
    """
    path = os.environ.get(ENV_VAR)
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RuntimeError(f"{ENV_VAR}={path!r} is not an executable file")
        return path
    found = shutil.which("moto_server")
    if found is None:
        raise RuntimeError(
            f"moto_server not found: set {ENV_VAR} to its path or put it on PATH (install it "
            f"outside the project venv: python3 -m venv /tmp/motovenv && "
            f"/tmp/motovenv/bin/pip install 'moto[server]'; {ENV_VAR}=/tmp/motovenv/bin/moto_server)"
        )
    return found


def _pdeathsig() -> None:  # pragma: no cover - runs in the forked child
    set_parent_death_signal(signal.SIGKILL)


class MotoS3Server:
    """moto's S3 server in a child process on ``127.0.0.1``, with one bucket created.

    Parameters
    ----------
    bucket : str
        Bucket to create (S3 naming: 3-63 lowercase letters, digits, ``-``, ``.``).
    port : int or None
        TCP port; ``None`` picks a free one.
    startup_timeout : float
        Seconds (> 0) to wait for the server to accept the bucket creation.
    executable : str or None
        ``moto_server`` path; ``None`` uses :func:`find_moto_server`.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"`` (valid after :meth:`start`).
    storage_url : str
        ``"s3://BUCKET/"``, for ``EmbeddedBroker(storage_url=...)``.
    """

    def __init__(self, bucket: str = "tansu", port: int | None = None,
                 startup_timeout: float = 20.0, executable: str | None = None) -> None:
        ok = (isinstance(bucket, str) and 3 <= len(bucket) <= 63
              and all(c.islower() or c.isdigit() or c in "-." for c in bucket)
              and bucket[0].isalnum() and bucket[-1].isalnum())
        if not ok:
            raise ValueError(f"bucket must be an S3 bucket name (3-63 of a-z 0-9 - .), got {bucket!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 1 <= port <= 65535):
            raise ValueError(f"port must be an int in [1, 65535] or None, got {port!r}")
        if not (isinstance(startup_timeout, int | float) and startup_timeout > 0):
            raise ValueError(f"startup_timeout must be > 0 seconds, got {startup_timeout!r}")
        self.bucket = bucket
        self._requested_port = port
        self.startup_timeout = float(startup_timeout)
        self._executable = executable
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._workdir: str | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self.port is None:
            raise RuntimeError("moto server is not running; call start()")
        return f"http://{_HOST}:{self.port}"

    @property
    def storage_url(self) -> str:
        """``s3://BUCKET/``."""
        return f"s3://{self.bucket}/"

    def broker_env(self) -> dict[str, str]:
        """Environment for Tansu to use this server (object_store's ``AWS_*`` variables)."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> MotoS3Server:
        """Launch moto_server and create the bucket (plain HTTP PUT; moto needs no signature).

        Raises
        ------
        RuntimeError
            If moto_server is missing, exits, or does not create the bucket in time.
        """
        if self._proc is not None:
            raise RuntimeError(f"moto server already running on {self.endpoint}")
        exe = self._executable or find_moto_server()
        port = self._requested_port or free_port(_HOST)
        self._workdir = tempfile.mkdtemp(prefix="ldp-moto-")
        log_path = Path(self._workdir) / "moto.log"
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(  # fixed argv, no shell
                [exe, "-H", _HOST, "-p", str(port)], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self._workdir, preexec_fn=_pdeathsig,
                start_new_session=True)
        self.port = port
        deadline = time.monotonic() + self.startup_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"moto_server exited with status {code}:\n{tail}")
            req = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
            try:
                with urllib.request.urlopen(req, timeout=2.0) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not create bucket {self.bucket!r} within "
                           f"{self.startup_timeout:g} s (last error: {last!r})")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); all buckets are gone. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout=5.0)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.port = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
