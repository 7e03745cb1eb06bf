"""Mergeable state objects, one per estimator family (docs/mechanisms.md §6).

* :class:`CountsState` — frequency of a uRR/uRAP field (``frequency``);
* :class:`MomentsState` — mean and variance (``mean``, ``variance``);
* :class:`HistogramState` — DR CDF and quantiles (``quantiles``);
* :class:`GramState` — SDR linear regression (``linear_regression``);
* :class:`RenewableState` — renewable M-estimation of general losses (``logistic_regression``,
  ``quantile_regression``, ``custom``);
* :class:`MixtureState` — the same for k-means and Gaussian mixtures, components matched across
  partitions (``kmeans``, ``gaussian_mixture``).

Use :func:`build_state` (query, schema) → state. :mod:`aggregator.state.doubling` holds the
consumer-side doubling (:class:`Doubler`, :func:`doubling_draws`, seeded by the record bytes:
:func:`doubling_seed`); :mod:`aggregator.state.serialize` the serialized form
(:func:`state_from_bytes`); :mod:`aggregator.state.base` the common API.
"""

from aggregator.errors import EmptyStateError
from aggregator.state.base import Estimate, State
from aggregator.state.counts import CountsState
from aggregator.state.doubling import Doubler, double_records, doubling_draws, doubling_seed
from aggregator.state.gram import GramState
from aggregator.state.histogram import HistogramState
from aggregator.state.mixture import MixtureState
from aggregator.state.moments import MomentsState
from aggregator.state.registry import STATE_CLASSES, build_state, register_state
from aggregator.state.renewable import RenewableState
from aggregator.state.serialize import state_from_bytes, state_to_bytes

for _cls in (CountsState, MomentsState, HistogramState, GramState, RenewableState, MixtureState):
    register_state(_cls)

__all__ = [
    "STATE_CLASSES",
    "CountsState",
    "Doubler",
    "EmptyStateError",
    "Estimate",
    "GramState",
    "HistogramState",
    "MixtureState",
    "MomentsState",
    "RenewableState",
    "State",
    "build_state",
    "double_records",
    "doubling_draws",
    "doubling_seed",
    "register_state",
    "state_from_bytes",
    "state_to_bytes",
]
