"""KafkaSettings: validation, TLS/SASL pass-through to kafka-python kwargs (docs/kafka.md §2)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ingest.errors import ConfigError
from ingest.kafka.settings import FAST_GROUP_SETTINGS, KafkaSettings
from ingest.kafka.transport import KafkaPythonTransport, Transport


def test_plaintext_defaults():
    s = KafkaSettings(bootstrap_servers="127.0.0.1:9092, 127.0.0.1:9093")
    assert s.bootstrap_servers == ("127.0.0.1:9092", "127.0.0.1:9093")
    assert s.bootstrap == "127.0.0.1:9092,127.0.0.1:9093"
    p = s.producer_config()
    assert p["bootstrap_servers"] == ["127.0.0.1:9092", "127.0.0.1:9093"]
    assert p["security_protocol"] == "PLAINTEXT"
    assert p["acks"] == "all"
    assert not any(k.startswith(("sasl_", "ssl_")) for k in p)
    c = s.consumer_config()
    assert "group_id" not in c and "acks" not in c


@pytest.fixture
def pem(tmp_path):
    """Readable stand-ins for the TLS files (their existence is checked when a client is built)."""
    def make(name: str) -> str:
        path = tmp_path / name
        path.write_text("-----BEGIN CERTIFICATE-----\n")
        return str(path)
    return make


def test_sasl_ssl_pass_through_and_secret_hidden(pem):
    ca, cert, key = pem("ca.pem"), pem("client.pem"), pem("client.key")
    s = KafkaSettings(
        bootstrap_servers=["broker.example:9093"],
        client_id="dev-42",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password="s3cr3t-pw",
        ssl_cafile=ca,
        ssl_certfile=cert,
        ssl_keyfile=key,
        ssl_password="keypw",
        ssl_check_hostname=False,
    )
    for cfg in (s.producer_config(), s.consumer_config("g"), s.admin_config()):
        assert cfg["security_protocol"] == "SASL_SSL"
        assert cfg["sasl_mechanism"] == "SCRAM-SHA-512"
        assert cfg["sasl_plain_username"] == "alice"
        assert cfg["sasl_plain_password"] == "s3cr3t-pw"
        assert cfg["ssl_cafile"] == ca
        assert cfg["ssl_certfile"] == cert
        assert cfg["ssl_keyfile"] == key
        assert cfg["ssl_password"] == "keypw"
        assert cfg["ssl_check_hostname"] is False
        assert cfg["client_id"] == "dev-42"
    assert "s3cr3t-pw" not in repr(s) and "s3cr3t-pw" not in str(s)
    assert "keypw" not in repr(s)


def test_ssl_only(pem):
    ca = pem("ca.pem")
    s = KafkaSettings(bootstrap_servers="h:9093", security_protocol="SSL", ssl_cafile=ca)
    cfg = s.producer_config()
    assert cfg["security_protocol"] == "SSL" and cfg["ssl_cafile"] == ca
    assert "sasl_mechanism" not in cfg


def test_an_unreadable_tls_file_is_named_when_a_client_is_built(tmp_path):
    """A missing CA file made kafka-python retry ~30 s logging 'No such file or directory' without
    the name; the settings load (the file may exist only where the worker runs)."""
    from ingest.errors import ConfigError

    missing = str(tmp_path / "nope" / "ca.pem")
    s = KafkaSettings(bootstrap_servers="h:9093", security_protocol="SSL", ssl_cafile=missing)
    for build in (s.producer_config, s.admin_config, lambda: s.consumer_config("g")):
        with pytest.raises(ConfigError) as exc:
            build()
        assert str(exc.value) == f"kafka.ssl_cafile: cannot read {missing!r}: No such file or directory"


def test_configs_are_accepted_by_kafka_python(pem):
    """Every key we emit is a real kafka-python option (no broker contacted)."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    s = KafkaSettings(
        bootstrap_servers="h:9093", security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
        sasl_plain_username="u", sasl_plain_password="p", ssl_cafile=pem("ca.pem"),
        ssl_certfile=pem("c.pem"), ssl_keyfile=pem("k.pem"), ssl_password="x",
    )
    pairs = ((s.producer_config(), KafkaProducer), (s.consumer_config("g", fast_group=True), KafkaConsumer),
             (s.admin_config(), KafkaAdminClient))
    for cfg, cls in pairs:
        unknown = set(cfg) - set(cls.DEFAULT_CONFIG)
        assert not unknown, (cls.__name__, unknown)


def test_fast_group_settings():
    assert dict(FAST_GROUP_SETTINGS) == {
        "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 10000}
    c = KafkaSettings(bootstrap_servers="h:1").consumer_config("grp", fast_group=True, max_poll_records=7)
    assert c["group_id"] == "grp" and c["session_timeout_ms"] == 6000 and c["max_poll_records"] == 7
    assert "session_timeout_ms" not in KafkaSettings(bootstrap_servers="h:1").consumer_config("grp")


def test_overrides_and_extra():
    s = KafkaSettings(bootstrap_servers="h:1", extra={"api_version": (3, 0)})
    assert s.producer_config(linger_ms=7, acks=1) | {} == s.producer_config(linger_ms=7, acks=1)
    assert s.producer_config(acks=1)["acks"] == 1
    assert s.admin_config()["api_version"] == (3, 0)
    # from TOML the version is an array; kafka-python refuses anything but a tuple
    t = KafkaSettings(bootstrap_servers="h:1", extra={"api_version": [2, 5, 0], "client_rack": "r1"})
    for cfg in (t.admin_config(), t.producer_config(), t.consumer_config()):
        assert cfg["api_version"] == (2, 5, 0) and type(cfg["api_version"]) is tuple
    # each extra reaches the client kinds that accept it: kafka-python refuses unknown keys
    assert t.consumer_config()["client_rack"] == "r1"
    assert "client_rack" not in t.producer_config() and "client_rack" not in t.admin_config()
    p = KafkaSettings(bootstrap_servers="h:1", extra={"linger_ms": 5, "acks": 1})
    assert p.producer_config()["linger_ms"] == 5 and p.producer_config()["acks"] == 1
    assert "linger_ms" not in p.consumer_config() and "acks" not in p.admin_config()


def test_extra_clients_accept_what_they_are_given():
    """Every client kind is built from its config with a producer-only and a consumer-only extra."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    s = KafkaSettings(bootstrap_servers="h:1", extra={"linger_ms": 5, "client_rack": "r1"})
    for cls, cfg in ((KafkaProducer, s.producer_config()), (KafkaConsumer, s.consumer_config("g")),
                     (KafkaAdminClient, s.admin_config())):
        assert not set(cfg) - set(cls.DEFAULT_CONFIG), cls.__name__


def test_extra_key_that_no_client_knows_is_refused():
    with pytest.raises(ValidationError, match=r"'linger' is no option of kafka-python"):
        KafkaSettings(bootstrap_servers="h:1", extra={"linger": 5})


def test_frozen():
    s = KafkaSettings(bootstrap_servers="h:1")
    with pytest.raises(ValidationError):
        s.client_id = "x"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bootstrap_servers": ""}, "at least one"),
        ({"bootstrap_servers": "nohost"}, "host:port"),
        ({"bootstrap_servers": "h:99999"}, "host:port"),
        ({"bootstrap_servers": "h:1", "security_protocol": "TLS"}, "security_protocol"),
        ({"bootstrap_servers": "h:1", "security_protocol": "SASL_SSL"}, "sasl_mechanism is required"),
        ({"bootstrap_servers": "h:1", "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
          "sasl_plain_password": "p"}, "needs security_protocol"),
        ({"bootstrap_servers": "h:1", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
         "sasl_plain_username and sasl_plain_password are required"),
        ({"bootstrap_servers": "h:1", "ssl_cafile": "/ca"}, "ssl_cafile needs security_protocol SSL"),
        ({"bootstrap_servers": "h:1", "security_protocol": "SSL", "ssl_certfile": "/c"}, "given together"),
        ({"bootstrap_servers": "h:1", "request_timeout_ms": 10}, "request_timeout_ms"),
        ({"bootstrap_servers": "h:1", "bogus": 1}, "bogus"),
    ],
)
def test_invalid(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        KafkaSettings(**kwargs)


def test_coerce():
    s = KafkaSettings(bootstrap_servers="h:1")
    assert KafkaSettings.coerce(s) is s
    assert KafkaSettings.coerce("a:1,b:2").bootstrap_servers == ("a:1", "b:2")
    assert KafkaSettings.coerce(["a:1"]).bootstrap_servers == ("a:1",)
    with pytest.raises(ConfigError, match="bootstrap_servers"):
        KafkaSettings.coerce("nope")
    with pytest.raises(ConfigError, match="settings must be"):
        KafkaSettings.coerce(3)


def test_transport_protocol():
    assert issubclass(KafkaPythonTransport, Transport)
    with pytest.raises(ConfigError, match="linger_s"):
        KafkaPythonTransport("h:1", linger_s=-1)
    with pytest.raises(ConfigError, match="delivery_timeout_s"):
        KafkaPythonTransport("h:1", delivery_timeout_s=0)


def test_close_without_leaving_clears_the_generation_first():
    from ingest.kafka.groups import close_without_leaving

    calls = []

    class Coordinator:
        def reset_generation(self):
            calls.append("reset")

    class Consumer:
        _coordinator = Coordinator()

        def close(self, autocommit=True, timeout_ms=None):
            calls.append(("close", autocommit, timeout_ms))

    assert close_without_leaving(Consumer(), timeout_ms=1500) is True
    assert calls == ["reset", ("close", False, 1500)]

    class Bare:  # no coordinator attribute: a normal close, reported as such
        def close(self, autocommit=True, timeout_ms=None):
            calls.append(("bare", autocommit, timeout_ms))

    assert close_without_leaving(Bare()) is False
    assert calls[-1] == ("bare", False, None)
