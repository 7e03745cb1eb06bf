"""Fixtures for integration tests against a real Kafka-protocol broker (embedded Tansu, docs/kafka.md §1).

* ``broker`` (session scope): one running :class:`ingest.local.broker.EmbeddedBroker` on 127.0.0.1 with
  a free port, stopped (and its process reaped) at the end of the session, also when tests fail.
* ``bootstrap_servers`` (session scope): its ``"127.0.0.1:PORT"``.
* ``topic_name`` (function scope): ``topic_name(prefix="t") -> str`` makes topic names unique to the
  test (tests share one broker, so never reuse a topic name across tests).
* ``fast_group_settings`` (session scope): consumer kwargs for fast consumer-group joins
  (``ingest.kafka.settings.FAST_GROUP_SETTINGS``: ~3 s joins against Tansu instead of ~20 s).

Every test in this directory is marked ``integration`` automatically.
"""

from __future__ import annotations

import itertools
import re
import uuid

import pytest

from ingest.kafka.settings import FAST_GROUP_SETTINGS
from ingest.local.broker import EmbeddedBroker

_counter = itertools.count()


def pytest_collection_modifyitems(config, items):
    """Mark every test collected under tests/integration/ as ``integration``."""
    for item in items:
        if "tests/integration/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def broker():
    """A running embedded Tansu broker shared by the whole test session."""
    b = EmbeddedBroker(startup_timeout=30.0)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def bootstrap_servers(broker) -> str:
    """``"127.0.0.1:PORT"`` of the session broker."""
    return broker.bootstrap_servers


@pytest.fixture
def topic_name(request):
    """Factory ``topic_name(prefix="t") -> str`` of topic names unique to this test and call."""
    test = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:80]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{next(_counter)}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture(scope="session")
def fast_group_settings() -> dict:
    """kafka-python consumer kwargs for fast group joins (session timeout 6 s, heartbeat 1 s, poll 10 s)."""
    return dict(FAST_GROUP_SETTINGS)
