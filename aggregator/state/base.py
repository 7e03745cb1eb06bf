"""State base API shared by every estimator family (docs/mechanisms.md §6).

A *state* is the mergeable, serializable summary a worker keeps per (query, partition):

* ``update(batch, x2)`` folds in a :class:`ingest.client.batch.ReportBatch`; ``x2`` is the consumer-side
  doubled numeric block ``X̃₂ = X̃₁ + sqrt(δλ²)·range·sqrt(W)·G`` (``zil.double``'s distribution)
  drawn from the record bytes (:mod:`aggregator.state.doubling`) and passed to every state;
* ``merge(other)`` / ``+`` / ``+=`` combine partitions (exact for sufficient statistics);
* ``estimate()`` returns an :class:`Estimate` in original units;
* ``to_bytes()`` / ``from_bytes(data, query, schema)`` use plain data — a JSON document with
  base64-encoded little-endian arrays, never pickle (:mod:`aggregator.state.serialize`);
* ``n`` is the number of reports folded in; ``repr`` never raises.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import stats

from aggregator.errors import EmptyStateError, StateError
from aggregator.queries import parse_query
from aggregator.state.serialize import (
    _restore,
    query_digest,
    schema_fingerprint,
    state_from_bytes,
    state_to_bytes,
)

__all__ = ["EmptyStateError", "Estimate", "State", "normal_critical"]

log = logging.getLogger(__name__)


def normal_critical(level: float) -> float:
    """Two-sided standard-normal critical value ``z_{(1+level)/2}`` (1.959964 for 0.95)."""
    return float(stats.norm.ppf(0.5 + level / 2.0))


def _ro(a) -> np.ndarray:
    arr = np.array(a, dtype=np.float64, copy=True).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Estimate:
    """An estimate with standard errors and confidence intervals, in original units.

    Attributes
    ----------
    query : str
        Query name.
    params : tuple of str
        Names of the estimated quantities, e.g. ``("mean",)``, ``("q0.5", "q0.9")``, category
        names, or ``("intercept", "distance", …)``.
    value, stderr, ci_low, ci_high : ndarray of float64, shape (len(params),)
        Point estimates, standard errors and the confidence interval at ``level``. ``stderr`` may
        be ``inf`` (e.g. one report) — never NaN.
    n : int
        Number of reports the estimate uses.
    level : float
        Confidence level of ``[ci_low, ci_high]``.
    estimator : str
        ``"sdr"``, ``"dr"``, ``"sl"``, ``"naive"``, ``"deconvolution"`` or a frequency method.
    notes : tuple of str
        What the estimate cannot say, e.g. ``"component 2: its corrected cell weight … is not
        positive"`` (k-means and mixtures, docs/mechanisms.md §7.6); the parameters concerned have
        an infinite ``stderr``. Empty for most estimates.

    Raises
    ------
    StateError
        If the arrays do not all have ``len(params)`` entries.
    """

    query: str
    params: tuple[str, ...]
    value: np.ndarray
    stderr: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: int
    level: float
    estimator: str
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(str(p) for p in self.params))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        k = len(self.params)
        for name in ("value", "stderr", "ci_low", "ci_high"):
            arr = _ro(getattr(self, name))
            if arr.shape != (k,):
                raise StateError(f"Estimate.{name} must have {k} entries (one per param), got {arr.shape}")
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "level", float(self.level))

    def __getitem__(self, param: str) -> tuple[float, float, float, float]:
        """``(value, stderr, ci_low, ci_high)`` of one parameter."""
        i = self.params.index(param)
        return (float(self.value[i]), float(self.stderr[i]), float(self.ci_low[i]), float(self.ci_high[i]))

    def to_dict(self) -> dict:
        """JSON-ready dict; non-finite numbers (an infinite stderr/CI) become ``None``; ``notes``
        only when there are some."""
        def fl(a):
            return [float(v) if math.isfinite(v) else None for v in a]

        return {
            "query": self.query,
            "estimator": self.estimator,
            "n": self.n,
            "level": self.level,
            "params": list(self.params),
            "value": fl(self.value),
            "stderr": fl(self.stderr),
            "ci_low": fl(self.ci_low),
            "ci_high": fl(self.ci_high),
        } | ({"notes": list(self.notes)} if self.notes else {})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Estimate):
            return NotImplemented
        return (
            (self.query, self.params, self.n, self.level, self.estimator)
            == (other.query, other.params, other.n, other.level, other.estimator)
            and all(np.array_equal(getattr(self, a), getattr(other, a), equal_nan=True)
                    for a in ("value", "stderr", "ci_low", "ci_high"))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        try:
            body = ", ".join(f"{p}={v:.6g}±{s:.3g}" for p, v, s in zip(self.params, self.value, self.stderr))
            return f"Estimate({self.query!r}, {self.estimator}, n={self.n}, {body})"
        except Exception:  # pragma: no cover - repr must never raise
            return "Estimate(<unprintable>)"


class State(ABC):
    """Base class of every mergeable state.

    Subclasses set ``kinds`` (the query kinds they serve), implement ``_update``, ``_merge``,
    ``estimate``, ``_get_data`` and ``_set_data``, and call ``super().__init__``.

    Parameters
    ----------
    query : Query or mapping
    schema : ingest.client.schema.TelemetrySchema

    Raises
    ------
    ConfigError
        If the query does not fit the schema (unknown field, wrong field type).
    """

    kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, query, schema) -> None:
        self.query = parse_query(query)
        self.schema = schema
        self._n = 0

    # -------------------------------------------------------------- public API
    @property
    def n(self) -> int:
        """Number of reports folded in (across merges)."""
        return int(self._n)

    @property
    def name(self) -> str:
        """The query name."""
        return self.query.name

    def update(self, batch, x2: np.ndarray | None = None) -> State:
        """Fold a batch of reports in.

        Parameters
        ----------
        batch : ingest.client.batch.ReportBatch
            ``batch.numeric`` is ``X̃₁``, shape (n, d), original units.
        x2 : ndarray of shape (n, d) or None
            Doubled block ``X̃₂`` for the same rows (required by states that use it).

        Returns
        -------
        self

        Raises
        ------
        StateError
            If the batch's fingerprint is not the schema's, or ``x2`` is missing / mis-shaped
            where needed.
        """
        fp = getattr(self.schema, "fingerprint", None)
        if isinstance(fp, (bytes, bytearray)) and batch.fingerprint != fp:
            raise StateError(
                f"batch fingerprint {batch.fingerprint.hex()[:12]} does not match the schema "
                f"fingerprint {bytes(fp).hex()[:12]} of query {self.name!r}"
            )
        if batch.n == 0:
            return self
        if x2 is not None:
            x2 = np.asarray(x2, dtype=np.float64)
            if x2.shape != batch.numeric.shape:
                raise StateError(f"x2 must have the shape of batch.numeric {batch.numeric.shape}, "
                                 f"got {x2.shape}")
        self._update(batch, x2)
        self._n += batch.n
        return self

    def merge(self, other: State) -> State:
        """Fold another state of the same query and schema into this one (in place).

        Returns
        -------
        self

        Raises
        ------
        StateError
            If ``other`` is of another class, query or schema.
        """
        self._check_compatible(other)
        self._merge(other)
        self._n += other._n
        return self

    def __iadd__(self, other: State) -> State:
        return self.merge(other)

    def __add__(self, other: State) -> State:
        if not isinstance(other, State):
            return NotImplemented
        return self.copy().merge(other)

    def copy(self) -> State:
        """An independent deep copy (via the serialized form)."""
        return state_from_bytes(self.to_bytes(), self.query, self.schema, expected=type(self),
                                loss=self._resolved_loss())

    def empty_copy(self) -> State:
        """A new empty state of the same class, query and schema (a window's next pane).

        By default the class is built again; a class whose construction is costly and whose
        empty form is plain data overrides this with a copy of its empty parts.
        """
        from aggregator.state.registry import construct

        return construct(type(self), self.query, self.schema, self._resolved_loss())

    def _shallow(self) -> State:
        """A new instance sharing this one's attributes (for :meth:`empty_copy` overrides, which
        then replace the mutable ones)."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out._n = 0
        return out

    @abstractmethod
    def estimate(self) -> Estimate:
        """Current estimate.

        Raises
        ------
        EmptyStateError
            If too few reports have been seen (``n == 0``, or fewer than the parameters need).
        """

    def to_bytes(self) -> bytes:
        """Serialize to plain data: ``FORMAT_MAGIC`` + a UTF-8 JSON document (arrays base64).

        The document records the class, query name, a digest of the query spec and the schema
        fingerprint, which :meth:`from_bytes` checks (layout: :mod:`aggregator.state.serialize`).
        """
        return state_to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, query, schema, *, loss=None) -> State:
        """Restore a state written by :meth:`to_bytes`.

        Parameters
        ----------
        data : bytes
        query : Query
            Must be the same spec the state was built with.
        schema : TelemetrySchema
            Must have the same fingerprint.
        loss : loss object, optional
            A custom query's resolved loss (see :func:`aggregator.state.build_state`); with it,
            restoring imports no user code.

        Returns
        -------
        State
            Of the class recorded in ``data`` (``State.from_bytes`` dispatches via the registry).

        Raises
        ------
        StateError
            Bad magic, malformed JSON, another class/query/schema.
        """
        return state_from_bytes(data, query, schema, expected=None if cls is State else cls, loss=loss)

    def __reduce__(self):
        return (_restore, (type(self), self.to_bytes(), self.query, self.schema))

    def __repr__(self) -> str:
        try:
            return f"{type(self).__name__}(query={self.query.name!r}, kind={self.query.kind}, n={self._n})"
        except Exception:
            return f"<{type(self).__name__} (unprintable)>"

    # -------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _update(self, batch, x2: np.ndarray | None) -> None: ...

    @abstractmethod
    def _merge(self, other: State) -> None: ...

    @abstractmethod
    def _get_data(self) -> dict: ...

    @abstractmethod
    def _set_data(self, data: dict) -> None: ...

    # -------------------------------------------------------------- helpers
    def _check_compatible(self, other: State) -> None:
        if type(other) is not type(self):
            raise StateError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        if query_digest(other.query) != query_digest(self.query):
            raise StateError(f"cannot merge states of different queries ({other.query.name!r} into "
                             f"{self.query.name!r})")
        if schema_fingerprint(other.schema) != schema_fingerprint(self.schema):
            raise StateError("cannot merge states of different schemas")

    def _resolved_loss(self):
        """The user loss object this state was built with (custom queries), else None."""
        return None

    def _require_x2(self, x2) -> np.ndarray:
        if x2 is None:
            raise StateError(
                f"query {self.name!r} needs x2 (the doubled numeric block zil.double(batch.numeric, rng))"
            )
        return x2

    def _require_n(self, minimum: int = 1) -> None:
        if self._n < minimum:
            raise EmptyStateError(
                f"query {self.name!r} has {self._n} report(s); an estimate needs at least {minimum}"
            )
