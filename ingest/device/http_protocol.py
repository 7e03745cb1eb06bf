"""The HTTP protocol between a device's sender and the collector (docs/collector.md §2).

Shared by the client (:mod:`ingest.device.sender`) and the server (``aggregator.collector``), so that
both sides spell the path, headers, media type and error codes the same way.

A device POSTs one wire record (:func:`ingest.client.codec.encode`, docs/wire-format.md) per request::

    POST /v1/reports
    Authorization: Bearer <token>
    Content-Type: application/vnd.ldp-stream.batch
    Idempotency-Key: <1–128 characters of A–Z a–z 0–9 . _ : ->
    Content-Length: <bytes>

and gets ``202 {"accepted": n, "idempotency_key": key, "duplicate": bool}`` once Kafka
acknowledged the reports, or an error ``{"error": code, "reason": text}`` with one of the codes
below. 429 and 503 carry ``Retry-After`` (whole seconds).
"""

from __future__ import annotations

import re

__all__ = [
    "CONTENT_TYPE",
    "ERROR_CODES",
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_KEY_RE",
    "REPORTS_PATH",
    "RETRYABLE_STATUSES",
    "valid_idempotency_key",
]

#: Path of the report endpoint.
REPORTS_PATH = "/v1/reports"
#: Media type of a request body: one wire record.
CONTENT_TYPE = "application/vnd.ldp-stream.batch"
#: Header naming a batch; a retry sends the same key.
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: What an idempotency key may contain (a UUID's hex, a ULID, ``device-17:000042`` …).
IDEMPOTENCY_KEY_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

#: Statuses after which the same request (same body, same key) may succeed later: the sender
#: retries them with back-off, at least ``Retry-After`` seconds apart when the answer has one.
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

#: ``error`` code → HTTP status. Decode failures answer 422 with the decoder's ``reason`` label
#: (``ingest.client.codec.DECODE_REASONS``) as the code.
ERROR_CODES = {
    "bad_request": 400,               # missing/invalid Idempotency-Key or Content-Length, malformed HTTP
    "missing_token": 401,
    "invalid_token": 401,             # unknown or expired (the reason says which)
    "not_found": 404,
    "method_not_allowed": 405,
    "body_timeout": 408,              # the body did not arrive within body_timeout_s
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "idempotency_key_reused": 422,    # the key was seen with another body
    "empty_batch": 422,
    "event_time_skew": 422,           # an event time too far ahead of the collector's clock
    "rate_limited": 429,
    "overloaded": 503,                # too many bytes awaiting Kafka acknowledgement
    "broker_unavailable": 503,        # no acknowledgement within ack_timeout_s
}


def valid_idempotency_key(key: str | None) -> bool:
    """Whether ``key`` is an acceptable ``Idempotency-Key`` value (:data:`IDEMPOTENCY_KEY_RE`)."""
    return isinstance(key, str) and IDEMPOTENCY_KEY_RE.fullmatch(key) is not None
