"""Registry of state classes by query kind, and :func:`build_state` (DESIGN §5)."""

from __future__ import annotations

from aggregator.errors import ConfigError
from aggregator.queries import parse_query

__all__ = ["STATE_CLASSES", "build_state", "register_state"]

STATE_CLASSES: dict[str, type] = {}
"""Query kind → state class (e.g. ``"mean" → MomentsState``)."""


def register_state(cls: type) -> type:
    """Register ``cls`` for every kind in ``cls.kinds``; returns ``cls`` (usable as a decorator)."""
    for kind in cls.kinds:
        STATE_CLASSES[kind] = cls
    return cls


def build_state(query, schema):
    """A fresh (empty) state for ``query`` over ``schema``.

    Parameters
    ----------
    query : Query or mapping
    schema : ingest.schema.TelemetrySchema

    Returns
    -------
    State

    Raises
    ------
    ConfigError
        If the query is invalid, its kind has no state class, or it does not fit the schema.
    """
    q = parse_query(query)
    try:
        cls = STATE_CLASSES[q.kind]
    except KeyError:
        raise ConfigError(f"queries.{q.name}.kind: no state class for kind {q.kind!r} "
                          f"(have {sorted(STATE_CLASSES)})") from None
    return cls(q, schema)
