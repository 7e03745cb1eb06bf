"""Frequency state of a categorical (uRR / uRAP) field: mergeable counts
(docs/frequency.md §8; docs/mechanisms.md §6.4).

Wraps ``mechanisms.uldp``: ``mechanism.counts(column)`` per batch, exact merge with ``+``, and
``mechanism.estimate(counts, method, level)`` for the estimate.
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import categorical_params
from aggregator.state.base import Estimate, State
from mechanisms.errors import ParameterError
from mechanisms.uldp.counts import FrequencyCounts
from mechanisms.uldp.sparse import SparseBits

__all__ = ["CountsState"]


class CountsState(State):
    """Counts of one categorical field's reports; estimate = category distribution.

    Parameters
    ----------
    query : FrequencyQuery
    schema : TelemetrySchema

    Notes
    -----
    ``params`` are the category names (plus ``bot1 … botκ`` for PUM fields, over the extended
    domain). ``stderr`` is the plug-in standard error of the empirical estimator
    (``sqrt(m̂(1−m̂)/n)/slope``); for threshold/projected/em it is a conservative yardstick.
    Merging is exact (integer counts). ``x2`` is not used. uRAP pattern counts (what EM needs) are
    kept only for ``method = "em"``.

    Raises
    ------
    ConfigError
        If the field is not a categorical field of the schema.
    """

    kinds = ("frequency",)

    def __init__(self, query, schema) -> None:
        super().__init__(query, schema)
        field = self.query.field
        if field not in tuple(getattr(schema, "categorical_names", ())):
            raise ConfigError(
                f"queries.{self.name}.field: {field!r} is not a categorical field of the schema")
        self.mechanism = schema.categorical_mechanism(field)
        if self.query.method != "em" and getattr(self.mechanism, "max_patterns", 0):
            # the distinct sensitive-bit patterns of uRAP reports serve only EM; counting them
            # would take most of a worker's time for this state (a dict of hex keys per record)
            self.mechanism.max_patterns = 0
        self._fast = None
        from mechanisms.uldp import URAP

        if isinstance(self.mechanism, URAP) and self.mechanism.max_patterns == 0:
            from aggregator.state import _kernels

            _kernels.warm()
            rank = np.asarray(self.mechanism._rank, dtype=np.int64)
            self._fast = (_kernels.urap_counts, rank, self.mechanism.signature)
        self.params = categorical_params(schema, field)
        self.counts = self.mechanism.empty_counts()
        self._empty = self.mechanism.empty_counts()  # what empty_copy starts from

    def empty_copy(self) -> CountsState:
        """An empty state sharing this one's mechanism (not changed after construction)."""
        out = self._shallow()
        out.counts = self._empty.copy()
        return out

    def _update(self, batch, x2) -> None:
        try:
            col = batch.categorical[self.query.field]
        except KeyError:
            raise StateError(f"batch has no categorical column {self.query.field!r}") from None
        if self._fast is not None and isinstance(col, SparseBits) and col.k == self.mechanism.k:
            if self.counts.patterns:
                self.counts += self._urap_counts(col)
            else:  # no pattern kept: adding the arrays is the merge
                self._urap_counts(col, into=self.counts)
        else:
            self.counts += self.mechanism.counts(col)

    def _urap_counts(self, col, into: FrequencyCounts | None = None) -> FrequencyCounts | None:
        """``mechanism.counts(col)`` for uRAP without pattern tracking, by the compiled loop
        (:func:`aggregator.state._kernels.urap_counts`; equal results, test_kernels); with
        ``into``, added to it in place (:meth:`FrequencyCounts.add_unpatterned`) instead."""
        kernel, rank, signature = self._fast
        m = self.mechanism
        counts, protected, ob, bad, nbad = kernel(col.indices, col.offsets, rank, m.k, m.s)
        if bad >= 0:
            raise ParameterError(f"reports: report {bad} has {nbad} non-sensitive bits set (max 1)")
        if into is not None:
            into.add_unpatterned(col.n, counts, int(protected), ob)
            return None
        return FrequencyCounts(signature, col.n, counts, {}, int(protected), ob, 0)

    def _merge(self, other: CountsState) -> None:
        self.counts = self.counts + other.counts

    def estimate(self) -> Estimate:
        """Estimated distribution over ``params`` (see the class notes).

        Raises
        ------
        EmptyStateError
            With no report.
        """
        self._require_n(1)
        est = self.mechanism.estimate(self.counts, self.query.method, level=self.query.level)
        return Estimate(self.name, self.params, est.p, est.stderr, est.ci_low, est.ci_high,
                        self.counts.n, self.query.level, self.query.method)

    def _get_data(self) -> dict:
        return {"counts": self.counts.to_dict()}

    def _set_data(self, data: dict) -> None:
        counts = FrequencyCounts.from_dict(data["counts"])
        if counts.signature != self.counts.signature:
            raise StateError("serialized counts belong to another mechanism")
        self.counts = counts

    def __repr__(self) -> str:
        try:
            return (f"CountsState(query={self.name!r}, field={self.query.field!r}, "
                    f"method={self.query.method}, n={self._n}, k={np.size(self.counts.counts)})")
        except Exception:
            return "<CountsState (unprintable)>"
