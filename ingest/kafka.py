"""Kafka client settings, topic management and watermarks.

Everything that talks to a Kafka-protocol broker goes through this module so that security
settings (TLS, SASL) and the Tansu quirks of docs/kafka.md §2 are handled in one place.

* :class:`KafkaSettings` — frozen pydantic client settings; :meth:`~KafkaSettings.producer_config`,
  :meth:`~KafkaSettings.consumer_config`, :meth:`~KafkaSettings.admin_config` return kafka-python
  keyword arguments with TLS/SASL passed through.
* :data:`FAST_GROUP_SETTINGS` — consumer-group timeouts for ~3 s joins (docs/kafka.md §2.1).
* :func:`ensure_topic` — idempotent topic creation that waits for metadata;
  :func:`check_topic_name` — the names Kafka accepts, checked before any connection.
* :func:`high_watermarks` — end offsets that honour Tansu's short ``end_offsets()``;
  :mod:`ingest.clients` builds every client from the settings and reads topics to their end.
* The producer's transport interface and its kafka-python implementation live in
  :mod:`ingest.transport`.
* :func:`close_without_leaving` — close a group consumer without sending ``LeaveGroup`` (a leave
  while the member's join is pending wedges the group on Tansu).
* :func:`keep_freed_memory` — glibc ``malloc`` settings that stop a consumer from returning each
  fetch response's memory to the kernel (and page-faulting it back in for the next one).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from ingest._files import check_readable
from ingest._model import FrozenModel
from ingest.errors import ConfigError, IngestError

logger = logging.getLogger(__name__)

#: Consumer-group timeouts for fast joins and failure detection (kafka-python kwargs).
#: Measured against Tansu with kafka-python 3.0.12 (docs/kafka.md §2.1): a group join takes ~3 s with
#: these values and ~20 s with the defaults (session timeout 45 s, heartbeat 3 s, max poll interval
#: 300 s).
#: ``max_poll_interval_ms=10000`` means a member that does not call ``poll()`` for 10 s is evicted:
#: keep per-poll work (decode + state update + checkpoint) well under that.
FAST_GROUP_SETTINGS: Mapping[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 10000,
}

#: Seconds a shutdown lets each Kafka client take to close (kafka-python's producer waits without
#: limit by default: a hung broker would keep a stopped process alive for good).
CLOSE_TIMEOUT_S = 10.0

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"]


#: glibc ``mallopt`` parameters (``<malloc.h>``), the largest mmap threshold glibc accepts on
#: 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``) and the largest trim threshold ``mallopt``'s
#: ``int`` argument can carry.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD_MAX = 2**31 - 1


def keep_freed_memory(trim_threshold_bytes: int) -> bool:
    """Make glibc ``malloc`` keep freed memory for reuse instead of handing it back to the kernel.

    kafka-python copies every fetch response (megabytes with large records) several times in
    fresh buffers. With glibc's defaults those buffers are ``mmap``-ed and unmapped, or the heap
    top is trimmed, after each response, so every page of the next one is faulted in again: on
    the benchmark machine (2-core KVM guest) that was 2·10⁵ minor faults per 4·10⁶ reports and
    more than half of a raw consume loop's network-thread CPU time (docs/benchmarks.md §3.6).
    This sets, for the whole process:

    * ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's maximum): buffers below it come from the heap;
    * ``M_TRIM_THRESHOLD`` to ``trim_threshold_bytes``: up to that much free memory stays at
      the top of each heap rather than being returned.

    The cost is resident memory: up to ``trim_threshold_bytes`` of freed memory per malloc arena
    (one per thread that allocates, at most 8 per core) stays mapped.

    Parameters
    ----------
    trim_threshold_bytes : int
        Free memory kept at a heap's top, bytes, in ``[MMAP_THRESHOLD_MAX, TRIM_THRESHOLD_MAX]``
        (32 MiB … 2 GiB − 1); 0 leaves the allocator alone.

    Returns
    -------
    bool
        Whether the settings were applied (False for 0, or where the C library is not glibc).

    Raises
    ------
    ConfigError
        If ``trim_threshold_bytes`` is neither 0 nor within the range above.
    """
    if isinstance(trim_threshold_bytes, bool) or not isinstance(trim_threshold_bytes, int) or not (
        trim_threshold_bytes == 0 or MMAP_THRESHOLD_MAX <= trim_threshold_bytes <= TRIM_THRESHOLD_MAX
    ):
        raise ConfigError(f"trim_threshold_bytes must be 0 or an integer in [{MMAP_THRESHOLD_MAX}, "
                          f"{TRIM_THRESHOLD_MAX}], got {trim_threshold_bytes!r}")
    if trim_threshold_bytes == 0:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        logger.debug("C library is not glibc: malloc settings left alone")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        logger.debug("mallopt not found: malloc settings left alone")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
          and mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes) == 1)
    if ok:
        logger.info("glibc malloc: mmap threshold %d MiB, trim threshold %.0f MiB (freed memory is "
                    "reused, not returned)", MMAP_THRESHOLD_MAX >> 20, trim_threshold_bytes / 2**20)
    else:
        logger.warning("glibc mallopt refused the settings: malloc left at its defaults")
    return ok


@functools.cache
def _client_options() -> dict[str, frozenset[str]]:
    """The option names each kafka-python client kind accepts (it refuses any other key)."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    return {"producer": frozenset(KafkaProducer.DEFAULT_CONFIG),
            "consumer": frozenset(KafkaConsumer.DEFAULT_CONFIG),
            "admin": frozenset(KafkaAdminClient.DEFAULT_CONFIG)}


class KafkaSettings(FrozenModel):
    """Connection and security settings shared by producers, consumers and admin clients.

    Parameters
    ----------
    bootstrap_servers : str or list of str
        ``"host:port"`` entries (a comma-separated string is split). At least one.
    client_id : str or None
        Client id sent to the broker (shows up in broker logs / quotas).
    security_protocol : {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        Transport security.
    sasl_mechanism : {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"} or None
        Required when ``security_protocol`` starts with ``SASL_``.
    sasl_plain_username, sasl_plain_password : str / SecretStr or None
        Credentials for PLAIN and SCRAM (both required for those mechanisms). The password is a
        ``SecretStr``: never shown in ``repr`` or logs, unwrapped only in the ``*_config()`` dicts.
    ssl_cafile, ssl_certfile, ssl_keyfile : str or None
        PEM files: CA bundle to verify the broker, client certificate and key (mutual TLS).
    ssl_password : SecretStr or None
        Password of ``ssl_keyfile``.
    ssl_check_hostname : bool
        Verify the broker certificate's host name (default True).
    request_timeout_ms : int
        Per-request timeout in ms, >= 1000.
    extra : mapping str → Any
        Further kafka-python kwargs (escape hatch, e.g. ``api_version``, ``linger_ms``), each
        passed to every client kind that accepts it (``KafkaProducer``, ``KafkaConsumer``,
        ``KafkaAdminClient``); a key that none of them accepts is refused.

    Raises
    ------
    pydantic.ValidationError
        (a ``ValueError``) if a value is out of range or the security settings are inconsistent:
        SASL protocol without mechanism, mechanism without SASL protocol, PLAIN/SCRAM without
        username and password, ``ssl_*`` files with a non-TLS protocol, cert without key.

    Notes
    -----
    Source: docs/kafka.md §2; option names and meaning are kafka-python's (``KafkaProducer`` /
    ``KafkaConsumer`` / ``KafkaAdminClient``).
    """

    bootstrap_servers: tuple[str, ...]
    client_id: str | None = None
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    request_timeout_ms: int = Field(default=30000, ge=1000)
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split_servers(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [s.strip() for s in v.split(",") if s.strip()]
        return v

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("bootstrap_servers must list at least one host:port")
        for s in v:
            host, sep, port = s.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"bootstrap_servers entries must be host:port with port in [1, 65535], got {s!r}"
                )
        return v

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"sasl_mechanism is required with security_protocol={self.security_protocol}")
        if self.sasl_mechanism is not None and not sasl:
            raise ValueError(
                "sasl_mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL, "
                f"got {self.security_protocol}"
            )
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (
            not self.sasl_plain_username or self.sasl_plain_password is None
        ):
            raise ValueError(
                f"sasl_plain_username and sasl_plain_password are required with sasl_mechanism="
                f"{self.sasl_mechanism}"
            )
        files = {k: getattr(self, k) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")}
        if not tls and any(files.values()):
            used = [k for k, v in files.items() if v]
            raise ValueError(
                f"{', '.join(used)} {'needs' if len(used) == 1 else 'need'} security_protocol SSL or "
                f"SASL_SSL, got {self.security_protocol}"
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile must be given together (mutual TLS)")
        return self

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set().union(*_client_options().values()))
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} "
                             f"{'is no option' if len(unknown) == 1 else 'are no options'} of "
                             "kafka-python's KafkaProducer, KafkaConsumer or KafkaAdminClient")
        return v

    @property
    def bootstrap(self) -> str:
        """The servers as one comma-separated string."""
        return ",".join(self.bootstrap_servers)

    def _common(self, client: str) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "bootstrap_servers": list(self.bootstrap_servers),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.client_id is not None:
            cfg["client_id"] = self.client_id
        if self.sasl_mechanism is not None:
            cfg["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_plain_username is not None:
            cfg["sasl_plain_username"] = self.sasl_plain_username
        if self.sasl_plain_password is not None:
            cfg["sasl_plain_password"] = self.sasl_plain_password.get_secret_value()
        if self.security_protocol in ("SSL", "SASL_SSL"):
            cfg["ssl_check_hostname"] = self.ssl_check_hostname
            for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                path = getattr(self, k)
                if path is not None:
                    # checked where a client is built (the config may be written on another
                    # machine): a missing file made kafka-python retry ~30 s, logging the errno
                    # without the file name
                    check_readable(path, lambda why, k=k, path=path: ConfigError(
                        f"kafka.{k}: cannot read {path!r}: {why}"))
                    cfg[k] = path
            if self.ssl_password is not None:
                cfg["ssl_password"] = self.ssl_password.get_secret_value()
        # TOML has arrays but no tuples, and kafka-python wants tuples (api_version = [2, 5, 0]
        # failed with "api_version must be tuple"): arrays are passed as tuples
        accepted = _client_options()[client]
        cfg.update({k: tuple(v) if isinstance(v, list) else v
                    for k, v in self.extra.items() if k in accepted})
        return cfg

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """kafka-python ``KafkaProducer`` kwargs: connection + security, ``acks="all"``, then overrides.

        Parameters
        ----------
        **overrides
            Any ``KafkaProducer`` kwarg (e.g. ``linger_ms``), applied last.

        Returns
        -------
        dict
            Contains secrets in clear text: do not log it.
        """
        cfg = self._common("producer")
        cfg.setdefault("acks", "all")
        cfg.update(overrides)
        return cfg

    def consumer_config(self, group_id: str | None = None, *, fast_group: bool = False,
                        **overrides: Any) -> dict[str, Any]:
        """kafka-python ``KafkaConsumer`` kwargs.

        Parameters
        ----------
        group_id : str or None
            Consumer group; ``None`` for manual assignment without committed offsets.
        fast_group : bool
            Merge :data:`FAST_GROUP_SETTINGS` (~3 s joins against Tansu, docs/kafka.md §2.1).
        **overrides
            Any ``KafkaConsumer`` kwarg, applied last.

        Returns
        -------
        dict
            Contains secrets in clear text: do not log it.
        """
        cfg = self._common("consumer")
        if group_id is not None:
            cfg["group_id"] = group_id
        if fast_group:
            cfg.update(FAST_GROUP_SETTINGS)
        cfg.update(overrides)
        return cfg

    def admin_config(self, **overrides: Any) -> dict[str, Any]:
        """kafka-python ``KafkaAdminClient`` kwargs (connection + security, then overrides)."""
        cfg = self._common("admin")
        cfg.update(overrides)
        return cfg

    @classmethod
    def coerce(cls, value: KafkaSettings | str | Iterable[str]) -> KafkaSettings:
        """Return ``value`` if it is settings, else ``KafkaSettings(bootstrap_servers=value)``.

        Raises
        ------
        ConfigError
            If ``value`` is neither settings nor valid bootstrap servers.
        """
        if isinstance(value, KafkaSettings):
            return value
        if isinstance(value, str):
            servers: Any = value
        else:
            try:
                servers = list(value)
            except TypeError:
                raise ConfigError(
                    f"settings must be KafkaSettings or 'host:port[,host:port]', got {type(value).__name__}"
                ) from None
        try:
            return cls(bootstrap_servers=servers)
        except ValueError as exc:
            raise ConfigError(f"bootstrap_servers: {exc}") from exc


def reachable(settings: KafkaSettings, timeout: float = 1.0) -> bool:
    """Whether at least one bootstrap server accepts a TCP connection (no Kafka request is made).

    Used before constructing kafka-python clients, whose 3.0.12 connection code leaks a socket for
    every refused connection attempt.

    Parameters
    ----------
    settings : KafkaSettings
    timeout : float
        Seconds per connection attempt.
    """
    for server in settings.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
        except OSError:
            continue
    return False


def check_topic_name(name, key: str = "name") -> str:
    """Return ``name`` if Kafka accepts it as a topic name: 1–249 characters of
    ``[A-Za-z0-9._-]``, not ``.`` or ``..``.

    Raises
    ------
    ConfigError
        ``<key> must be 1-249 characters of [A-Za-z0-9._-], got '…'``.
    """
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name) or name in (".", ".."):
        raise ConfigError(f"{key} must be 1-249 characters of [A-Za-z0-9._-], got {name!r}")
    return name


def ensure_topic(settings: KafkaSettings | str, name: str, partitions: int,
                 config: Mapping[str, str] | None = None, *, replication_factor: int = 1,
                 timeout: float = 15.0) -> bool:
    """Create topic ``name`` if missing and wait until the broker's metadata lists it.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings or bootstrap servers.
    name : str
        Topic name (Kafka rules: 1–249 chars of ``[A-Za-z0-9._-]``).
    partitions : int
        Partition count (>= 1) used when creating. An existing topic is left as is (its partition
        count is not checked against this — see the log message).
    config : mapping str → str, optional
        Topic configs such as ``{"cleanup.policy": "compact"}``.
    replication_factor : int
        >= 1; 1 for the embedded broker.
    timeout : float
        Seconds (> 0) to wait for the topic to appear in metadata with all partitions.

    Returns
    -------
    bool
        True if this call created the topic, False if it existed already.

    Raises
    ------
    ConfigError
        Bad ``name``, ``partitions``, ``replication_factor`` or ``timeout``.
    IngestError
        The broker is unreachable or the topic did not appear within ``timeout`` s.

    Notes
    -----
    Idempotent and safe under races: ``TopicAlreadyExistsError`` counts as success.
    """
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    from ingest.clients import admin_client

    check_topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be an int >= 1, got {partitions!r}")
    rf = replication_factor
    if isinstance(rf, bool) or not isinstance(rf, int) or rf < 1:
        raise ConfigError(f"replication_factor must be an int >= 1, got {replication_factor!r}")
    if not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    s = KafkaSettings.coerce(settings)
    if not reachable(s):
        raise IngestError(f"no Kafka broker reachable at {s.bootstrap}")
    deadline = time.monotonic() + timeout
    try:
        admin = admin_client(s)
    except KafkaError as exc:
        raise IngestError(f"cannot connect to Kafka at {s.bootstrap}: {exc}") from exc
    created = False
    try:
        if name not in admin.list_topics():
            try:
                admin.create_topics(
                    [NewTopic(name, partitions, replication_factor, topic_configs=dict(config or {}))]
                )
                created = True
                logger.info("created topic %s with %d partitions", name, partitions)
            except TopicAlreadyExistsError:
                pass
        while True:
            try:
                (desc,) = admin.describe_topics([name])
                if desc.get("error_code", 0) == 0 and desc.get("partitions"):
                    n = len(desc["partitions"])
                    if not created and n != partitions:
                        logger.info("topic %s exists with %d partitions (requested %d)", name, n, partitions)
                    if not created or n >= partitions:
                        return created
            except KafkaError as exc:
                logger.debug("describe_topics(%s): %r", name, exc)
            if time.monotonic() > deadline:
                raise IngestError(f"topic {name!r} did not appear in metadata within {timeout:g} s")
            time.sleep(0.05)
    except KafkaError as exc:
        raise IngestError(f"could not create topic {name!r} at {s.bootstrap}: {exc}") from exc
    finally:
        admin.close()


def high_watermarks(consumer: Any, partitions: Iterable[Any] | None = None, *,
                    timeout_ms: int = 5000) -> dict[Any, int]:
    """End offset (offset of the next record to be written) per partition, robust to Tansu.

    Tansu's ``ListOffsets(latest)`` — what ``consumer.end_offsets()`` asks — returns the last
    batch's base offset + 1, too small when the last produced batch held several records
    (docs/kafka.md §2.2). The high watermark carried in fetch responses (``consumer.highwater(tp)``, known
    after a ``poll()``/fetch of that partition) is right. This returns, per partition,
    ``max(highwater, end_offsets)`` — correct on Apache Kafka (where both agree) and a lower bound
    that becomes exact once the partition has been fetched on Tansu.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A consumer with the partitions assigned (``assign`` or group assignment).
    partitions : iterable of TopicPartition, optional
        Defaults to ``consumer.assignment()``.
    timeout_ms : int
        Timeout of the ``end_offsets`` request.

    Returns
    -------
    dict TopicPartition → int
        Offsets (>= 0). To "read to the end", poll until ``position(tp) >= high_watermarks()[tp]``
        *after* at least one fetch of ``tp`` returned (the fetch refreshes the watermark).
    """
    tps = list(consumer.assignment() if partitions is None else partitions)
    if not tps:
        return {}
    try:
        listed = consumer.end_offsets(tps, timeout_ms=timeout_ms)
    except TypeError:  # older kafka-python without timeout_ms
        listed = consumer.end_offsets(tps)
    out: dict[Any, int] = {}
    for tp in tps:
        hw = None
        try:
            hw = consumer.highwater(tp)
        except Exception:  # partition not assigned: only the listed offset is available
            hw = None
        out[tp] = max(int(listed.get(tp) or 0), int(hw or 0))
    return out


def close_without_leaving(consumer: Any, timeout_ms: int | None = None) -> bool:
    """Close a group consumer without sending ``LeaveGroup``; for a member stopped during a group
    join (its first, or a rejoin after its partitions were revoked).

    On Tansu 0.6.0 a ``LeaveGroup`` sent while the member's ``JoinGroup`` is pending leaves the
    group looping in ``SyncGroup … coordinator rebalance`` for good: every other member of that
    group stays without partitions (docs/kafka.md §2.3). A member that
    just disconnects is dropped by the broker after ``session_timeout_ms``, as after a crash, and
    the group recovers. On Apache Kafka the cost is that the rebalance waits up to
    ``session_timeout_ms`` longer for the departed member; it owned no partitions (they were
    revoked), so nothing else changes.

    kafka-python 3.0's ``close()`` has no option to skip the leave. It skips it for a member whose
    generation has no member id, so this clears the coordinator's generation
    (``reset_generation``, its own API for a member that fell out of the group) first, then calls
    ``consumer.close(autocommit=False, timeout_ms=timeout_ms)``.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A subscribed consumer (any other object: only ``close(autocommit=False, …)`` is called).
    timeout_ms : int or None
        Passed to ``close``: how long it may wait for the broker (None: kafka-python's default).

    Returns
    -------
    bool
        Whether the generation could be cleared (False: this kafka-python has no coordinator
        attribute or ``reset_generation``; ``close`` then sends ``LeaveGroup`` as usual).

    Raises
    ------
    Exception
        Whatever ``consumer.close`` raises.
    """
    cleared = False
    reset = getattr(getattr(consumer, "_coordinator", None), "reset_generation", None)
    if callable(reset):
        try:
            reset()
            cleared = True
        except Exception:  # pragma: no cover - defensive: fall back to a normal close
            logger.debug("reset_generation failed; closing with LeaveGroup", exc_info=True)
    consumer.close(autocommit=False, timeout_ms=timeout_ms)
    return cleared
