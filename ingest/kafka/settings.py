"""Kafka client settings: :class:`KafkaSettings`, the one typed, frozen set of connection and
security settings (TLS, SASL) every client is built from (docs/kafka.md §2), and the client
timeouts shared by the project.

* :class:`KafkaSettings` — :meth:`~KafkaSettings.producer_config`,
  :meth:`~KafkaSettings.consumer_config`, :meth:`~KafkaSettings.admin_config` return kafka-python
  keyword arguments with TLS/SASL passed through;
* :data:`FAST_GROUP_SETTINGS` — consumer-group timeouts for ~3 s joins (docs/kafka.md §2.1);
* :data:`CLOSE_TIMEOUT_S` — how long a shutdown lets each client take to close.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from ingest.errors import ConfigError
from ingest.files import check_readable
from ingest.model import FrozenModel

__all__ = ["CLOSE_TIMEOUT_S", "FAST_GROUP_SETTINGS", "KafkaSettings", "SaslMechanism", "SecurityProtocol"]

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
