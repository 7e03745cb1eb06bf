"""Memoized reports: α-point rounding and the generators keyed by a device secret
(docs/devices.md §3).

A memoized field sends, for as long as its value stays the same, the same report: the report is a
deterministic function of the device secret, the schema fingerprint, the field and the value's
bucket (numeric fields) or category (categorical fields). Nothing here stores the value; the
ledger (``ingest.device.ledger``) keeps at most the keyed :func:`memo_tag` of a memo key.

* Numeric fields are first rounded to an edge of a grid of ``memo_buckets`` equal buckets of
  ``[low, high]`` by α-point rounding with a per-device, per-field offset α ∈ [0, 1): a value at
  fraction f of its bucket is rounded up iff ``f + α ≥ 1``. Over devices (α uniform) the rounded
  value has expectation x and variance ``x``'s plus ``s² f (1 − f) ≤ s²/4`` (s the bucket width).
  Source: Ding, Kulkarni & Yekhanin, "Collecting telemetry data privately" (NeurIPS 2017:
  α-point rounding, memoization); Erlingsson, Pihur & Korolova, "RAPPOR: randomized aggregatable
  privacy-preserving ordinal response" (CCS 2014: permanent randomized response).
* The memo report of a key is drawn by the field's own mechanism (``ZILMechanism.privatize``,
  ``URR``/``URAP.privatize``) from a ChaCha20 generator whose 256-bit key is
  HMAC-SHA256(secret, memo key), so its law is exactly the mechanism's.

Every function is pure: same inputs, same output, on every run and in every process.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["DOMAIN", "TAG_BYTES", "KeyedStreams", "alpha_offsets", "alpha_round", "keyed_digest",
           "keyed_generator", "memo_tag", "thread_streams"]

#: Domain-separation label of every keyed digest of this module (bump it to re-key everything).
DOMAIN = b"ldp-stream/memo/v1"
#: Bytes of a :func:`memo_tag`.
TAG_BYTES = 16


def keyed_digest(secret: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``secret`` over :data:`DOMAIN` and ``parts``, each length-prefixed.

    Parameters
    ----------
    secret : bytes
        The device secret (32 bytes, ``ingest.device.runtime.DeviceSecret``).
    *parts : bytes
        The message, unambiguously framed: each part is preceded by its length (8 bytes, LE).

    Returns
    -------
    bytes
        32 bytes.
    """
    msg = b"".join(len(part).to_bytes(8, "little") + part for part in (DOMAIN, *parts))
    return hmac.digest(secret, msg, hashlib.sha256)


def keyed_generator(secret: bytes, *parts: bytes) -> np.random.Generator:
    """A generator whose whole stream is fixed by ``secret`` and ``parts``.

    Parameters
    ----------
    secret : bytes
    *parts : bytes
        The memo key (see :func:`keyed_digest`).

    Returns
    -------
    numpy.random.Generator
        ``Generator(randomgen.ChaCha(key=HMAC-SHA256(secret, parts), counter=0, rounds=20))``:
        ChaCha20 keyed with the 256-bit digest (docs/devices.md §3; docs/privacy.md §6.3 on
        ChaCha20). Without the secret its draws cannot be predicted.
    """
    import randomgen

    key = int.from_bytes(keyed_digest(secret, *parts), "little")
    return np.random.Generator(randomgen.ChaCha(key=key, counter=0, rounds=20))


class KeyedStreams:
    """:func:`keyed_generator` without building a bit generator per key: one ChaCha20 bit
    generator, re-keyed (``ChaCha.seed(key=…, counter=0)``) for each key (≈ 15 µs instead of
    ≈ 65 µs; the draws are the same, tested).

    Calling it returns the same ``Generator`` object each time, re-keyed: draw what you need
    from it before the next call. Not for use from several threads at once:
    :func:`thread_streams` gives each thread its own.
    """

    def __init__(self) -> None:
        import randomgen

        self._bits = randomgen.ChaCha(key=0, counter=0, rounds=20)
        self._gen = np.random.Generator(self._bits)

    def __call__(self, secret: bytes, *parts: bytes) -> np.random.Generator:
        """The generator of ``keyed_generator(secret, *parts)``, ready at its first draw."""
        self._bits.seed(key=int.from_bytes(keyed_digest(secret, *parts), "little"), counter=0)
        return self._gen


_local = threading.local()


def thread_streams() -> KeyedStreams:
    """This thread's :class:`KeyedStreams` (built on first use)."""
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = KeyedStreams()
    return streams


def memo_tag(secret: bytes, *parts: bytes) -> bytes:
    """The keyed tag of a memo key that the ledger stores: the first :data:`TAG_BYTES` bytes of
    HMAC-SHA256(secret, "tag", parts). Without the secret it says nothing about the key."""
    return keyed_digest(secret, b"tag", *parts)[:TAG_BYTES]


def alpha_offsets(secret: bytes, fingerprint: bytes, names: Sequence[str]) -> np.ndarray:
    """The device's α-point offsets, one per numeric field.

    Parameters
    ----------
    secret : bytes
    fingerprint : bytes
        The schema fingerprint (16 bytes).
    names : sequence of str
        The numeric field names, in column order.

    Returns
    -------
    ndarray of float64, shape (d,)
        α_j ∈ [0, 1): the top 53 bits of HMAC-SHA256(secret, "alpha", fingerprint, name_j) over
        2⁵³, uniform over devices (Ding, Kulkarni & Yekhanin 2017).
    """
    out = np.empty(len(names), dtype=np.float64)
    for j, name in enumerate(names):
        word = int.from_bytes(keyed_digest(secret, b"alpha", fingerprint, name.encode())[:8], "little")
        out[j] = (word >> 11) * 2.0**-53
    return out


def alpha_round(x: np.ndarray, low: np.ndarray, high: np.ndarray, buckets: np.ndarray,
                alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """α-point rounding of values to the edges of an equal-bucket grid (docs/devices.md §3).

    Parameters
    ----------
    x : ndarray, shape (n, d)
        Values in original units, already clipped into ``[low, high]``.
    low, high : ndarray, shape (d,)
        The fields' boxes, ``low < high``.
    buckets : ndarray of int, shape (d,)
        B_j ≥ 1 buckets of width ``s_j = (high_j − low_j)/B_j``; the edges are
        ``low_j + e·s_j`` for e = 0 … B_j.
    alpha : ndarray, shape (d,)
        α_j ∈ [0, 1) (:func:`alpha_offsets`).

    Returns
    -------
    edges : ndarray of int64, shape (n, d)
        The edge index e ∈ [0, B_j]: with ``t = (x − low)/s``, ``i = min(⌊t⌋, B − 1)`` and
        ``f = t − i``, ``e = i + 1`` iff ``f + α ≥ 1``, else ``i``.
    values : ndarray of float64, shape (n, d)
        The edges in original units, ``low + (high − low)·e/B``; for α uniform on [0, 1),
        ``E[value] = x`` (P(up) = f) and ``Var[value] = s² f(1 − f) ≤ s²/4``.

    Source: Ding, Kulkarni & Yekhanin, "Collecting telemetry data privately" (NeurIPS 2017);
    docs/devices.md §3.
    """
    x = np.asarray(x, dtype=np.float64)
    b = np.asarray(buckets, dtype=np.int64)
    span = high - low
    t = np.clip((x - low) / span * b, 0.0, b)
    i = np.minimum(np.floor(t), b - 1)
    up = (t - i) + alpha >= 1.0
    edges = (i + up).astype(np.int64)
    values = np.minimum(low + span * (edges / b), high)
    return edges, values

