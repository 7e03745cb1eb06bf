"""Pipeline configuration: one TOML file per pipeline (docs/configuration.md).

Example (see ``examples/flights.pipeline.toml``)::

    [pipeline]
    name = "flights"
    schema = "flights.schema.toml"        # relative to this file

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"

    [topics]
    reports = "ldp.flights.reports"
    state = "ldp.flights.state"
    dead_letter = "ldp.flights.dead-letter"
    partitions = 4

    [worker]
    group_id = "ldp-flights"
    checkpoint_interval_s = 10.0
    checkpoint_reports = 100000
    metrics_port = 9400
    max_record_bytes = 8388608

    [serve]
    host = "127.0.0.1"
    port = 8080
    refresh_interval_s = 5.0

    [[queries]]
    kind = "mean"
    name = "arr_delay_mean"
    field = "arr_delay"

:meth:`PipelineConfig.load` parses the file, loads the telemetry schema and checks every query
against it; any problem raises :class:`aggregator.errors.ConfigError` with one line naming the key.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, get_origin

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from aggregator.collector.config import DEFAULT_MAX_BODY_BYTES, CollectorSection
from aggregator.custom_loss import load_custom_loss
from aggregator.errors import ConfigError
from aggregator.queries import (
    CustomQuery,
    FrequencyQuery,
    LogisticRegressionQuery,
    Query,
    finite_float,
    format_validation_error,
    parse_query,
    query_fields,
)
from ingest.files import read_toml_file
from ingest.kafka.allocator import MMAP_THRESHOLD_MAX, TRIM_THRESHOLD_MAX
from ingest.kafka.settings import KafkaSettings
from ingest.model import StrictModel as _Frozen  # strict, as the queries

#: ``[worker] malloc_trim_threshold_mib`` bounds: what ``ingest.kafka.allocator.keep_freed_memory`` accepts.
_TRIM_MIB = (MMAP_THRESHOLD_MAX >> 20, TRIM_THRESHOLD_MAX >> 20)

__all__ = [
    "CollectorSection",
    "PipelineConfig",
    "PipelineSection",
    "ServeSection",
    "TopicsSection",
    "WorkerSection",
    "kafka_settings",
    "load_custom_loss",
    "validate_queries",
]

log = logging.getLogger(__name__)

#: ``[kafka] bootstrap_servers`` when the section does not give one (loopback only).
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


#: ``checkpoint_interval_s``, ``refresh_interval_s``: seconds in (0, 1 day].
_SECONDS = finite_float(0.0, 86_400)
#: ``stale_after_s``: seconds in (0, 1 week].
_STALE_SECONDS = finite_float(0.0, 86_400 * 7)
#: ``max_event_time_skew_s``: seconds in [0, 1 year].
_SKEW_SECONDS = finite_float(0.0, 86_400 * 366, low_open=False)
#: ``window_idle_timeout_s``: seconds in (0, 1 year].
_IDLE_SECONDS = finite_float(0.0, 86_400 * 366)


class PipelineSection(_Frozen):
    """``[pipeline]``: ``name`` (no ``/``: it prefixes the state-topic keys
    ``<name>/<partition>``) and ``schema`` (path of the telemetry schema TOML, resolved relative to
    the config file by :meth:`PipelineConfig.load`)."""

    name: str = Field(min_length=1, max_length=128)
    schema_path: Path = Field(alias="schema", strict=False)

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if "/" in v:  # aggregator.checkpoint.checkpoint_key and the worker refuse it too
            raise ValueError(f"must not contain '/' (checkpoints are keyed '<name>/<partition>' in "
                             f"the state topic), got {v!r}")
        return v


class TopicsSection(_Frozen):
    """``[topics]``: topic names and the partition count of the reports topic (1 … 10000)."""

    reports: str = Field(default="ldp.reports", min_length=1, max_length=249)
    state: str = Field(default="ldp.state", min_length=1, max_length=249)
    dead_letter: str = Field(default="ldp.dead-letter", min_length=1, max_length=249)
    partitions: int = Field(default=1, ge=1, le=10_000)

    @field_validator("reports", "state", "dead_letter")
    @classmethod
    def _check_name(cls, v: str) -> str:
        from ingest.kafka.topics import check_topic_name

        return check_topic_name(v, "a topic name")

    @model_validator(mode="after")
    def _check_distinct(self) -> TopicsSection:
        if len({self.reports, self.state, self.dead_letter}) != 3:
            raise ValueError(f"reports, state and dead_letter must be three different topics, got "
                             f"{self.reports!r}, {self.state!r}, {self.dead_letter!r}")
        return self


class WorkerSection(_Frozen):
    """``[worker]``: consumer group, checkpoint cadence (seconds and/or reports; a checkpoint is
    taken when either is reached), metrics port (0 = no metrics server), the largest record
    accepted, in bytes (1 KiB … 1 GiB), ``malloc_trim_threshold_mib``: free memory glibc keeps
    for reuse per heap, MiB (0 = glibc's defaults, else 32 … 2047; see
    :func:`ingest.kafka.allocator.keep_freed_memory`), and ``max_event_time_skew_s``: with windowed
    queries, a record holding an event time more than this many seconds (0 … 1 year, default
    3600) ahead of its Kafka timestamp is dead-lettered (``event_time_skew``, docs/windows.md §3)."""

    group_id: str = Field(default="ldp-stream", min_length=1)
    checkpoint_interval_s: _SECONDS = 10.0
    checkpoint_reports: int = Field(default=100_000, ge=1)
    metrics_port: int = Field(default=0, ge=0, le=65_535)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=1 << 30)
    malloc_trim_threshold_mib: int = Field(default=128, ge=0, le=_TRIM_MIB[1])
    max_event_time_skew_s: _SKEW_SECONDS = 3600.0

    @field_validator("malloc_trim_threshold_mib")
    @classmethod
    def _trim_range(cls, v: int) -> int:
        if 0 < v < _TRIM_MIB[0]:
            lo, hi = _TRIM_MIB
            raise ValueError(f"must be 0 (glibc defaults) or in [{lo}, {hi}] MiB, got {v}")
        return v


class ServeSection(_Frozen):
    """``[serve]``: HTTP listen address (loopback by default), port, how often merged
    estimates are refreshed from the state topic (seconds), and after how many seconds without
    an answer from the broker ``/readyz`` reports not ready (``stale_after_s`` >
    ``refresh_interval_s``), and ``window_idle_timeout_s``: a reports partition that is caught up
    and has had no new checkpoint for this many seconds stops holding windows open
    (docs/windows.md §4)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65_535)
    refresh_interval_s: _SECONDS = 5.0
    stale_after_s: _STALE_SECONDS = 60.0
    window_idle_timeout_s: _IDLE_SECONDS = 300.0

    @model_validator(mode="after")
    def _stale_after_refresh(self):
        if self.stale_after_s <= self.refresh_interval_s:
            raise ValueError(f"stale_after_s must be > refresh_interval_s ({self.refresh_interval_s}), "
                             f"got {self.stale_after_s}")
        return self


class PipelineConfig(_Frozen):
    """A whole pipeline: schema, Kafka client settings, topics, worker, serve, collector and queries.

    Attributes
    ----------
    pipeline : PipelineSection
    kafka : ingest.kafka.settings.KafkaSettings
        Client settings (``bootstrap_servers``, ``security_protocol``, ``sasl_*``, ``ssl_*``);
        ``bootstrap_servers`` defaults to :data:`DEFAULT_BOOTSTRAP` (127.0.0.1:9092).
    topics, worker, serve : sections
    collector : aggregator.collector.config.CollectorSection
        ``ldp-stream collect`` (docs/collector.md §4); its ``max_body_bytes`` is at most
        ``worker.max_record_bytes``.
    queries : tuple of Query
        Names are unique.
    source_path : Path or None
        The file the config was loaded from.
    losses : dict str → loss
        The loss object of each custom query (property), imported once when the config is
        loaded.

    Raises
    ------
    ConfigError
        From :meth:`load` / :meth:`from_dict` on any invalid key.
    """

    pipeline: PipelineSection
    kafka: KafkaSettings = Field(default_factory=lambda: KafkaSettings(bootstrap_servers=DEFAULT_BOOTSTRAP))
    topics: TopicsSection = TopicsSection()
    worker: WorkerSection = WorkerSection()
    serve: ServeSection = ServeSection()
    collector: CollectorSection = CollectorSection()
    queries: tuple[Query, ...] = ()
    source_path: Path | None = Field(default=None, strict=False)

    _schema: Any = PrivateAttr(default=None)
    _losses: dict | None = PrivateAttr(default=None)

    @field_validator("queries")
    @classmethod
    def _unique_names(cls, v: tuple[Query, ...]) -> tuple[Query, ...]:
        seen: set[str] = set()
        for q in v:
            if q.name in seen:
                raise ValueError(f"query name {q.name!r} is used twice")
            seen.add(q.name)
        return v

    @field_validator("collector")
    @classmethod
    def _body_fits_worker(cls, v: CollectorSection, info) -> CollectorSection:
        worker = info.data.get("worker")
        limit = worker.max_record_bytes if worker is not None else v.max_body_bytes
        if v.max_body_bytes <= limit:
            return v
        if "max_body_bytes" in v.model_fields_set:  # a body the workers would dead-letter
            raise ValueError(f"max_body_bytes ({v.max_body_bytes}) must be <= worker.max_record_bytes "
                             f"({limit}): the workers dead-letter larger records")
        return v.model_copy(update={"max_body_bytes": min(DEFAULT_MAX_BODY_BYTES, limit)})

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, *, validate: bool = True) -> PipelineConfig:
        """Read a pipeline TOML file, load its schema and validate the queries against it.

        Parameters
        ----------
        path : str or Path
            The ``*.pipeline.toml`` file. ``[pipeline] schema`` is resolved relative to it.
        validate : bool
            Load the schema and check the queries (default). ``False`` only parses.

        Returns
        -------
        PipelineConfig

        Raises
        ------
        ConfigError
            Unreadable file, TOML syntax, unknown/invalid key, missing schema, a query naming an
            unknown field or a field of the wrong type, an estimator that does not fit the loss,
            or a custom loss that cannot be imported. One line, naming the key.
        """
        if not str(path).strip():
            raise ConfigError("the pipeline config path is empty: give --config FILE")
        p = Path(path)
        data = read_toml_file(p, ConfigError, read_prefix=f"cannot read pipeline config {str(p)!r}",
                              toml_prefix=f"{str(p)!r}: invalid TOML: ")
        return cls.from_dict(data, base_dir=p.resolve().parent, source_path=p, validate=validate)

    @classmethod
    def from_dict(
        cls,
        data: dict,
        *,
        base_dir: str | Path | None = None,
        source_path: str | Path | None = None,
        validate: bool = True,
    ) -> PipelineConfig:
        """Build from a parsed mapping (the TOML document).

        Parameters
        ----------
        data : dict
        base_dir : path, optional
            Directory the schema path is relative to (default: current directory).
        source_path : path, optional
        validate : bool
            Load the schema and check the queries against it.

        Raises
        ------
        ConfigError
        """
        if not isinstance(data, dict):
            raise ConfigError(f"pipeline config must be a table, got {type(data).__name__}")
        data = dict(data)
        if "pipeline" not in data:
            raise ConfigError("pipeline: missing [pipeline] section (name, schema)")
        queries = data.pop("queries", [])
        if not isinstance(queries, list):
            raise ConfigError("queries: must be an array of tables ([[queries]])")
        parsed = []
        for i, q in enumerate(queries):
            if not isinstance(q, dict):
                raise ConfigError(f"queries[{i}]: must be a table")
            parsed.append(parse_query(q))
        kafka = kafka_settings(data.pop("kafka", {}))
        try:
            cfg = cls.model_validate({**data, "kafka": kafka, "queries": tuple(parsed),
                                      "source_path": source_path})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None
        if base_dir is not None and not cfg.pipeline.schema_path.is_absolute():
            section = cfg.pipeline.model_copy(
                update={"schema_path": Path(base_dir) / cfg.pipeline.schema_path})
            cfg = cfg.model_copy(update={"pipeline": section})
        if base_dir is not None:
            cfg = cfg.model_copy(update={"collector": cfg.collector.resolved(Path(base_dir))})
        if validate:
            cfg._schema = cfg.load_schema()
            cfg._losses = validate_queries(cfg.queries, cfg._schema)
        return cfg

    # ------------------------------------------------------------------ accessors
    @property
    def schema_path(self) -> Path:
        """Resolved path of the telemetry schema file."""
        return self.pipeline.schema_path

    @property
    def telemetry_schema(self):
        """The loaded :class:`ingest.client.schema.TelemetrySchema` (loaded on first access)."""
        if self._schema is None:
            self._schema = self.load_schema()
        return self._schema

    @property
    def losses(self) -> dict:
        """The loss object of each custom query by query name, imported once (when the config is
        loaded and validated, else on first access): building or restoring states never imports
        user code again.

        Raises
        ------
        ConfigError
            If a custom loss cannot be imported (``queries.<name>.loss: …``).
        """
        if self._losses is None:
            self._losses = {q.name: load_custom_loss(q.loss, key=f"queries.{q.name}.loss")
                            for q in self.queries if isinstance(q, CustomQuery)}
        return dict(self._losses)

    def load_schema(self):
        """Load ``[pipeline] schema``.

        Raises
        ------
        ConfigError
            If the file is missing or is not a valid schema (``pipeline.schema: …``).
        """
        from ingest.client.schema import TelemetrySchema

        path = self.pipeline.schema_path
        if not path.exists():
            raise ConfigError(f"pipeline.schema: file not found: {str(path)!r}")
        try:
            return TelemetrySchema.load(path)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"pipeline.schema: {str(path)!r}: {_one_line(exc)}") from None

    def require_queries(self, hint: str) -> None:
        """Refuse a pipeline without ``[[queries]]`` where something must be estimated.

        A pipeline without queries is valid (``ldp-stream analyze --loss`` replays its reports and
        ``produce`` only needs its topics and schema), but a worker or serve on it would run
        without estimating anything.

        Parameters
        ----------
        hint : str
            What the user can do instead (appended to the message).

        Raises
        ------
        ConfigError
            ``queries: the pipeline has none ...`` if ``queries`` is empty.
        """
        if not self.queries:
            where = f" in {str(self.source_path)!r}" if self.source_path is not None else ""
            raise ConfigError(f"queries: the pipeline has none{where} ([[queries]] tables; "
                              f"docs/configuration.md): {hint}")

    def query(self, name: str) -> Query:
        """The query called ``name``.

        Raises
        ------
        ConfigError
            If there is none.
        """
        for q in self.queries:
            if q.name == name:
                return q
        raise ConfigError(f"queries: no query named {name!r} (have {[q.name for q in self.queries]})")


def kafka_settings(raw: Any, *, base: KafkaSettings | None = None) -> KafkaSettings:
    """Build :class:`ingest.kafka.settings.KafkaSettings` from a ``[kafka]`` table (the pipeline config's,
    or ``ldp-stream produce --kafka-config FILE``'s), its scalar values checked strictly
    (:func:`check_kafka_types`).

    Parameters
    ----------
    raw : dict
        The table's keys and values as read from TOML.
    base : KafkaSettings or None
        Settings that ``raw``'s keys override; ``None``: ``bootstrap_servers`` defaults to
        :data:`DEFAULT_BOOTSTRAP`.

    Raises
    ------
    ConfigError
        ``kafka: must be a table`` or ``kafka.<key>: <problem>``.
    """
    if isinstance(raw, KafkaSettings) and base is None:  # already built (from_dict of a config's dump)
        return raw
    if not isinstance(raw, dict):
        raise ConfigError("kafka: must be a table")
    check_kafka_types(raw)
    merged = ({**base.model_dump(), **raw} if base is not None
              else {"bootstrap_servers": DEFAULT_BOOTSTRAP, **raw})
    try:
        return KafkaSettings(**merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix="kafka")) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"kafka: {_one_line(exc)}") from None


def check_kafka_types(raw: dict) -> None:
    """Validate the scalar keys of ``[kafka]`` strictly, as the other sections are.

    ``KafkaSettings`` (``ingest.kafka.settings``) validates in pydantic's lax mode, which turns
    ``request_timeout_ms = "30000"`` into 30000 and ``ssl_check_hostname = "no"`` into False. Its
    scalar fields (strings, integers, booleans, choices, secrets) are checked here without
    coercion; ``bootstrap_servers`` (a string or an array) and ``extra`` (any kafka-python option)
    keep their own rules, and unknown keys are left for ``KafkaSettings`` to name. Used for the
    pipeline config's ``[kafka]`` and for ``ldp-stream produce --kafka-config FILE``.

    Parameters
    ----------
    raw : dict
        The table's keys and values as read from TOML.

    Raises
    ------
    ConfigError
        ``kafka.<key>: must be …, got …``.
    """
    for key, value in raw.items():
        field = KafkaSettings.model_fields.get(key)
        if field is None or field.annotation is Any or get_origin(field.annotation) in (tuple, dict):
            continue
        try:
            TypeAdapter(field.annotation, config=ConfigDict(strict=True)).validate_python(value)
        except ValidationError as exc:
            if "Secret" in str(field.annotation):  # never echo a password, even a mistyped one
                raise ConfigError(f"kafka.{key}: must be a string (the value is not shown: a secret), "
                                  f"got a {type(value).__name__}") from None
            raise ConfigError(format_validation_error(exc, prefix=f"kafka.{key}")) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# ---------------------------------------------------------------------- validation
def _numeric_names(schema) -> tuple[str, ...]:
    return schema.numeric_names


def _categorical_names(schema) -> tuple[str, ...]:
    return schema.categorical_names


def _is_smooth(loss) -> bool:
    smooth = getattr(loss, "smooth", None)
    if smooth is not None:
        return bool(smooth)
    return hasattr(loss, "laplacian_x") and hasattr(loss, "grad_laplacian_x")


def validate_queries(queries, schema) -> None:
    """Check queries against a telemetry schema.

    Numeric queries (mean, variance, quantiles, regressions, custom) must name numeric fields,
    ``frequency`` a categorical field; a logistic regression's ``threshold`` must lie in
    ``[low, high)`` of its label's bounds (reports are clipped into ``[low, high]``, so outside it
    the label ``1{label > threshold}`` is constant); SL/SDR need a loss twice differentiable in
    the noised fields; custom losses must import and fit their fields
    (:func:`check_loss_fields`).

    Parameters
    ----------
    queries : iterable of Query
    schema : ingest.client.schema.TelemetrySchema

    Returns
    -------
    dict str → loss
        The imported loss object of each custom query, by query name.

    Raises
    ------
    ConfigError
        ``queries.<name>.<key>: <problem>``.
    """
    numeric = _numeric_names(schema)
    categorical = _categorical_names(schema)
    losses: dict = {}
    for q in queries:
        q = parse_query(q)
        prefix = f"queries.{q.name}"
        if isinstance(q, FrequencyQuery):
            if q.field not in categorical:
                where = "a numeric field" if q.field in numeric else "not a field of the schema"
                raise ConfigError(
                    f"{prefix}.field: {q.field!r} is {where}; frequency needs one of the categorical "
                    f"fields {list(categorical)}"
                )
            continue
        for key, name in _field_keys(q):
            _require_numeric(name, schema, f"{prefix}.{key}", q.kind)
        if isinstance(q, LogisticRegressionQuery) and q.threshold is not None:
            # values are clipped into [low, high]: y = 1{label > threshold} is constant (all 0) for
            # a threshold >= high and (all 1) below low; at low it still splits the values above it
            low, high = _numeric_bounds(schema)[q.label]
            if not low <= q.threshold < high:
                raise ConfigError(
                    f"{prefix}.threshold: must be in [{low:g}, {high:g}): {q.label} is clipped into "
                    f"its bounds [{low:g}, {high:g}], so y = 1{{{q.label} > threshold}} would be "
                    f"constant, got {q.threshold}"
                )
        if isinstance(q, CustomQuery):
            loss = losses[q.name] = load_custom_loss(q.loss, key=f"{prefix}.loss")
            check_loss_fields(loss, q.fields, schema, key=f"{prefix}.fields", loss_name=q.loss,
                              estimator=q.estimator)
            if q.estimator in ("sdr", "sl") and not _is_smooth(loss):
                raise ConfigError(
                    f"{prefix}.estimator: {q.estimator!r} needs a loss twice differentiable in the "
                    f"noised fields; {q.loss!r} is not smooth — use 'dr'"
                )
        if isinstance(q, LogisticRegressionQuery) and q.threshold is not None and q.estimator != "dr":
            raise ConfigError(f"{prefix}.estimator: a thresholded label needs 'dr'")  # pragma: no cover
    return losses


def check_loss_fields(loss, fields, schema, *, key: str, loss_name: str, estimator: str = "dr") -> None:
    """Check the numeric ``fields`` that a custom loss's records are made of, before any report
    is read: at least one, distinct, numeric fields of ``schema``, as many as the loss takes
    (its ``check_x`` on one record at the middle of the fields' bounds, where it has one —
    ``mechanisms.losses.Loss``), and every one of them among the loss's ``noised`` columns (all
    numeric fields carry ZIL noise; the built-in index losses default to ``noised=()``) unless
    ``estimator`` is ``"naive"`` (which ignores the noise).

    Used by ``validate_queries`` (``kind = "custom"``) and ``ldp-stream analyze --loss``: a loss
    run on records of the wrong width gives a meaningless number in the workers, and ``analyze``
    would find out only after replaying the topic.

    Raises
    ------
    ConfigError
        ``<key>: <problem>``.
    """
    fields = list(fields)
    if not fields:
        raise ConfigError(f"{key}: name at least one numeric field of {list(_numeric_names(schema))}")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"{key}: fields must be distinct, got {fields}")
    for name in fields:
        _require_numeric(name, schema, key, "a loss")
    check = getattr(loss, "check_x", None)
    if check is not None:
        import numpy as np

        # one record at the middle of each field's bounds: a value any record may carry
        bounds = _numeric_bounds(schema)
        record = np.array([[(bounds[n][0] + bounds[n][1]) / 2.0 for n in fields]], dtype=np.float64)
        try:
            check(record, name="record")
        except Exception as exc:  # a user loss may fail any way on records it cannot take
            raise ConfigError(f"{key}: {len(fields)} field(s) {fields} do not fit the loss "
                              f"{loss_name!r}: {_one_line(exc)}") from None
    if estimator == "naive":  # ℓ(x̃₁, θ) as is: the noise is ignored by construction
        return
    # every numeric field carries ZIL noise: a loss declaring fewer noised columns would get one
    # noise scale per field (analyze: "scale must … have shape (0,)") or ignore the noise (SDR/SL)
    noised = tuple(getattr(loss, "noised", ()))
    every = tuple(range(len(fields)))
    if sorted(noised) != list(every):
        raise ConfigError(
            f"{key}: the loss {loss_name!r} declares {len(noised)} noised column(s) {noised} but "
            f"the {len(fields)} field(s) {fields} all carry ZIL noise: it must declare noised = "
            f"{every} (for a built-in loss class, name a function that returns it built with "
            f"noised={every}; docs/configuration.md, \"Custom losses\")"
        )


def _numeric_bounds(schema) -> dict[str, tuple[float, float]]:
    """``{field: (low, high)}``: the clipping bounds of the schema's numeric fields."""
    return {f.name: (f.low, f.high) for f in schema.numeric.fields}


def _require_numeric(name: str, schema, key: str, who: str) -> None:
    """Raise ``ConfigError`` (``<key>: 'x' is a categorical field; <who> needs numeric fields
    […]``) unless ``name`` is a numeric field of ``schema``."""
    numeric = _numeric_names(schema)
    if name not in numeric:
        where = "a categorical field" if name in _categorical_names(schema) else "not a field of the schema"
        raise ConfigError(f"{key}: {name!r} is {where}; {who} needs numeric fields {list(numeric)}")


def _field_keys(q: Query) -> list[tuple[str, str]]:
    kind = q.kind
    if kind in ("mean", "variance", "quantiles"):
        return [("field", q.field)]
    if kind in ("linear_regression", "quantile_regression"):
        return [*[("covariates", c) for c in q.covariates], ("response", q.response)]
    if kind == "logistic_regression":
        return [*[("covariates", c) for c in q.covariates], ("label", q.label)]
    if kind in ("custom", "kmeans", "gaussian_mixture"):
        return [("fields", f) for f in q.fields]
    return [(kind, f) for f in query_fields(q)]  # pragma: no cover
