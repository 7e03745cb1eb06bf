"""The pipeline's query plan: decode, double, build and restore states, independent of Kafka.

:class:`PipelineRuntime` is built once from a typed :class:`aggregator.config.PipelineConfig`
(:meth:`PipelineRuntime.from_config`): the schema, the queries, and the custom losses the config
resolved when it was loaded. The worker (``aggregator.worker``), ``serve`` and ``analyze`` all
use it; it imports neither the worker loop nor any Kafka client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from aggregator.errors import ConfigError
from ingest.client.batch import ReportBatch, concat_batches, slice_batch
from ingest.errors import DecodeError

if TYPE_CHECKING:
    from aggregator.config import PipelineConfig

__all__ = ["PipelineRuntime"]

log = logging.getLogger(__name__)


class PipelineRuntime:
    """Everything the worker needs to know about the pipeline, independent of Kafka.

    Parameters
    ----------
    name : str
        Pipeline (query-set) name: prefix of the state-topic keys. Non-empty, no ``/``.
    fingerprint : bytes
        16-byte fingerprint of the schema the states are built for.
    decode : callable bytes → ReportBatch
        Decoder of one reports-topic record; raises :class:`ingest.errors.DecodeError` (with a
        ``reason``) on anything it refuses, including unknown fingerprints.
    new_states : callable () → dict str → state
        Fresh (empty) state per query name.
    restore_state : callable (name, bytes) → state
        Inverse of ``state.to_bytes()`` for the query ``name``; raises on a corrupt blob.
    double : callable (ReportBatch, bytes) → ndarray (n, d)
        ``X̃₂`` of the batch, seeded from the record bytes (docs/mechanisms.md §2.2).
    queries : mapping or None
        Query specs by name; their names are the plan's query set (checkpoints must hold exactly
        these). ``None``: the names of ``new_states()``.
    schema : TelemetrySchema or None
        The schema (for ``privacy_summary`` and analyze's columns).
    decode_many : callable list[bytes] → (ReportBatch or None, list[int or DecodeError]) or None
        Batched decoder (``ingest.client.codec.decode_many``); None: ``decode`` record by record.
    double_many : callable (ReportBatch, list[bytes], list[int]) → ndarray (n, d) or None
        ``X̃₂`` of a batch made of several records (their bytes and report counts), equal to
        ``double`` applied record by record; None: ``double`` on slices.
    losses : mapping str → loss or None
        The resolved loss object of each custom query, by query name (resolved once when the
        config was loaded: :attr:`aggregator.config.PipelineConfig.losses`).

    Raises
    ------
    ConfigError
        If ``name`` is empty or contains ``/`` or ``fingerprint`` is not 16 bytes.
    """

    def __init__(self, name: str, fingerprint: bytes, decode: Callable[[bytes], ReportBatch],
                 new_states: Callable[[], dict], restore_state: Callable[[str, bytes], Any],
                 double: Callable[[ReportBatch, bytes], np.ndarray], queries: Mapping | None = None,
                 schema: Any = None, decode_many: Callable | None = None,
                 double_many: Callable | None = None, losses: Mapping | None = None) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"pipeline name must be a non-empty string without '/', got {name!r}")
        if not isinstance(fingerprint, bytes) or len(fingerprint) != 16:
            raise ConfigError(f"fingerprint must be 16 bytes, got {fingerprint!r}")
        self.name = name
        self.fingerprint = fingerprint
        self.decode = decode
        self.new_states = new_states
        self.restore_state = restore_state
        self.double = double
        self.queries = dict(queries or {})
        self.schema = schema
        self.losses = dict(losses or {})
        self._decode_many = decode_many
        self._double_many = double_many
        self._names = tuple(self.queries) if queries is not None else None
        #: Names of the windowed queries (their states need event times: docs/windows.md §3).
        self.windowed = tuple(n for n, q in self.queries.items() if getattr(q, "window", None) is not None)

    @property
    def query_names(self) -> tuple[str, ...]:
        """Names of the plan's queries (what a checkpoint must hold), without building states."""
        if self._names is None:
            self._names = tuple(self.new_states())
        return self._names

    def decode_many(self, values: list) -> tuple[ReportBatch | None, list]:
        """Decode records into one batch: ``(batch or None, [report count or DecodeError per
        record])``, the same outcome per record as :attr:`decode` (see ``codec.decode_many``)."""
        if self._decode_many is not None:
            return self._decode_many(values)
        good, results = [], []
        for v in values:
            try:
                b = self.decode(v)
            except DecodeError as exc:
                results.append(exc)
            else:
                good.append(b)
                results.append(b.n)
        return (concat_batches(good) if good else None), results

    def double_many(self, batch: ReportBatch, records: list, counts: list[int]) -> np.ndarray:
        """``X̃₂`` of a batch made of ``records`` (with ``counts`` reports each, in order): the
        rows of each record doubled with its own seed, as :attr:`double` does."""
        if self._double_many is not None:
            return self._double_many(batch, records, counts)
        if len(records) == 1:
            return self.double(batch, records[0])
        out, start = [], 0
        for rec, n in zip(records, counts, strict=True):
            out.append(self.double(slice_batch(batch, start, start + n), rec))
            start += n
        return np.concatenate(out, axis=0)

    @classmethod
    def from_config(cls, config: PipelineConfig) -> PipelineRuntime:
        """Build the plan of a :class:`aggregator.config.PipelineConfig`.

        Uses ``ingest.client.codec.decode`` with the pipeline's schema as the only known schema,
        ``aggregator.state.build_state`` and ``state_from_bytes`` with each custom query's
        resolved loss (so neither imports user code), and ``aggregator.state.Doubler``'s
        doubling of the schema.

        Raises
        ------
        ConfigError
            If the configuration cannot be turned into states (propagated from the builders).
        """
        from aggregator import state as state_mod
        from aggregator.state.registry import state_class
        from ingest.client import codec, decode_kernel

        schema = config.telemetry_schema
        queries = {q.name: q for q in config.queries}
        losses = config.losses  # imported once, when the config was loaded
        fp = bytes(schema.fingerprint)
        known = {fp: schema}
        doubler = state_mod.Doubler(schema)

        def new_states() -> dict:
            return {name: state_mod.build_state(q, schema, loss=losses.get(name))
                    for name, q in queries.items()}

        def restore_state(name: str, blob: bytes):
            q = queries[name]  # the class build_state uses: a blob of another class is refused
            return state_mod.state_from_bytes(blob, q, schema, expected=state_class(q),
                                              loss=losses.get(name))

        new_states()  # build once so configuration errors surface here
        decode_kernel.warm()  # compile or load decode_many's compiled pass now, not on the first poll

        return cls(
            name=config.pipeline.name,
            fingerprint=fp,
            decode=lambda data: codec.decode(data, known),
            decode_many=lambda values: codec.decode_many(values, known),
            double_many=doubler.double_many,
            new_states=new_states,
            restore_state=restore_state,
            double=doubler.double,
            queries=queries,
            schema=schema,
            losses=losses,
        )

    def __repr__(self) -> str:
        return f"PipelineRuntime(name={self.name!r}, queries={list(self.queries)})"
