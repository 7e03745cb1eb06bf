"""The one base of the project's immutable pydantic models (schema, queries, pipeline config,
Kafka settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["FrozenModel", "StrictModel"]


class FrozenModel(BaseModel):
    """Immutable, unknown keys refused, defaults validated like given values.

    The telemetry schema's models (``ingest.client.schema``) use it as is: values are coerced in
    pydantic's lax mode (``low = 0`` is the float 0.0).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class StrictModel(FrozenModel):
    """A :class:`FrozenModel` that coerces nothing: no string, bool or float becomes a number,
    bool or int (``level = "0.9"``, ``partitions = true``, ``intercept = "yes"`` are refused; an
    int is still a float). A field with an alias also takes its name. Used by the queries
    (``aggregator.queries``) and the pipeline config (``aggregator.config``); tuple and path
    fields that take TOML arrays and strings are ``Field(strict=False)``, their items strict.
    """

    model_config = ConfigDict(strict=True, populate_by_name=True)
