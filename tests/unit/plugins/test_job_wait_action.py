"""The job_wait action (with its module), run by ansible-playbook on this machine (no lab).

One playbook starts four background jobs that write the collection's progress document and waits
for each with one `sparkserve.dsv41.job_wait` task: one succeeds, one fails, one is stopped at its
async timeout, one outlives the polls. It shows what the checkpoint and bench roles get from it:
one progress line per poll, the job's own result, a failure message naming the timeout variable,
and no status file left behind. A fifth case finds the progress file of an earlier run and must
not show it as this job's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

JOB = """
import sys, time
sys.path.insert(0, {collections!r})
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter

path, steps, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
writer = ProgressWriter(path, "job", unit="steps", total=steps)
writer.update(force=True, phase="working")
for step in range(1, steps + 1):
    time.sleep(1)
    writer.update(force=True, done=step, detail=f"step {{step}}")
if code:
    print("some progress on stderr\\nit broke", file=sys.stderr)
writer.finish(failed=bool(code))
sys.exit(code)
"""

PLAYBOOK = """
- name: Wait for background jobs with the deployment role
  hosts: localhost
  gather_facts: false
  vars:
    cases:
      - {{name: succeeds, steps: 3, code: 0, async: 60, minutes: 1}}
      - {{name: fails, steps: 1, code: 3, async: 60, minutes: 1}}
      - {{name: times out, steps: 30, code: 0, async: 2, minutes: 1}}
      - {{name: outlives the polls, steps: 15, code: 0, async: 60, minutes: 0}}
      - {{name: follows a finished run, steps: 2, code: 0, async: 60, minutes: 1, stale: true}}
      - {{name: waited for twice, steps: 1, code: 0, async: 60, minutes: 1, twice: true}}
      - {{name: reads progress from the node home, steps: 2, code: 0, async: 60, minutes: 1, home: true}}
  tasks:
    - name: Run each case
      ansible.builtin.include_tasks: {case!r}
      loop: "{{{{ cases }}}}"
      loop_control:
        loop_var: case
"""

CASE = """
- name: Leave the progress document of an earlier, finished run
  ansible.builtin.copy:
    dest: "{{{{ {tmp!r} }}}}/{{{{ case.name }}}}.json"
    content: >-
      {{{{ {{"what": "job", "phase": "done", "unit": "steps", "done": 9, "total": 9, "started": 1000.0,
         "updated": 1001.0, "detail": "earlier run"}} | to_json }}}}
    mode: "0644"
  when: case.stale | default(false)

- name: Start the job
  ansible.builtin.command:
    argv: [{python!r}, {job!r}, "{{{{ progress }}}}", "{{{{ case.steps }}}}", "{{{{ case.code }}}}"]
  async: "{{{{ case.async }}}}"
  poll: 0
  register: job
  changed_when: false
  vars:
    progress: "{{{{ {tmp!r} }}}}/{{{{ case.name }}}}.json"

- name: Wait for it
  block:
    - name: Wait with the job_wait action
      sparkserve.dsv41.job_wait:
        job: "{{{{ job }}}}"
        what: "{{{{ case.name }}}}"
        progress_file: "{{{{ '~' if case.home | default(false) else {tmp!r} }}}}/{{{{ case.name }}}}.json"
        timeout_minutes: "{{{{ case.minutes }}}}"
        timeout_variable: test_timeout_minutes
        seconds: 1
        note: A re-run resumes.
      # A `~` names the node's home, which is not the controller's.
      environment: "{{{{ {{'HOME': {tmp!r}}} if case.home | default(false) else {{}} }}}}"
      register: waited

    - name: Show the result
      ansible.builtin.debug:
        msg: >-
          RESULT {{{{ case.name }}}} {{{{ job.ansible_job_id }}}} rc={{{{ waited.rc }}}}
          changed={{{{ waited.changed }}}}

    - name: Wait for the finished job again
      sparkserve.dsv41.job_wait:
        job: "{{{{ job }}}}"
        what: "{{{{ case.name }}}}"
        timeout_minutes: "{{{{ case.minutes }}}}"
        timeout_variable: test_timeout_minutes
        seconds: 1
      when: case.twice | default(false)
  rescue:
    - name: Show the failure
      ansible.builtin.debug:
        msg: "FAILURE {{{{ case.name }}}} {{{{ job.ansible_job_id }}}} {{{{ ansible_failed_result.msg }}}}"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp = tmp_path_factory.mktemp("wait")
    (tmp / "job.py").write_text(textwrap.dedent(JOB.format(collections=str(REPO / "collections"))))
    case = tmp / "case.yml"
    case.write_text(
        textwrap.dedent(CASE.format(python=sys.executable, job=str(tmp / "job.py"), tmp=str(tmp)))
    )
    playbook = tmp / "playbook.yml"
    playbook.write_text(textwrap.dedent(PLAYBOOK.format(case=str(case))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(ANSIBLE_ASYNC_DIR=str(tmp / "async"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        str(playbook),
        "-i",
        "localhost,",
        "-c",
        "local",
    ]
    argv += ["-e", json.dumps({"ansible_python_interpreter": sys.executable})]
    result = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result, tmp


def shown(run, prefix: str, name: str) -> tuple[str, str]:
    result, _ = run
    text = " ".join(result.stdout.split())  # the callback folds long messages
    match = re.search(rf"{prefix} {name} (\S+) (.*?)['\"]? (?:ok|TASK|PLAY)", text)
    assert match, result.stdout[-4000:]
    return match.group(1), match.group(2)


def progress_lines(run, name: str) -> list[str]:
    result, _ = run
    return re.findall(rf"^localhost: ({name}: .*)$", result.stdout, flags=re.MULTILINE)


def test_a_job_that_succeeds_shows_its_progress_and_hands_over_its_result(run):
    _, tmp = run
    lines = progress_lines(run, "succeeds")
    assert any(
        re.fullmatch(r"succeeds: working, [12] of 3 steps, \d+\.\d%, step [12], after \ds", line)
        for line in lines
    ), lines
    assert lines[-1].startswith("succeeds: finished, 3 of 3 steps, 100.0%, step 3, after "), lines
    jid, rest = shown(run, "RESULT", "succeeds")
    assert rest.startswith("rc=0 changed=True"), (
        "the job's own result: the command's rc, and changed as a command reports it"
    )
    assert not (tmp / "async" / jid).exists(), "the job's status file is removed"


def test_the_progress_of_an_earlier_run_is_not_shown_as_this_jobs(run):
    lines = progress_lines(run, "follows a finished run")
    assert lines, "a line per poll"
    assert not any("9 of 9" in line or "earlier run" in line for line in lines), lines
    assert lines[-1].startswith("follows a finished run: finished, 2 of 2 steps, 100.0%"), lines


def test_a_progress_file_under_the_home_is_the_nodes(run):
    """The action passes `~` on to the module, which expands it on the node."""
    lines = progress_lines(run, "reads progress from the node home")
    assert lines[-1].startswith("reads progress from the node home: finished, 2 of 2 steps, 100.0%"), lines


def test_a_job_that_fails_fails_with_its_own_message(run):
    _, tmp = run
    jid, message = shown(run, "FAILURE", "fails")
    assert message.startswith("fails on localhost failed: it broke")
    assert not (tmp / "async" / jid).exists(), "removed after a failure too"


def test_a_job_stopped_at_its_timeout_names_the_variable(run):
    _, message = shown(run, "FAILURE", "times out")
    assert message.startswith("times out on localhost was stopped after test_timeout_minutes (1 minutes)")
    assert message.endswith(": raise it. A re-run resumes.")


def test_polls_that_run_out_name_the_variable(run):
    _, message = shown(run, "FAILURE", "outlives the polls")
    assert message.startswith("outlives the polls on localhost did not finish within test_timeout_minutes")
    assert message.endswith("(0 minutes): raise it. A re-run resumes.")


def test_a_job_waited_for_again_fails_soon_naming_its_results_file(run):
    """Its results file was removed when the first wait saw it finish: the second wait must not
    poll until the timeout (a day for a download)."""
    _, tmp = run
    jid, message = shown(run, "FAILURE", "waited for twice")
    assert message.startswith(
        f"waited for twice on localhost: the results file {tmp / 'async' / jid} is not there: the job was"
    ), message
    assert "waited for already" in message
