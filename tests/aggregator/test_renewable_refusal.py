"""A custom loss that refuses an input raises in the update that carries it
(``RenewableState._probe``; docs/reliability.md §9), wherever the report lands: in the warm-up
buffer, in a renewal's full batches, or in the remainder left over them — so that the worker
dead-letters that record and no other. Loss: ``tests/integration/refusing_loss.py`` (raises on
a value beyond ±1e5)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from aggregator.state import build_state
from tests.aggregator._state_support import make_batch, make_schema, split
from tests.integration.refusing_loss import LIMIT

SCHEMA = make_schema()
B = 40
QUERY = {"kind": "custom", "name": "refusing", "loss": "tests.integration.refusing_loss:refusing_linreg",
         "fields": ["a", "b"], "params": ["intercept", "a"], "renewable": {"warm_up": 100, "batch_size": B}}


def _chunks(sizes, seed):
    batch, x2, _ = make_batch(SCHEMA, sum(sizes), np.random.default_rng(seed))
    out, rest = [], (batch, x2)
    for s in sizes[:-1]:
        head, rest = split(*rest, s)
        out.append(head)
    return [*out, rest]


# (sizes of the updates, which update carries the bad report, at which of its rows): the bad
# report enters the warm-up buffer; the first full batch of a renewal; the remainder after a
# renewal's full batches (23 + 30 = 53 → one batch of 40, 13 left, the bad one among them);
# the remainder of an update that fills no batch at all
CASES = [([37, 50, 60], 1, 10), ([120, 45, 30], 1, 2), ([120, 23, 30, 40], 2, 29), ([120, 7, 7], 2, 3)]


@pytest.mark.parametrize(("sizes", "bad", "row"), CASES, ids=["warm-up", "batch", "remainder", "no-batch"])
def test_the_update_that_carries_a_refused_report_raises_and_no_other(sizes, bad, row):
    chunks = _chunks(sizes, seed=sum(sizes) + row)
    chunks[bad][0].numeric[row, 1] = chunks[bad][1][row, 1] = 2 * LIMIT  # b beyond the loss's limit
    st = build_state(QUERY, SCHEMA)
    for i, (b, x2) in enumerate(chunks):
        before = copy.deepcopy(st)
        if i == bad:
            with pytest.raises(ValueError, match="beyond the loss's limit"):
                st.update(b, x2)
            st = before  # what the worker does: the refused update is rolled back
            continue
        st.update(b, x2)  # every other update folds
    clean = build_state(QUERY, SCHEMA)
    for i, (b, x2) in enumerate(chunks):
        if i != bad:
            clean.update(b, x2)
    assert st.to_bytes() == clean.to_bytes()  # the rolled-back state holds exactly the others
