"""The collector's HTTP/1.1 layer: uvicorn's h11 protocol with JSON refusals of malformed
requests (docs/collector.md §2).

uvicorn answers a request that h11 cannot parse — a bad request line or header line, a
``Content-Length`` that is not a number or is given twice with different values, a malformed chunk
— itself, before any route runs: ``H11Protocol.handle_events`` catches ``h11.RemoteProtocolError``
and calls ``send_400_response``, which writes a plain-text 400 and closes the connection.
:func:`http_protocol` returns a subclass whose ``send_400_response`` writes the collector's error
body instead, ``{"error": "bad_request", "reason": "malformed HTTP request: …"}`` with
``Connection: close``, and counts it like the application's refusals. It is passed to uvicorn as
``uvicorn.Config(http=...)``, so the h11 implementation serves the collector whether or not
httptools is installed.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

__all__ = ["HTTP_REFUSED_SCOPE_KEY", "MALFORMED_PREFIX", "http_protocol"]

log = logging.getLogger(__name__)

#: the reason of every refusal of the HTTP layer starts with this
MALFORMED_PREFIX = "malformed HTTP request"
#: set in the ASGI scope of a request whose body the HTTP layer refused while the application was
#: reading it (a malformed chunk): the application's own ``client_disconnected`` is then not
#: counted a second time
HTTP_REFUSED_SCOPE_KEY = "ldp_collector.http_refused"
#: longest h11 message quoted in a reason (it may quote the client's bytes)
_MAX_DETAIL = 200


def http_protocol(on_refused: Callable[[str], None] | None = None) -> type:
    """A subclass of uvicorn's ``H11Protocol`` whose answer to a malformed request is the
    collector's JSON error.

    Parameters
    ----------
    on_refused : callable (code: str) → None, optional
        Called with ``"bad_request"`` once per such answer
        (:meth:`aggregator.collector.metrics.CollectorMetrics.refuse`).

    Returns
    -------
    type
        The protocol class, for ``uvicorn.Config(http=...)``.

    Notes
    -----
    Source: docs/collector.md §2. The h11 message (``bad Content-Length``, ``illegal header
    line: …``, ``illegal chunk header: …``) follows ``malformed HTTP request:`` in the reason,
    cut at 200 characters. When the application has already started its response the
    connection is only closed.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorH11Protocol(H11Protocol):
        """uvicorn's h11 protocol; malformed requests get a JSON 400 (docs/collector.md §2)."""

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this inside ``except h11.RemoteProtocolError``: that error says what
            exc = sys.exception()
            detail = " ".join(str(exc).split()) if isinstance(exc, h11.RemoteProtocolError) else ""
            detail = (detail or msg.rstrip(".")).strip()[:_MAX_DETAIL]
            payload = json.dumps({"error": "bad_request",
                                  "reason": f"{MALFORMED_PREFIX}: {detail}"}).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(payload)).encode())]
            try:
                out = self.conn.send(h11.Response(status_code=400, headers=headers,
                                                  reason=b"Bad Request"))
                out += self.conn.send(h11.Data(data=payload))
                out += self.conn.send(h11.EndOfMessage())
            except h11.LocalProtocolError:  # a response is already on its way: just close
                self.transport.close()
                return
            self.transport.write(out)
            self.transport.close()
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.scope[HTTP_REFUSED_SCOPE_KEY] = True
            if on_refused is not None:
                on_refused("bad_request")
            log.info("refused a malformed HTTP request: %s", detail)

    return JsonErrorH11Protocol
