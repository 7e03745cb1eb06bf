"""An ASGI app served by uvicorn on a free loopback port in a thread, for tests."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from ingest.local.processes import free_port


class ServedApp:
    """Serve ``app`` on ``127.0.0.1:<free port>`` until :meth:`close` (or the ``with`` block ends).

    Parameters
    ----------
    app : ASGI application
    log_level : str
        uvicorn's (``"critical"``: nothing logged).
    timeout : float
        Seconds to wait for the server to start, and for it to stop.
    **config
        Further ``uvicorn.Config`` options (``http=`` a protocol class …).
    """

    def __init__(self, app, log_level: str = "critical", timeout: float = 10.0, **config) -> None:
        import uvicorn

        self.port = free_port()
        self.timeout = timeout
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level=log_level, **config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, path: str, method: str = "GET") -> tuple[int, str]:
        """``(status, body)`` of one request (an HTTP error status is returned, not raised)."""
        req = urllib.request.Request(self.url + path, method=method,
                                     data=b"{}" if method in ("POST", "PUT", "PATCH") else None)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout)

    def __enter__(self) -> ServedApp:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
