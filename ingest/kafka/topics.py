"""Topics: :func:`check_topic_name` (the names Kafka accepts, checked before any connection) and
:func:`ensure_topic` (idempotent creation that waits for the broker's metadata)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping

from ingest.errors import ConfigError, IngestError
from ingest.kafka.clients import admin_client, reachable
from ingest.kafka.settings import KafkaSettings

logger = logging.getLogger(__name__)

__all__ = ["check_topic_name", "ensure_topic"]


def check_topic_name(name, key: str = "name") -> str:
    """Return ``name`` if Kafka accepts it as a topic name: 1–249 characters of
    ``[A-Za-z0-9._-]``, not ``.`` or ``..``.

    Raises
    ------
    ConfigError
        ``<key> must be 1-249 characters of [A-Za-z0-9._-], got '…'``.
    """
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
