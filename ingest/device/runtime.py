"""Reporting as one device: the device secret, the :class:`Device` a
:class:`~ingest.client.privatizer.Privatizer` is given, and the per-report path that memoizes and
spends the ledger's budget (docs/devices.md).

* :class:`DeviceSecret`: 32 random bytes in a file of the device's own (64 hex digits, mode 0600).
  Memoized reports and α-point offsets are derived from it (``ingest.device.memo``).
* :class:`Device`: where the ledger (``ingest.device.ledger.DeviceLedger``) and the secret live.
* :func:`open_device`: what the privatizer runs per batch when it has a device: memoized parts
  from the secret, fresh parts from the privatizer's generator, then one all-or-nothing spend in
  the ledger, committed before the reports are returned.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ingest.device.ledger import DeviceLedger
from ingest.device.memo import alpha_offsets, alpha_round, memo_tag, thread_streams
from ingest.errors import ConfigError, DeviceSecretError
from ingest.files import check_private_file

logger = logging.getLogger(__name__)

__all__ = ["SECRET_BYTES", "Device", "DevicePath", "DeviceSecret", "memoized_fields", "open_device"]

#: Bytes of a device secret.
SECRET_BYTES = 32
_CREATE_HINT = "python -c 'from ingest.device.runtime import DeviceSecret; DeviceSecret.create(\"{}\")'"


class DeviceSecret:
    """The device's secret key: 32 random bytes, kept in a file only the device's user can read.

    Parameters
    ----------
    key : bytes
        Exactly :data:`SECRET_BYTES` bytes (use :meth:`load` or :meth:`create` for files).
    path : str, optional
        The file it came from (for messages).

    Raises
    ------
    DeviceSecretError
        If ``key`` is not 32 bytes.

    Notes
    -----
    Every memoized report of the device is a function of this key (docs/devices.md §3): a lost or
    replaced secret re-randomizes every memoized value, and an observer who averages the old and
    the new reports of an unchanged value learns more than either tells. Keep it, back it up with
    the device's data, and never copy it to another device.
    """

    __slots__ = ("_key", "path")

    def __init__(self, key: bytes, path: str | None = None) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != SECRET_BYTES:
            size = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
            raise DeviceSecretError(f"a device secret must be {SECRET_BYTES} bytes, got {size}", path or "")
        self._key = bytes(key)
        self.path = path

    @property
    def key(self) -> bytes:
        """The 32 bytes."""
        return self._key

    @classmethod
    def create(cls, path: str | Path) -> DeviceSecret:
        """Write a new secret (``secrets.token_bytes(32)`` as 64 hex digits and a newline) to a
        new file with mode 0600.

        Raises
        ------
        DeviceSecretError
            If ``path`` exists (a secret is never overwritten) or cannot be written.
        """
        p = str(path)
        key = secrets.token_bytes(SECRET_BYTES)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise DeviceSecretError(f"device secret file {p!r} exists; a secret is never overwritten (a new "
                                    "one re-randomizes every memoized value)", p) from None
        except OSError as exc:
            raise DeviceSecretError(f"device secret file {p!r} cannot be created: {exc.strerror}",
                                    p) from None
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        return cls(key, p)

    @classmethod
    def load(cls, path: str | Path) -> DeviceSecret:
        """Read a secret written by :meth:`create`.

        Raises
        ------
        DeviceSecretError
            If the file does not exist or cannot be read, is readable or writable by group or
            others (POSIX: ``mode & 0o077``; fix with ``chmod 600``), or does not hold exactly 64
            hex digits (surrounding whitespace aside). The message names the file.
        """
        p = str(path)
        if not os.path.lexists(p):
            raise DeviceSecretError(f"device secret file {p!r} does not exist; create one with "
                                    f"{_CREATE_HINT.format(p)}; nothing was sent", p)
        check_private_file(p, "device secret file", lambda msg: DeviceSecretError(msg, p),
                           "; nothing was sent")
        try:
            with open(p, "rb") as f:
                raw = f.read(4 * SECRET_BYTES)
        except OSError as exc:
            raise DeviceSecretError(f"device secret file {p!r} cannot be read: {exc.strerror}; nothing was "
                                    "sent", p) from None
        text = raw.strip()
        try:
            key = bytes.fromhex(text.decode("ascii")) if len(text) == 2 * SECRET_BYTES else None
        except (UnicodeDecodeError, ValueError):
            key = None
        if key is None:
            raise DeviceSecretError(f"device secret file {p!r} must hold {SECRET_BYTES} bytes as "
                                    f"{2 * SECRET_BYTES} hex digits; it holds {len(raw)} bytes that are not "
                                    "that; nothing was sent", p)
        return cls(key, p)

    def __repr__(self) -> str:  # never the key
        return f"DeviceSecret(path={self.path!r})"


class Device:
    """What a :class:`~ingest.client.privatizer.Privatizer` needs to report as one device
    (docs/devices.md).

    Parameters
    ----------
    ledger_path : str or Path, optional
        The device ledger (``ingest.device.ledger.DeviceLedger``); required by schemas with
        ``[privacy] unit = "device"``, refused by the others (they keep no budget).
    secret : str, Path or DeviceSecret, optional
        The device secret file (``DeviceSecret.load``) or a loaded secret; required by schemas
        with a memoized field.
    clock : callable () -> float, optional
        Unix seconds of a spend (default ``time.time``); it picks the ledger period.

    Notes
    -----
    Nothing is opened here: the privatizer opens the ledger and loads the secret when it is
    constructed, so a bad file fails there, before any report.
    """

    def __init__(self, ledger_path: str | Path | None = None, secret: str | Path | DeviceSecret | None = None,
                 *, clock: Callable[[], float] | None = None) -> None:
        self.ledger_path = None if ledger_path is None else str(ledger_path)
        self.secret = secret if secret is None or isinstance(secret, DeviceSecret) else str(secret)
        self.clock = time.time if clock is None else clock

    def __repr__(self) -> str:
        secret = self.secret.path if isinstance(self.secret, DeviceSecret) else self.secret
        return f"Device(ledger_path={self.ledger_path!r}, secret={secret!r})"


def open_device(schema, device: Device | None, zil, cat_mechs: Mapping[str, Any]) -> DevicePath | None:
    """The device path of a privatizer, or ``None`` when the schema needs no device and none is given.

    Parameters
    ----------
    schema : TelemetrySchema
    device : Device or None
    zil : ZILMechanism or None
        The schema's numeric mechanism.
    cat_mechs : mapping field name → URR | URAP
        The schema's categorical mechanisms.

    Raises
    ------
    ConfigError
        If the schema has ``[privacy] unit = "device"`` or a memoized field and ``device`` (or
        the ledger / secret it needs) is missing, or a ledger is given for a schema of
        ``unit = "event"``. One line saying what to pass.
    LedgerError, DeviceSecretError
        If the ledger or the secret file cannot be used (from ``DeviceLedger`` / ``DeviceSecret``).
    """
    per_device = schema.privacy_unit.unit == "device"
    memo = memoized_fields(schema)
    if device is None:
        if per_device:
            raise ConfigError(f"schema {schema.name!r} has [privacy] unit = 'device': pass "
                              "device=Device(ledger_path, secret) to the Privatizer (ldp-stream produce: "
                              "--device-ledger PATH) so that its budget is kept")
        if memo:
            raise ConfigError(f"schema {schema.name!r} memoizes {memo}: pass device=Device(secret=FILE) to "
                              "the Privatizer (ldp-stream produce: --device-secret FILE)")
        return None
    if not isinstance(device, Device):
        raise ConfigError(f"device must be an ingest.device.runtime.Device, got {type(device).__name__}")
    if per_device and device.ledger_path is None:
        raise ConfigError(f"schema {schema.name!r} has [privacy] unit = 'device': the Device needs a "
                          "ledger_path (ldp-stream produce: --device-ledger PATH)")
    if not per_device and device.ledger_path is not None:
        raise ConfigError(f"schema {schema.name!r} has [privacy] unit = 'event', which keeps no budget: "
                          "give no device ledger")
    if memo and device.secret is None:
        raise ConfigError(f"schema {schema.name!r} memoizes {memo}: the Device needs a secret "
                          "(ldp-stream produce: --device-secret FILE)")
    secret = None
    if memo:
        secret = device.secret
        if not isinstance(secret, DeviceSecret):
            secret = DeviceSecret.load(secret)
    ledger = DeviceLedger(device.ledger_path, schema) if per_device else None
    return DevicePath(schema, zil, cat_mechs, ledger, secret, device.clock)


def memoized_fields(schema) -> list[str]:
    """Names of the schema's memoized fields: every numeric field when the numeric block is
    memoized, then the memoized categorical fields (docs/devices.md §3)."""
    names = list(schema.numeric_names) if schema.numeric is not None and schema.numeric.memoized else []
    return names + [c.name for c in schema.categorical if c.memoize]


class DevicePath:
    """Per-batch release of a privatizer with a device (built by :func:`open_device`).

    Memoized parts are per-row Python (one keyed derivation per distinct memo key of a batch);
    the fresh parts are drawn vectorised from the privatizer's generator, exactly as without a
    device.
    """

    def __init__(self, schema, zil, cat_mechs, ledger: DeviceLedger | None, secret: DeviceSecret | None,
                 clock: Callable[[], float]) -> None:
        self.schema = schema
        self.ledger = ledger
        self._zil = zil
        self._cat_mechs = cat_mechs
        self._secret = secret.key if secret is not None else None
        self._clock = clock
        self._fp = bytes(schema.fingerprint)
        self._memo_numeric = zil is not None and schema.numeric.memoized
        if self._memo_numeric:
            self._alpha = alpha_offsets(self._secret, self._fp, schema.numeric_names)
            self._buckets = np.array([f.memo_buckets for f in schema.numeric.fields], dtype=np.int64)

    def release(self, x: np.ndarray, codes: Mapping[str, np.ndarray],
                rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        """The reports of one batch; the ledger's spend is committed before this returns.

        Parameters
        ----------
        x : ndarray, shape (m, d)
            Numeric values, clipped into the box.
        codes : mapping field name → int array (m,)
            Categorical codes in the wire domain (PUM bots applied).
        rng : Generator
            The privatizer's generator, for the fresh parts.

        Returns
        -------
        released : ndarray, shape (m, d)
        categorical : dict field name → int32 codes (uRR) or SparseBits (uRAP)

        Raises
        ------
        BudgetExceeded
            If the batch's fresh reports do not fit in the period's budget: nothing is spent and
            nothing returned.
        """
        m = int(x.shape[0])
        fresh = np.zeros(m, dtype=bool)
        tags: list[list[bytes]] = [[] for _ in range(m)]
        if self._zil is None:
            released = np.empty((m, 0), dtype=np.float64)
        elif self._memo_numeric:
            released = self._memo_numeric_block(x, tags)
        else:
            released = self._zil.privatize(x, rng) if m else x
            fresh[:] = True
        cat_out: dict[str, Any] = {}
        for c in self.schema.categorical:
            mech = self._cat_mechs[c.name]
            if c.memoize and m:
                cat_out[c.name] = self._memo_categorical(c.name, mech, codes[c.name], tags)
            else:
                cat_out[c.name] = mech.privatize(codes[c.name], rng)
                fresh[:] = True
        if self.ledger is not None and m:
            self.ledger.spend(self._clock(), reports=list(zip(fresh.tolist(), tags, strict=True)))
        return released, cat_out

    def _memo_numeric_block(self, x: np.ndarray, tags: list[list[bytes]]) -> np.ndarray:
        zil, streams = self._zil, thread_streams()  # = ingest.device.memo.keyed_generator, re-keyed
        edges, values = alpha_round(x, zil.low, zil.high, self._buckets, self._alpha)
        out = np.empty_like(values)
        cache: dict[bytes, tuple[np.ndarray, bytes]] = {}
        for i in range(values.shape[0]):
            key = edges[i].astype("<i8").tobytes()
            hit = cache.get(key)
            if hit is None:
                gen = streams(self._secret, self._fp, b"numeric", key)
                hit = cache[key] = (zil.privatize(values[i:i + 1], gen)[0],
                                    memo_tag(self._secret, self._fp, b"numeric", key))
            out[i] = hit[0]
            tags[i].append(hit[1])
        return out

    def _memo_categorical(self, name: str, mech, code: np.ndarray, tags: list[list[bytes]]):
        values, inverse = np.unique(code, return_inverse=True)
        streams = thread_streams()  # = ingest.device.memo.keyed_generator, re-keyed
        label = name.encode()
        reports, value_tags = [], []
        for v in values.tolist():
            key = int(v).to_bytes(8, "little")
            gen = streams(self._secret, self._fp, b"categorical", label, key)
            reports.append(mech.privatize(np.array([v], dtype=np.int64), gen))
            value_tags.append(memo_tag(self._secret, self._fp, b"categorical", label, key))
        for i, j in enumerate(inverse.tolist()):
            tags[i].append(value_tags[j])
        if mech.output_kind == "codes":
            return np.concatenate(reports).astype(np.int32, copy=False)[inverse]
        from mechanisms.uldp import SparseBits

        return SparseBits.concat(reports).take(inverse)
