"""The downtime watch's bookkeeping (``_watch``): from the old ranks' last answer to the new ones' first."""

from __future__ import annotations

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._watch import GapWatch


@pytest.mark.parametrize(
    ("answers", "downtime", "message"),
    [
        ([(1, True), (2, True), (3, False), (4, False), (5.5, True)], 3.5,
         "the API did not answer for 3.5 s (2 failed probes)"),
        ([(1, False), (2, True)], 2.0, "the API did not answer for 2.0 s (1 failed probes)"),
        ([(1, True), (2, True)], None, "the API answered all 2 probes: no gap seen"),
        ([(1, True), (2, False)], None, "the API has not answered since 1 probes ago"),
    ],
)  # fmt: skip
def test_the_gap_is_from_the_last_old_answer_to_the_first_new_one(answers, downtime, message):
    watch = GapWatch(started=0.0)
    done = [watch.observe(ok, now) for now, ok in answers]
    assert watch.downtime == downtime
    assert done[-1] is (downtime is not None)
    assert watch.message() == message
    assert watch.summary()["probes"] == len(answers)
