"""Mergeable state objects, one per estimator family (DESIGN §2, §5).

* :class:`CountsState` — frequency of a uRR/uRAP field (``frequency``);
* :class:`MomentsState` — mean and variance (``mean``, ``variance``);
* :class:`HistogramState` — DR CDF and quantiles (``quantiles``);
* :class:`GramState` — SDR linear regression (``linear_regression``);
* :class:`SGDState` — averaged SGD with random-scaling CIs (``logistic_regression``,
  ``quantile_regression``, ``custom``).

Use :func:`build_state` (query, schema) → state; :func:`doubling_rng` seeds the consumer-side
doubling from the record bytes. See :mod:`aggregator.state.base` for the common API.
"""

from aggregator.state.base import EmptyStateError, Estimate, State, doubling_rng
from aggregator.state.counts import CountsState
from aggregator.state.moments import MomentsState
from aggregator.state.registry import STATE_CLASSES, build_state, register_state

register_state(CountsState)
register_state(MomentsState)

for _mod, _cls in (("histogram", "HistogramState"), ("gram", "GramState"), ("sgd", "SGDState")):
    try:  # families land one by one
        _m = __import__(f"aggregator.state.{_mod}", fromlist=[_cls])
        register_state(getattr(_m, _cls))
    except ModuleNotFoundError as _exc:
        if _exc.name != f"aggregator.state.{_mod}":
            raise

__all__ = [
    "STATE_CLASSES",
    "CountsState",
    "EmptyStateError",
    "Estimate",
    "MomentsState",
    "State",
    "build_state",
    "doubling_rng",
    "register_state",
]
