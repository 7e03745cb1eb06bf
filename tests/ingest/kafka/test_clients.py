"""ingest.kafka.clients: every client from KafkaSettings, and reading a topic to its end."""

from __future__ import annotations

import types

import pytest

from ingest.kafka import clients
from ingest.kafka.settings import KafkaSettings


class Consumer:
    """Partitions with ``ends`` records each; ``end_offsets`` lists ``listed`` (Tansu: too small);
    a poll returns up to 2 records of each partition and sets its fetch high watermark."""

    def __init__(self, ends: dict, listed: dict):
        self.ends, self.listed = ends, listed
        self.pos = dict.fromkeys(ends, 0)
        self.hw: dict = {}

    def end_offsets(self, tps, timeout_ms=None):
        return {tp: self.listed[tp] for tp in tps}

    def highwater(self, tp):
        return self.hw.get(tp)

    def position(self, tp):
        return self.pos[tp]

    def poll(self, timeout_ms=0):
        out = {}
        for tp, end in self.ends.items():
            self.hw[tp] = end
            n = min(2, end - self.pos[tp])
            if n:
                out[tp] = [types.SimpleNamespace(offset=self.pos[tp] + i) for i in range(n)]
                self.pos[tp] += n
        return out


def test_read_to_end_goes_past_a_too_small_end_offset():
    """Tansu's ListOffsets can be below the end: the fetch high watermark decides."""
    c = Consumer({"a": 5, "b": 0}, listed={"a": 1, "b": 0})
    got: dict = {}
    clients.read_to_end(c, ["a", "b"], lambda tp, recs: got.setdefault(tp, []).extend(recs),
                        timeout_s=5, on_timeout=lambda: AssertionError("timed out"))
    assert [r.offset for r in got["a"]] == [0, 1, 2, 3, 4] and "b" not in got


def test_read_to_end_raises_the_callers_error_in_time():
    c = Consumer({"a": 5}, listed={"a": 5})
    c.poll = lambda timeout_ms=0: {}  # the broker never answers

    class Late(Exception):
        pass

    with pytest.raises(Late):
        clients.read_to_end(c, ["a"], lambda tp, recs: None, timeout_s=0.05, on_timeout=Late)


def test_every_client_gets_the_security_settings(monkeypatch, tmp_path):
    import kafka

    from ingest.kafka.settings import _client_options

    _client_options()  # the real clients' option names, before they are replaced below
    made = []

    def recorder(kind):
        return lambda **kw: made.append((kind, kw))

    for kind in ("KafkaConsumer", "KafkaProducer", "KafkaAdminClient"):
        monkeypatch.setattr(kafka, kind, recorder(kind))
    s = KafkaSettings(bootstrap_servers="h:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username="u", sasl_plain_password="p")
    clients.consumer_client(s, group_id="g", fast_group=True)
    clients.reader_client(s)
    clients.producer_client(s, linger_ms=5)
    clients.admin_client(s)
    assert [k for k, _ in made] == ["KafkaConsumer", "KafkaConsumer", "KafkaProducer", "KafkaAdminClient"]
    for _, kw in made:
        assert kw["security_protocol"] == "SASL_PLAINTEXT" and kw["sasl_plain_password"] == "p"
    assert made[0][1]["group_id"] == "g" and made[0][1]["session_timeout_ms"] == 6000
    assert made[1][1]["auto_offset_reset"] == "earliest" and "group_id" not in made[1][1]
    assert made[2][1]["acks"] == "all" and made[2][1]["linger_ms"] == 5
