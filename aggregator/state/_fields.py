"""Resolving a query's fields against the telemetry schema (shared by the state families)."""

from __future__ import annotations

import numpy as np

from aggregator.errors import ConfigError

__all__ = ["categorical_params", "numeric_columns", "zil_of"]


def numeric_columns(schema, names, query_name: str, key: str = "field") -> np.ndarray:
    """Column indices of numeric fields ``names`` in ``ReportBatch.numeric``.

    Raises
    ------
    ConfigError
        ``queries.<query>.<key>: ...`` if a name is not a numeric field of the schema.
    """
    numeric = tuple(getattr(schema, "numeric_names", ()) or ())
    out = []
    for name in names:
        if name not in numeric:
            raise ConfigError(
                f"queries.{query_name}.{key}: {name!r} is not a numeric field of the schema "
                f"(numeric fields: {list(numeric)})"
            )
        out.append(numeric.index(name))
    return np.asarray(out, dtype=np.intp)


def zil_of(schema, query_name: str):
    """The schema's :class:`mechanisms.zil.ZILMechanism`.

    Raises
    ------
    ConfigError
        If the schema has no numeric block.
    """
    mech = schema.zil_mechanism()
    if mech is None:
        raise ConfigError(f"queries.{query_name}: the schema has no numeric fields")
    return mech


def categorical_params(schema, field: str) -> tuple[str, ...]:
    """Parameter names of a frequency estimate: the categories, then ``bot1 … botκ`` for PUM."""
    f = schema.categorical_field(field)
    bots = f.personalized.bots if getattr(f, "personalized", None) else 0
    return tuple(f.categories) + tuple(f"bot{i + 1}" for i in range(bots))
