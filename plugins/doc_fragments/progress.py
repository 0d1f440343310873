# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The progress document the collection's long-running modules write for job_wait."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  progress_file:
    description:
      - When set, the collection's progress document is written there atomically, at most every 2
        seconds - C({what, phase, unit, done, total, started, updated, detail}) - so that a role running
        the module with C(async) can show its progress (M(sparkserve.dsv41.job_wait)). C(started) and
        C(updated) are seconds since the epoch; C(phase) ends as C(done) or C(failed). The module's
        notes say what C(unit), C(done), C(total) and C(detail) count.
      - Not written in check mode.
    type: path
"""
