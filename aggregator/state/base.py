"""State base API shared by every estimator family (DESIGN §5).

A *state* is the mergeable, serializable summary a worker keeps per (query, partition):

* ``update(batch, x2)`` folds in a :class:`ingest.batch.ReportBatch`; ``x2`` is the consumer-side
  doubled numeric block ``X̃₂ = X̃₁ + sqrt(δλ²)·range·sqrt(W)·G`` (``zil.double``'s distribution)
  drawn from :func:`doubling_draws` of the record bytes and passed to every state;
* ``merge(other)`` / ``+`` / ``+=`` combine partitions (exact for sufficient statistics);
* ``estimate()`` returns an :class:`Estimate` in original units;
* ``to_bytes()`` / ``from_bytes(data, query, schema)`` use plain data — a JSON document with
  base64-encoded little-endian arrays, never pickle;
* ``n`` is the number of reports folded in; ``repr`` never raises.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import xxhash
from scipy import stats

from aggregator.errors import EmptyStateError, StateError
from aggregator.queries import Query, parse_query

__all__ = [
    "FORMAT_MAGIC",
    "EmptyStateError",
    "Estimate",
    "State",
    "decode_arrays",
    "double_records",
    "doubling_draws",
    "doubling_seed",
    "encode_arrays",
    "normal_critical",
]

log = logging.getLogger(__name__)

FORMAT_MAGIC = b"LDPS1\n"
"""Leading bytes of every serialized state (format version 1)."""


def doubling_seed(record_bytes) -> int:
    """The seed of a record's doubling draws: XXH3-64 (seed 0) of all its bytes.

    Parameters
    ----------
    record_bytes : bytes-like
        The raw Kafka record value (any length).

    Returns
    -------
    int in [0, 2⁶⁴)

    Raises
    ------
    TypeError
        If ``record_bytes`` is not bytes-like.
    """
    return xxhash.xxh3_64_intdigest(record_bytes)


def doubling_draws(records, counts, dim: int) -> np.ndarray:
    """Standard symmetric-Laplace draws ``sqrt(W)·G`` (``SL_dim(I)``) for the reports of records,
    deterministic per record.

    The worker doubles every report as ``X̃₂ = X̃₁ + sqrt(δλ²)·range·sqrt(W)·G`` (DESIGN §2, the
    arithmetic of ``mechanisms.zil.sample_sl``) with these draws: record ``r``'s rows come from
    SplitMix64 seeded with :func:`doubling_seed` of its bytes (layout in
    ``aggregator.state._kernels.sl_draws``), so they depend only on the record — not on how
    records are batched — and a replay after a crash reproduces ``X̃₂``, and hence every state,
    bit for bit. ``X̃₂`` is post-processing of the public report: a public seed costs no privacy.

    Parameters
    ----------
    records : sequence of bytes-like, length R
        Record values.
    counts : sequence of int, length R
        Reports in each record.
    dim : int
        Numeric dimension ``d``.

    Returns
    -------
    ndarray of float64, shape (Σ counts, dim)
        Rows of record 0, then record 1, … . ``W ~ Exp(1)`` is shared by a row's coordinates and
        ``G ~ N(0, I)``, so each row has mean 0 and covariance ``I``.

    Raises
    ------
    TypeError
        If a record is not bytes-like.
    """
    from aggregator.state._kernels import sl_draws

    seeds, n = _seeds_counts(records, counts)
    out = np.empty((int(n.sum()), int(dim)))
    sl_draws(seeds, n, out)
    return out


def double_records(records, counts, x1: np.ndarray, sd: float) -> np.ndarray:
    """The worker's doubled block ``X̃₂ = X̃₁ + sd·sqrt(W)·G`` of records' reports, in one pass.

    Bit for bit ``g = doubling_draws(records, counts, d); g *= sd; g += x1`` — the same draws
    (deterministic per record, see :func:`doubling_draws`) with the scaling and the sum done in
    the compiled loop that draws them (``aggregator.state._kernels.sl_double``), not in two more
    passes over the arrays. The worker calls it with ``sd = sqrt(zero_prob · noise_variance)``
    (``δλ²·range²`` per coordinate, DESIGN §2).

    Parameters
    ----------
    records : sequence of bytes-like, length R
        Record values.
    counts : sequence of int, length R
        Reports in each record (Σ counts = n).
    x1 : ndarray of float64, shape (n, d)
        The reports' numeric block ``X̃₁``, rows in record order.
    sd : float or ndarray of float64, shape (d,)
        Scale of the added noise per coordinate (a scalar applies to every coordinate).

    Returns
    -------
    ndarray of float64, shape (n, d)

    Raises
    ------
    ValueError
        If ``x1`` does not have Σ counts rows, or ``sd`` is neither a scalar nor of shape (d,).
    TypeError
        If a record is not bytes-like.
    """
    from aggregator.state._kernels import sl_double

    seeds, n = _seeds_counts(records, counts)
    x1 = np.ascontiguousarray(x1, dtype=np.float64)
    if x1.ndim != 2 or x1.shape[0] != int(n.sum()):
        raise ValueError(f"x1 must have shape (sum(counts), d) = ({int(n.sum())}, d), got {x1.shape}")
    try:
        sd = np.ascontiguousarray(np.broadcast_to(np.asarray(sd, dtype=np.float64), (x1.shape[1],)))
    except ValueError:
        raise ValueError(f"sd must be a scalar or of shape ({x1.shape[1]},), "
                         f"got shape {np.shape(sd)}") from None
    out = np.empty_like(x1)
    sl_double(seeds, n, x1, sd, out)
    return out


def _seeds_counts(records, counts) -> tuple[np.ndarray, np.ndarray]:
    """Per-record seeds (uint64, :func:`doubling_seed`) and report counts (int64) of records."""
    seeds = np.fromiter(map(doubling_seed, records), dtype=np.uint64, count=len(records))
    return seeds, np.asarray(counts, dtype=np.int64).reshape(-1)


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
        ``"sdr"``, ``"dr"``, ``"sl"``, ``"naive"`` or a frequency method.

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(str(p) for p in self.params))
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
        """JSON-ready dict; non-finite numbers (an infinite stderr/CI) become ``None``."""
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
        }

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


# ---------------------------------------------------------------------- array <-> JSON
def encode_arrays(obj: Any) -> Any:
    """Recursively replace numpy arrays by ``{"__nd__": dtype, "shape": …, "b64": …}`` (little-endian)."""
    if isinstance(obj, np.ndarray):
        dt = obj.dtype.newbyteorder("<") if obj.dtype.byteorder not in ("|", "=", "<") else obj.dtype
        a = np.ascontiguousarray(obj, dtype=dt.newbyteorder("<") if dt.kind in "fiub" else dt)
        if a.dtype.kind not in "fiub":
            raise StateError(f"cannot serialize an array of dtype {a.dtype}")
        return {"__nd__": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}
    if isinstance(obj, dict):
        return {str(k): encode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_arrays(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": repr(obj)}
    return obj


def decode_arrays(obj: Any) -> Any:
    """Inverse of :func:`encode_arrays`.

    Raises
    ------
    StateError
        On a malformed array entry.
    """
    if isinstance(obj, dict):
        if "__nd__" in obj:
            try:
                dt = np.dtype(obj["__nd__"])
                if dt.kind not in "fiub":
                    raise ValueError(f"dtype {dt} not allowed")
                raw = base64.b64decode(obj["b64"], validate=True)
                shape = tuple(int(s) for s in obj["shape"])
                a = np.frombuffer(raw, dtype=dt).reshape(shape)
            except (KeyError, TypeError, ValueError) as exc:
                raise StateError(f"malformed array in serialized state: {exc}") from None
            return a.astype(dt.newbyteorder("="), copy=True)
        if "__float__" in obj and len(obj) == 1:
            return float(obj["__float__"])
        return {k: decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_arrays(v) for v in obj]
    return obj


def _query_digest(query: Query) -> str:
    doc = json.dumps(query.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _schema_fingerprint(schema) -> str:
    fp = getattr(schema, "fingerprint", b"")
    if callable(fp):
        fp = fp()
    return fp.hex() if isinstance(fp, (bytes, bytearray)) else str(fp)


class State(ABC):
    """Base class of every mergeable state.

    Subclasses set ``kinds`` (the query kinds they serve), implement ``_update``, ``_merge``,
    ``estimate``, ``_get_data`` and ``_set_data``, and call ``super().__init__``.

    Parameters
    ----------
    query : Query or mapping
    schema : ingest.schema.TelemetrySchema

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
        batch : ingest.batch.ReportBatch
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
        return type(self).from_bytes(self.to_bytes(), self.query, self.schema)

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
        fingerprint, which :meth:`from_bytes` checks.
        """
        doc = {
            "class": type(self).__name__,
            "query": self.query.name,
            "query_digest": _query_digest(self.query),
            "schema": _schema_fingerprint(self.schema),
            "n": self._n,
            "data": encode_arrays(self._get_data()),
        }
        return FORMAT_MAGIC + json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes, query, schema) -> State:
        """Restore a state written by :meth:`to_bytes`.

        Parameters
        ----------
        data : bytes
        query : Query
            Must be the same spec the state was built with.
        schema : TelemetrySchema
            Must have the same fingerprint.

        Returns
        -------
        State
            Of the class recorded in ``data`` (``State.from_bytes`` dispatches via the registry).

        Raises
        ------
        StateError
            Bad magic, malformed JSON, another class/query/schema.
        """
        from aggregator.state.registry import STATE_CLASSES

        raw = bytes(data)
        if not raw.startswith(FORMAT_MAGIC):
            raise StateError("serialized state does not start with the LDPS1 magic")
        try:
            doc = json.loads(raw[len(FORMAT_MAGIC):].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateError(f"serialized state is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or "class" not in doc or "data" not in doc:
            raise StateError("serialized state lacks 'class' or 'data'")
        klass = next((c for c in STATE_CLASSES.values() if c.__name__ == doc["class"]), None)
        if klass is None:
            raise StateError(f"unknown state class {doc['class']!r}")
        if cls is not State and not issubclass(klass, cls):
            raise StateError(f"serialized state is a {doc['class']}, not a {cls.__name__}")
        q = parse_query(query)
        if doc.get("query") != q.name or doc.get("query_digest") != _query_digest(q):
            raise StateError(
                f"serialized state belongs to query {doc.get('query')!r} with another spec; "
                f"cannot restore it as {q.name!r}"
            )
        if doc.get("schema") != _schema_fingerprint(schema):
            raise StateError("serialized state was written for another schema (fingerprint differs)")
        state = klass(q, schema)
        try:
            state._set_data(decode_arrays(doc["data"]))
            state._n = int(doc["n"])
        except StateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StateError(f"serialized {doc['class']} is malformed: {exc!r}") from None
        return state

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
        if _query_digest(other.query) != _query_digest(self.query):
            raise StateError(f"cannot merge states of different queries ({other.query.name!r} into "
                             f"{self.query.name!r})")
        if _schema_fingerprint(other.schema) != _schema_fingerprint(self.schema):
            raise StateError("cannot merge states of different schemas")

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


def _restore(klass, data, query, schema):
    return klass.from_bytes(data, query, schema)
