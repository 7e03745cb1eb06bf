"""Query specifications: what a pipeline estimates (docs/configuration.md, "Queries").

A query is a frozen pydantic model, discriminated on ``kind``; :data:`Query` is the union and
:func:`parse_query` builds one from a plain mapping (a ``[[queries]]`` TOML table). Every query has
a unique ``name`` (the key of its state in checkpoints, the HTTP API and the ``query`` label of the
Prometheus gauges) and a confidence ``level`` for its intervals. Field names refer to the
pipeline's :class:`ingest.client.schema.TelemetrySchema`; they are checked against it by
:meth:`aggregator.config.PipelineConfig.load` (and by :func:`aggregator.state.build_state`).

Kinds and their estimators (docs/mechanisms.md §3–§6, docs/frequency.md §4):

==========================  ========================================  ==================
kind                        fields                                    estimator
==========================  ========================================  ==================
``frequency``               ``field`` (categorical, uRR/uRAP)         ``method``: empirical | threshold
                                                                      | projected | em
``mean``                    ``field`` (numeric)                       sdr (default) | dr | sl | naive
``variance``                ``field`` (numeric)                       sdr (default) | dr | sl | naive
``quantiles``               ``field``, ``q``                          dr
``linear_regression``       ``response``, ``covariates``              sdr (closed form)
``logistic_regression``     ``covariates``, ``label`` [+ threshold]   dr (default) | sdr
``quantile_regression``     ``response``, ``covariates``, ``tau``     dr
``custom``                  ``loss`` = "module:callable", ``fields``  dr (default) | sdr | sl | naive
``kmeans``                  ``fields`` (numeric), ``k``               dr (default) | naive
``gaussian_mixture``        ``fields`` (numeric), ``k``               deconvolution (default) | dr
                                                                      | naive
==========================  ========================================  ==================
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from aggregator.errors import ConfigError
from ingest.model import StrictModel

__all__ = [
    "SGD_REMOVED",
    "CustomQuery",
    "FrequencyQuery",
    "GaussianMixtureQuery",
    "KMeansQuery",
    "LinearRegressionQuery",
    "LogisticRegressionQuery",
    "MeanQuery",
    "QuantileRegressionQuery",
    "QuantilesQuery",
    "Query",
    "RenewableOptions",
    "VarianceQuery",
    "WindowSpec",
    "finite_float",
    "format_validation_error",
    "parse_query",
    "query_fields",
]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
#: ``_NAME_RE`` in words, for the messages of query and parameter names.
_NAME_RULE = ("start with a letter or '_' and contain only letters, digits, '_', '.', '-' "
              "(at most 128 characters)")


def finite_float(low: float, high: float, *, low_open: bool = True, high_open: bool = False) -> Any:
    """A ``float`` field type that must be a finite number in an interval (``(low, high]`` by
    default), with one message for both faults.

    Pydantic's ``gt``/``le`` constraints refuse ``nan`` and ``inf`` with "Input should be less than
    or equal to …", which does not say what is wrong; this type says
    ``must be a finite number in (0, 86400], got nan`` (the config key is prepended by
    :func:`format_validation_error`).

    Parameters
    ----------
    low, high : float
        The interval's ends.
    low_open, high_open : bool
        Whether ``low`` / ``high`` are excluded (default ``(low, high]``).

    Returns
    -------
    typing.Annotated
        ``Annotated[float, AfterValidator(check)]``, for a field annotation.
    """
    text = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(v: float) -> float:
        inside = (low < v if low_open else low <= v) and (v < high if high_open else v <= high)
        if not (math.isfinite(v) and inside):
            raise ValueError(f"must be a finite number in {text}, got {v}")
        return v

    return Annotated[float, AfterValidator(check)]


class RenewableOptions(StrictModel):
    """Blocks of the renewable estimator of general-loss queries (docs/mechanisms.md §6.5).

    Attributes
    ----------
    warm_up : int
        Reports of a partition fitted in batch before the renewal starts (100 … 10⁶; default
        20000). Until then the reports wait in the state (16 bytes per report and field of the
        query, in memory and in each checkpoint) and the estimate is their batch fit, pooled
        over partitions. The renewal carries the warm-up fit's curvature forward, so the warm-up
        must determine the coefficients well: with the demo's privacy parameters a median
        regression warmed up on 5000–10000 reports per partition stayed several standard errors
        off for the rest of the stream (docs/mechanisms.md §6.8).
    batch_size : int
        Reports per renewal block (10 … 10⁶; default 1000). Blocks are cut by report count in
        offset order; fewer wait in the state (and enter the estimate).

    Raises
    ------
    pydantic.ValidationError
        If a value is outside its range (wrapped into ``ConfigError`` by :func:`parse_query`).
    """

    warm_up: int = Field(default=20_000, ge=100, le=1_000_000)
    batch_size: int = Field(default=1000, ge=10, le=1_000_000)


#: The message for a query that still has the removed averaged-SGD table.
SGD_REMOVED = ("the averaged-SGD options are gone: general losses are fitted by renewable estimation "
               "without step sizes; remove the `sgd` table (its replacement is the optional "
               "`renewable = { warm_up = 20000, batch_size = 1000 }`)")


class _RenewableQuery(StrictModel):
    """Mixin of the general-loss queries: the ``renewable`` options, and one clear line for a
    config that still has the ``sgd`` table."""

    renewable: RenewableOptions = RenewableOptions()

    @model_validator(mode="before")
    @classmethod
    def _no_sgd(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sgd" in data:
            raise ValueError(SGD_REMOVED)
        return data


#: Largest number of panes a window's retention may span (state-topic records per partition).
MAX_RETAINED_PANES = 100_000
#: Retention in hops when ``window.retention`` is not given.
DEFAULT_RETAINED_HOPS = 1000


class WindowSpec(StrictModel):
    """Event-time windows of a query (docs/windows.md §2): tumbling (``hop`` omitted) or hopping,
    aligned to the Unix epoch in UTC.

    Attributes
    ----------
    size : str
        Window length, a duration (``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"7d"``).
    hop : str or None
        Step between window starts; ``size`` must be a multiple of it. ``None``: ``size``
        (tumbling). State is kept per *pane* of length ``hop``; a window merges ``size/hop`` panes.
    grace : str
        How far behind the latest event time a partition still accepts reports (default
        ``"0s"``): a partition's watermark is its max event time − grace, and a pane whose end
        is ≤ the watermark is closed; later reports for it are *late* (counted, not folded).
    retention : str or None
        Closed panes whose end is more than this before the watermark are deleted (tombstoned)
        from the state topic. ``None``: 1000 hops. At least ``size`` and at most 100000 hops.

    Raises
    ------
    pydantic.ValidationError
        On a malformed duration, ``size`` not a multiple of ``hop``, or a retention out of range
        (wrapped into ``ConfigError`` by :func:`parse_query`).
    """

    size: str
    hop: str | None = None
    grace: str = "0s"
    retention: str | None = None

    @field_validator("size", "hop", "grace", "retention")
    @classmethod
    def _check_duration(cls, v: str | None, info) -> str | None:
        from ingest.client.event_time import parse_duration

        if v is not None:
            parse_duration(v, "", allow_zero=info.field_name == "grace")
        return v

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.size_s % self.hop_s:
            raise ValueError(f"size ({self.size}) must be a multiple of hop ({self.hop})")
        if self.retention is not None:
            if self.retention_s < self.size_s:
                raise ValueError(f"retention ({self.retention}) must be at least size ({self.size})")
            if self.retention_s > MAX_RETAINED_PANES * self.hop_s:
                raise ValueError(f"retention ({self.retention}) must be at most {MAX_RETAINED_PANES} "
                                 f"hops of {self.hop or self.size}")
        return self

    @property
    def size_s(self) -> int:
        """Window length, seconds."""
        from ingest.client.event_time import parse_duration

        return parse_duration(self.size)

    @property
    def hop_s(self) -> int:
        """Pane length = step between window starts, seconds."""
        from ingest.client.event_time import parse_duration

        return parse_duration(self.hop) if self.hop is not None else self.size_s

    @property
    def grace_s(self) -> int:
        """Grace period, seconds."""
        from ingest.client.event_time import parse_duration

        return parse_duration(self.grace, allow_zero=True)

    @property
    def retention_s(self) -> int:
        """Retention of closed panes, seconds (default: 1000 hops, at least ``size``)."""
        from ingest.client.event_time import parse_duration

        if self.retention is None:
            return max(self.size_s, DEFAULT_RETAINED_HOPS * self.hop_s)
        return parse_duration(self.retention)


class _QueryBase(StrictModel):
    name: str
    level: float = 0.95
    window: WindowSpec | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"name must {_NAME_RULE}, got {v!r}")
        return v

    @field_validator("level")
    @classmethod
    def _check_level(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.5 <= v < 1.0):
            raise ValueError(f"level must be in [0.5, 1), got {v}")
        return v


class FrequencyQuery(_QueryBase):
    """Distribution of a categorical field (uRR or uRAP; docs/frequency.md §2–§4).

    Attributes
    ----------
    field : str
        A categorical field of the schema.
    method : {"empirical", "threshold", "projected", "em"}
        Frequency estimation method of ``mechanisms.uldp``.
    """

    kind: Literal["frequency"] = "frequency"
    field: str
    method: Literal["empirical", "threshold", "projected", "em"] = "empirical"

    @property
    def estimator(self) -> str:
        """The estimation method (alias of ``method``)."""
        return self.method


class MeanQuery(_QueryBase):
    """Mean of a numeric field (docs/mechanisms.md §3.1, §6.1): SDR = mean X̃₁ (default),
    DR = [mean X̃₁ − (1−δ) mean X̃₂]/δ, SL = mean X̃₂, naive = mean X̃₁."""

    kind: Literal["mean"] = "mean"
    field: str
    estimator: Literal["sdr", "dr", "sl", "naive"] = "sdr"


class VarianceQuery(_QueryBase):
    """Variance of a numeric field; SDR: mean X̃₁² − (1−δ)σ² − (mean X̃₁)² (docs/mechanisms.md §3.3, §6.1)."""

    kind: Literal["variance"] = "variance"
    field: str
    estimator: Literal["sdr", "dr", "sl", "naive"] = "sdr"


class QuantilesQuery(_QueryBase):
    """Quantiles of a numeric field from the DR CDF F̂ = [F̂₁ − (1−δ)F̂₂]/δ (docs/mechanisms.md §6.2).

    Attributes
    ----------
    q : tuple of float
        Probabilities in (0, 1), at least one, distinct.
    bins : int
        Number of histogram bins over the field's [low, high] (16 … 100000); the quantiles are
        exact to within one bin width ``(high − low)/bins`` of the unbinned DR quantile.
    """

    kind: Literal["quantiles"] = "quantiles"
    field: str
    q: tuple[float, ...] = Field(default=(0.5,), strict=False)
    estimator: Literal["dr"] = "dr"
    bins: int = Field(default=2000, ge=16, le=100_000)

    @field_validator("q")
    @classmethod
    def _check_q(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v:
            raise ValueError("q must list at least one probability")
        for p in v:
            if not (math.isfinite(p) and 0.0 < p < 1.0):
                raise ValueError(f"q must contain probabilities in (0, 1), got {p}")
        if len(set(v)) != len(v):
            raise ValueError(f"q must not repeat a probability, got {list(v)}")
        return v


class _RegressionBase(_QueryBase):
    """Covariates (at least one, distinct) and an intercept; a regression on no covariate is
    refused with what to use instead (``_without_covariates``)."""

    covariates: tuple[str, ...] = Field(strict=False)
    intercept: bool = True

    #: What to use instead of a regression on no covariate (the end of the refusal).
    _without_covariates: ClassVar[str] = ""

    @field_validator("covariates")
    @classmethod
    def _check_cov(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError(f"must name at least one numeric field, got []; {cls._without_covariates}")
        if len(set(v)) != len(v):
            raise ValueError(f"covariates must be distinct, got {list(v)}")
        return v


class LinearRegressionQuery(_RegressionBase):
    """Least squares ``response ~ covariates`` with noised covariates, SDR closed form:
    ``(X̃₁ᵀX̃₁/n − (1−δ) D) β = X̃₁ᵀy/n`` (docs/mechanisms.md §3.4, §6.3), sandwich standard errors."""

    kind: Literal["linear_regression"] = "linear_regression"
    response: str
    estimator: Literal["sdr"] = "sdr"

    _without_covariates: ClassVar[str] = "for the response's mean use kind = \"mean\""

    @model_validator(mode="after")
    def _check(self) -> LinearRegressionQuery:
        if self.response in self.covariates:
            raise ValueError(f"response {self.response!r} must not also be a covariate")
        return self


class LogisticRegressionQuery(_RenewableQuery, _RegressionBase):
    """Logistic regression of a binary label on numeric covariates, renewable DR M-estimation.

    Attributes
    ----------
    label : str
        A numeric field. With ``threshold`` the label is ``y = 1{label > threshold}`` — a
        non-smooth function of the noised report, so only ``estimator = "dr"`` is valid. Without
        ``threshold`` the field itself is the (0/1) label; the logistic loss is linear in it, so
        DR and SDR are both unbiased.
    threshold : float or None
        Threshold in the label field's original units.
    estimator : {"dr", "sdr"}
    renewable : RenewableOptions
    """

    kind: Literal["logistic_regression"] = "logistic_regression"
    label: str
    threshold: float | None = None
    estimator: Literal["dr", "sdr"] = "dr"

    _without_covariates: ClassVar[str] = "a logistic regression needs at least one covariate"

    @field_validator("threshold")
    @classmethod
    def _check_threshold(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
        return v

    @model_validator(mode="after")
    def _check(self) -> LogisticRegressionQuery:
        if self.label in self.covariates:
            raise ValueError(f"label {self.label!r} must not also be a covariate")
        if self.threshold is not None and self.estimator == "sdr":
            raise ValueError(
                "estimator 'sdr' needs a loss twice differentiable in the noised fields; "
                "a thresholded label 1{label > threshold} is not — use estimator = 'dr'"
            )
        return self


class QuantileRegressionQuery(_RenewableQuery, _RegressionBase):
    """Linear quantile regression (check loss ρ_τ, non-smooth → DR only), renewable M-estimation.

    Attributes
    ----------
    response : str
    tau : float
        Quantile level in (0, 1).
    """

    kind: Literal["quantile_regression"] = "quantile_regression"
    response: str
    tau: float = 0.5
    estimator: Literal["dr"] = "dr"

    _without_covariates: ClassVar[str] = "for the response's quantile use kind = \"quantiles\" with q = [tau]"

    @model_validator(mode="after")
    def _check(self) -> QuantileRegressionQuery:
        if not (math.isfinite(self.tau) and 0.0 < self.tau < 1.0):
            raise ValueError(f"tau must be in (0, 1), got {self.tau}")
        if self.response in self.covariates:
            raise ValueError(f"response {self.response!r} must not also be a covariate")
        return self


class _FieldsQuery(StrictModel):
    """Mixin of the queries over a list of numeric ``fields``: at least one, distinct."""

    fields: tuple[str, ...] = Field(strict=False)

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("fields must name at least one numeric field")
        if len(set(v)) != len(v):
            raise ValueError(f"fields must be distinct, got {list(v)}")
        return v


class CustomQuery(_FieldsQuery, _RenewableQuery, _QueryBase):
    """A user loss ``module:callable``, fitted by renewable M-estimation of its corrected loss.

    The callable is called with no argument (or is a loss object itself) and must give a loss
    object of :mod:`mechanisms.losses` whose data columns are ``fields`` in order, in original
    units, every one of them among its ``noised`` columns (checked against the schema by
    :func:`aggregator.config.check_loss_fields`). ``params`` names the coefficients (defaults to
    ``theta0, theta1, …``); ``init`` is the starting point (finite; defaults to zeros).
    """

    kind: Literal["custom"] = "custom"
    loss: str
    estimator: Literal["dr", "sdr", "sl", "naive"] = "dr"
    params: tuple[str, ...] | None = Field(default=None, strict=False)
    init: tuple[float, ...] | None = Field(default=None, strict=False)

    @field_validator("loss")
    @classmethod
    def _check_loss(cls, v: str) -> str:
        mod, sep, attr = v.partition(":")
        if not sep or not mod or not attr:
            raise ValueError(f"loss must look like 'package.module:callable', got {v!r}")
        return v

    @field_validator("params")
    @classmethod
    def _check_params(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # the `param` label of the metrics and the names in the JSON: distinct, plain names
        # (a repeated name made one coefficient vanish from /metrics)
        if v is None:
            return v
        bad = [p for p in v if not _NAME_RE.match(p)]
        if bad:
            raise ValueError(f"names must {_NAME_RULE}, got {bad[0]!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"must be distinct names, got {list(v)}")
        return v

    @field_validator("init")
    @classmethod
    def _check_init(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and not all(math.isfinite(t) for t in v):
            raise ValueError(f"must be finite numbers, got {list(v)}")
        return v


class _MixtureQuery(_FieldsQuery, _RenewableQuery, _QueryBase):
    """Components of numeric fields (docs/mechanisms.md §7), renewable estimation of their loss.

    Attributes
    ----------
    fields : tuple of str
        Numeric fields, distinct, at least one. Distances are measured in box-standardized
        units (each field scaled by half its schema range).
    k : int
        Components, 1 … 50. Components are reported ascending by the first field's centre.
    """

    k: int = Field(ge=1, le=50)


class KMeansQuery(_MixtureQuery):
    """k-means centres ``"<j>.<field>"``, DR risk (docs/mechanisms.md §7.2)."""

    kind: Literal["kmeans"] = "kmeans"
    estimator: Literal["dr", "naive"] = "dr"


class GaussianMixtureQuery(_MixtureQuery):
    """Diagonal Gaussian mixture ``"<j>.weight"``, ``"<j>.mean.<field>"``, ``"<j>.var.<field>"``:
    the exact likelihood of the reports (``deconvolution``, default) or the DR corrected
    likelihood (``dr``; docs/mechanisms.md §7.3–§7.5)."""

    kind: Literal["gaussian_mixture"] = "gaussian_mixture"
    estimator: Literal["deconvolution", "dr", "naive"] = "deconvolution"


Query = Annotated[
    FrequencyQuery
    | MeanQuery
    | VarianceQuery
    | QuantilesQuery
    | LinearRegressionQuery
    | LogisticRegressionQuery
    | QuantileRegressionQuery
    | CustomQuery
    | KMeansQuery
    | GaussianMixtureQuery,
    Field(discriminator="kind"),
]
"""Any query spec (discriminated on ``kind``)."""

_ADAPTER: TypeAdapter = TypeAdapter(Query)


def parse_query(data: Any) -> Query:
    """Build a query from a mapping (or return a query unchanged).

    Parameters
    ----------
    data : mapping or query model
        E.g. ``{"kind": "mean", "name": "m", "field": "arr_delay"}``.

    Returns
    -------
    Query

    Raises
    ------
    ConfigError
        One line naming the offending key (``queries.<name>.<key>``) and the problem.
    """
    if isinstance(data, BaseModel):
        return data
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        name = data.get("name", "?") if isinstance(data, dict) else "?"
        raise ConfigError(format_validation_error(exc, prefix=f"queries.{name}")) from None


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One readable line from a pydantic error: ``<prefix>.<key>: <message>``.

    A value of the wrong TOML type (the models validate strictly) reads ``must be a number, got
    '0.9'`` (or an integer, true or false, a string, an array, a table) instead of pydantic's
    ``Input should be …``.

    Parameters
    ----------
    exc : pydantic.ValidationError
    prefix : str
        Key of the validated table (``queries.<name>``, ``kafka``); empty for the whole config.

    Returns
    -------
    str
        The first error; ``(and N more)`` if there are others.
    """
    err = exc.errors()[0]
    key = prefix
    for p in err.get("loc", ()):
        if isinstance(p, int):  # an array item: q[0]
            key += f"[{p}]"
        elif not _is_union_tag(p):
            key = f"{key}.{p}" if key else str(p)
    key = key or "config"
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    wanted = _TYPE_ERRORS.get(err.get("type", ""))
    if wanted is not None:
        msg = f"must be {wanted}, got {_shown(err.get('input'))}"
    bound = _BOUND_ERRORS.get(err.get("type", ""))
    if bound is not None:  # "Input should be greater than or equal to 0" → "must be >= 0, got -1"
        op, ctx_key = bound
        limit = (err.get("ctx") or {}).get(ctx_key)
        if limit is not None:
            msg = f"must be {op} {limit}, got {_shown(err.get('input'))}"
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{key}: {msg}{extra}"


#: pydantic error types of a value out of a numeric bound → (operator, key of the bound in ``ctx``).
_BOUND_ERRORS = {
    "greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"), "less_than_equal": ("<=", "le"),
}

#: pydantic error types of a value of the wrong type → what the key takes.
_TYPE_ERRORS = {
    "float_type": "a number", "float_parsing": "a number",
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string",
    "tuple_type": "an array", "list_type": "an array",
    "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table",
    "path_type": "a path (a string)",
}


def _shown(value: Any) -> str:
    """A TOML value as the user wrote it: ``true``/``false`` for booleans, ``repr`` otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _is_union_tag(p: Any) -> bool:
    return isinstance(p, str) and p in {
        "frequency", "mean", "variance", "quantiles", "linear_regression",
        "logistic_regression", "quantile_regression", "custom", "kmeans", "gaussian_mixture",
    }


def query_fields(query: Query) -> tuple[str, ...]:
    """All schema field names a query reads, in the order its state uses them.

    Regression queries list covariates first, then the response/label.
    """
    if isinstance(query, (FrequencyQuery, MeanQuery, VarianceQuery, QuantilesQuery)):
        return (query.field,)
    if isinstance(query, (LinearRegressionQuery, QuantileRegressionQuery)):
        return (*query.covariates, query.response)
    if isinstance(query, LogisticRegressionQuery):
        return (*query.covariates, query.label)
    if isinstance(query, (CustomQuery, _MixtureQuery)):
        return query.fields
    raise ConfigError(f"unknown query type {type(query).__name__}")
