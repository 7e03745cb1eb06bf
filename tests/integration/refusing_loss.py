"""A custom loss that validates its input, as a user's loss may: the squared loss of
``arr_delay`` on ``dep_delay`` that raises ``ValueError`` on a value beyond ±:data:`LIMIT`
(for the worker's handling of a state that refuses an update, docs/reliability.md §9)."""

from __future__ import annotations

import numpy as np

from mechanisms.losses import LinearRegressionLoss

#: Largest magnitude the loss accepts (minutes): 333 noise standard deviations of the flights'
#: delays (σ = 300 min), which a privatized delay exceeds with probability e^(−471); inside the
#: ±1000 σ the decoder accepts (docs/wire-format.md §4), so such a value reaches the states.
LIMIT = 1e5


class RefusingLinearLoss(LinearRegressionLoss):
    """:class:`LinearRegressionLoss` whose ``grad`` refuses a value beyond ±:data:`LIMIT`."""

    def grad(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """The squared loss's gradient; raises ``ValueError`` if ``|x|`` exceeds :data:`LIMIT`."""
        big = float(np.abs(x).max(initial=0.0))
        if big > LIMIT:
            raise ValueError(f"a value of magnitude {big:.3g} is beyond the loss's limit {LIMIT:g}")
        return super().grad(x, theta)


def refusing_linreg() -> RefusingLinearLoss:
    """The loss of ``arr_delay`` on ``dep_delay``, both noised."""
    return RefusingLinearLoss(noised=(0, 1))
