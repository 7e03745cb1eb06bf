"""Fakes of the worker's Kafka clients and helpers shared by the worker's unit tests (no broker)."""

from __future__ import annotations

import time
import types

from aggregator.checkpoint import Checkpoint
from aggregator.config import PipelineConfig
from aggregator.worker import KafkaClients, PartitionState, PipelineRuntime, Worker
from tests.integration import pipeline_support as ps


def build_runtime() -> PipelineRuntime:
    """The plan of a flights pipeline with every available query."""
    import tomllib

    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    cfg = PipelineConfig.from_dict(tomllib.loads(text + ps.available_queries()))
    return PipelineRuntime.from_config(cfg)


def build_records(runtime) -> list[bytes]:
    """12 encoded records of 7 reports each."""
    return ps.make_records(runtime.schema, n_records=12, per_record=7, seed=3)


class FakeFuture:
    """A send future as kafka-python's: ``is_done`` once the broker answered (here at once)."""

    def __init__(self, error=None, done=True):
        self.error = error
        self.is_done = done

    def add_errback(self, fn):
        if self.is_done and self.error is not None:
            fn(self.error)
        return self

    def get(self, timeout=None):
        assert self.is_done, "get() of an unacknowledged record would block"
        if self.error is not None:
            raise self.error
        return None


class FakeProducer:
    def __init__(self, error=None):
        self.sent = []
        self.error = error

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value, dict(headers or [])))
        return FakeFuture(self.error)

    def flush(self, timeout=None):
        pass


def rec(offset, value, partition=0):
    return types.SimpleNamespace(topic="reports", partition=partition, offset=offset, key=None, value=value)


def make_worker(runtime, producer=None, consumer=None, **kw):
    """A worker over fake clients (``FakeProducer``, ``FakeConsumer`` without records) that owns
    partition 0, restored empty."""
    clients = KafkaClients(FakeConsumer([]) if consumer is None else consumer,
                           FakeProducer() if producer is None else producer)
    w = Worker(runtime, lambda: clients, reports_topic="reports", state_topic="state",
               dead_letter_topic="dlq", group_id="g", **kw).open()
    w.owned[0] = PartitionState(0, 0, runtime.new_states())
    return w


def with_update_thread(w):
    w.threads.start()
    return w


class FakeConsumer:
    """``poll`` hands out the given poll results, then nothing (after a short wait)."""

    def __init__(self, polls, on_poll=None):
        from kafka import TopicPartition

        self.polls = list(polls)
        self.calls = 0
        self.on_poll = on_poll
        self.commits = []
        self.assigned = {TopicPartition("reports", 0), TopicPartition("reports", 1)}
        self.paused = set()

    def assignment(self):
        return set(self.assigned)

    def pause(self, *tps):
        self.paused.update(tps)

    def seek(self, tp, offset):
        self.seeks = [*getattr(self, "seeks", []), (tp.partition, offset)]

    def poll(self, timeout_ms=0, max_records=None):
        self.calls += 1
        if self.on_poll is not None:
            self.on_poll(self.calls)
        if self.polls:
            return self.polls.pop(0)
        time.sleep(0.005)
        return {}

    def subscribe(self, topics, listener=None):
        self.subscribed = (list(topics), listener)

    def highwater(self, tp):
        return None

    def commit(self, offsets):
        self.commits.append(offsets)

    def close(self, autocommit=True, timeout_ms=None):
        pass


def run_on(w, max_reports):
    """``w.run`` over the worker's fake consumer."""
    return w.run(max_reports=max_reports)


def polls(records, sizes):
    from kafka import TopicPartition

    tp, out, start = TopicPartition("reports", 0), [], 0
    for n in sizes:
        out.append({tp: [rec(start + i, records[start + i]) for i in range(n)]})
        start += n
    return out


def inline_checkpoint(runtime, records, sizes):
    """The checkpoint of a worker without threads that folds the polls of ``polls(records,
    sizes)`` one by one in the calling thread (the reference for the threaded runs)."""
    ref = make_worker(runtime)
    for got in polls(records, sizes):
        (recs,) = got.values()
        ref.process(0, recs)
    ref.checkpoint(force=True)
    return Checkpoint.from_bytes(ref.producer.sent[-1][2])


class UnackedProducer(FakeProducer):
    """Records stay unacknowledged until ``flush`` (or a test sets ``is_done``)."""

    def __init__(self):
        super().__init__()
        self.futures = []

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value, dict(headers or [])))
        self.futures.append(FakeFuture(done=False))
        return self.futures[-1]

    def flush(self, timeout=None):
        for f in self.futures:
            f.is_done = True


def state_offsets(producer):
    return [Checkpoint.from_bytes(v).next_offset for t, _, v, _ in producer.sent if t == "state"]


class Coordinator:
    def __init__(self):
        self.resets = 0

    def reset_generation(self):
        self.resets += 1


class GroupConsumer(FakeConsumer):
    def __init__(self):
        super().__init__([])
        self._coordinator = Coordinator()
        self.closed = []

    def close(self, autocommit=True, timeout_ms=None):
        self.closed.append(autocommit)


class ClosingProducer(FakeProducer):
    def __init__(self, error=None):
        super().__init__(error)
        self.closed = []

    def close(self, timeout=None):
        self.closed.append(timeout)
