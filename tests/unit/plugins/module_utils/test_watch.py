"""The downtime watch's bookkeeping (``_watch``): from the old ranks' last answer to the new ones' first."""

from __future__ import annotations

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._watch import GapWatch


@pytest.mark.parametrize(
    ("answers", "downtime", "message"),
    [
        pytest.param([(1, True), (2, True), (3, False), (4, False), (5.5, True)], 3.5,
                     "the API did not answer for 3.5 s (2 failed probes)", id="switch"),
        pytest.param([(1, False), (2, False), (3, True)], 3.0,
                     "the API did not answer for 3.0 s (2 failed probes)", id="down-from-the-start"),
        pytest.param([(1, True), (2, False), (3, True), (4, False), (5, False), (7, True)], 4.0,
                     "the API did not answer for 4.0 s (3 failed probes)", id="a-lost-answer-is-no-gap"),
        pytest.param([(1, True), (2, False), (3, True)], None,
                     "no gap seen in 3 probes (1 unanswered, none 2 in a row)", id="no-gap"),
        pytest.param([(1, True), (2, False), (3, False)], None,
                     "the API has not answered for the last 2 probes", id="still-down"),
    ],
)  # fmt: skip
def test_the_gap_is_from_the_last_old_answer_to_the_first_new_one(answers, downtime, message):
    watch = GapWatch(started=0.0)
    done = [watch.observe(ok, now) for now, ok in answers]
    assert watch.downtime == downtime
    assert done[-1] is (downtime is not None)
    assert watch.message() == message
    assert watch.summary()["probes"] == len(answers)
