# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The downtime of a switch, from answers the API gave: the ``api_watch`` module's bookkeeping.

Internal to sparkserve.dsv41; not a public API. Stdlib only, pure.

The watch starts while the old ranks serve. A gap is ``gap_failures`` unanswered questions in a
row (one lost under load is not the old ranks stopping); answers before it are the old ranks', the
first answer after it the new ranks'. The downtime is the time between the last old answer and
the first new one, which is what a client sees.
"""

from __future__ import annotations

from dataclasses import dataclass

# Unanswered questions in a row that make a gap.
GAP_FAILURES = 2


@dataclass
class GapWatch:
    started: float
    gap_failures: int = GAP_FAILURES
    last_old_answer: float | None = None
    down_since: float | None = None
    first_new_answer: float | None = None
    probes: int = 0
    failures: int = 0
    in_a_row: int = 0

    def observe(self, answered: bool, now: float) -> bool:
        """Count one probe; True once the API answered again after a gap."""
        self.probes += 1
        if answered:
            if self.down_since is None:
                self.last_old_answer, self.in_a_row = now, 0
            else:
                self.first_new_answer = now
        else:
            self.failures += 1
            self.in_a_row += 1
            if self.down_since is None and self.in_a_row >= self.gap_failures:
                self.down_since = now
        return self.done

    @property
    def done(self) -> bool:
        return self.first_new_answer is not None

    @property
    def downtime(self) -> float | None:
        """Seconds without an answer (from the watch's start when the old ranks never answered)."""
        if self.first_new_answer is None:
            return None
        since = self.last_old_answer if self.last_old_answer is not None else self.started
        return round(self.first_new_answer - since, 3)

    def summary(self, epoch_offset: float = 0.0) -> dict:
        """The result; ``epoch_offset`` turns the watch's clock (monotonic) into epoch seconds."""
        return {
            "downtime_seconds": self.downtime,
            "last_old_answer": None if self.last_old_answer is None else self.last_old_answer + epoch_offset,
            "first_new_answer": None
            if self.first_new_answer is None
            else self.first_new_answer + epoch_offset,
            "probes": self.probes,
            "failures": self.failures,
        }

    def message(self) -> str:
        if self.done:
            return f"the API did not answer for {self.downtime:.1f} s ({self.failures} failed probes)"
        if self.down_since is None:
            return (
                f"no gap seen in {self.probes} probes"
                f" ({self.failures} unanswered, none {self.gap_failures} in a row)"
            )
        return f"the API has not answered for the last {self.in_a_row} probes"
