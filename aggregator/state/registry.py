"""Registry of state classes by query kind, and :func:`build_state` (docs/mechanisms.md §6)."""

from __future__ import annotations

from aggregator.errors import ConfigError
from aggregator.queries import parse_query

__all__ = ["STATE_CLASSES", "build_state", "construct", "register_state", "state_class"]

STATE_CLASSES: dict[str, type] = {}
"""Query kind → state class (e.g. ``"mean" → MomentsState``)."""


def state_class(query) -> type:
    """The state class of ``query``: :class:`aggregator.state.windowed.WindowedState` when it has a
    ``window``, else its kind's class (:data:`STATE_CLASSES`).

    Raises
    ------
    ConfigError
        If the kind has no state class.
    """
    try:
        cls = STATE_CLASSES[query.kind]
    except KeyError:
        raise ConfigError(f"queries.{query.name}.kind: no state class for kind {query.kind!r} "
                          f"(have {sorted(STATE_CLASSES)})") from None
    if getattr(query, "window", None) is not None:
        from aggregator.state.windowed import WindowedState

        return WindowedState
    return cls


def known_classes() -> list[type]:
    """Every state class a serialized state may name."""
    from aggregator.state.windowed import WindowedState

    return [*STATE_CLASSES.values(), WindowedState]


def register_state(cls: type) -> type:
    """Register ``cls`` for every kind in ``cls.kinds``; returns ``cls`` (usable as a decorator)."""
    for kind in cls.kinds:
        STATE_CLASSES[kind] = cls
    return cls


def build_state(query, schema, *, loss=None):
    """A fresh (empty) state for ``query`` over ``schema``.

    Parameters
    ----------
    query : Query or mapping
    schema : ingest.client.schema.TelemetrySchema
    loss : loss object, optional
        A ``custom`` query's loss, already resolved from its ``loss`` spec (the pipeline config
        resolves it once, when it is loaded); the state then imports no user code. None: the
        state imports the spec itself (:func:`aggregator.custom_loss.load_custom_loss`).

    Returns
    -------
    State

    Raises
    ------
    ConfigError
        If the query is invalid, its kind has no state class, it does not fit the schema, or
        ``loss`` is given for a query that is not ``custom``.
    """
    q = parse_query(query)
    return construct(state_class(q), q, schema, loss)


def construct(cls: type, query, schema, loss=None):
    """``cls(query, schema)``, with ``loss=loss`` for a custom query's resolved loss.

    Raises
    ------
    ConfigError
        If ``loss`` is given for a query that is not ``custom``, or the query does not fit.
    """
    if loss is None:
        return cls(query, schema)
    if query.kind != "custom":  # (a windowed custom query passes it on to its panes)
        raise ConfigError(f"queries.{query.name}: a loss object is only for custom queries, "
                          f"not {query.kind!r}")
    return cls(query, schema, loss=loss)
