#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: checkpoint revisions side by side under a model root."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_revision
short_description: Keep checkpoint revisions side by side under a model root
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Each checkpoint revision lives in C(<root>/revisions/<commit>), so that a new revision is
    downloaded, verified and copied next to the one the ranks mount, which keeps serving until the
    switch.
  - O(state=present) gives the directory of a revision - O(commit), or O(revision) of O(repo_id)
    resolved to its commit by the hub (with C(huggingface_hub), so the task runs with the download
    virtualenv's Python). When the hub cannot be asked and O(root) holds a single revision, that one
    is kept, with a warning; with several, the module fails asking for a pinned commit.
  - O(state=present) creates C(<root>/revisions/) when missing, and adopts a checkpoint of the
    single-directory layout (the checkpoint straight in O(root), as the original C(download.sh) and
    earlier versions of this collection left it) - the directory is renamed as a whole to
    C(<root>/revisions/<commit>). A rename keeps its inode, so ranks that mount it keep serving, and
    the verification records of M(sparkserve.dsv41.checkpoint_shards) move with it. The commit comes
    from C(huggingface_hub)'s metadata in the directory, else from O(adopt_as); the module fails
    before changing anything when neither names it, or when O(root) is a symbolic link, a mount point
    or not writable, or holds C(revisions/) already. An interrupted adoption is finished by the
    next run.
  - After an adoption, O(root) keeps links to the adopted revision's entries (C(<root>/config.json)
    -> C(revisions/<commit>/config.json), ...), relative so that they resolve inside a container
    too - a rank container created before the adoption mounts O(root) by path and must find the
    checkpoint there when it is started again. Links whose revision is removed go with it.
  - O(state=pruned) removes the revision directories beyond O(keep_count), keeping every one named in
    O(keep) (the current deployment's, then the previous one's; an empty name is the adopted one)
    and then the newest others. A directory is renamed before it is removed, so an interrupted
    removal never leaves half a revision under a commit's name; the next run finishes it.
  - O(state=sealed) records a revision fetched and verified in full - the seal
    C(<root>/revisions/.<commit>.complete.json) lists every file of its directory (but C(.cache/))
    with size and modification time, and O(verified).
    While the files stay as listed, O(state=present) returns RV(complete) and RV(verified), and the
    role downloads, verifies and copies nothing - a re-run reads no checkpoint data and asks the
    workers nothing. Any file added, removed, resized or touched breaks the seal; the seal goes when
    its revision is pruned.
  - O(state=absent) removes O(root) with every revision in it (C(teardown.yml -e
    deployment_purge_model=true)), only when it holds nothing but what this module puts there -
    C(revisions/) with commit directories and this module's records, and the links of an adoption.
    It refuses, naming the path and why and deleting nothing, C(/), a directory that is or holds a
    path of O(protect), a symbolic link, and a directory holding anything else (another model, say).
    The directory is renamed before it is deleted, so an interrupted removal leaves no half
    checkpoint under its name; the next run finishes it.
options:
  root:
    description: The model root - the directory that holds C(revisions/).
    type: path
    required: true
  state:
    description:
      - C(present) resolves and adopts; C(sealed) records a complete revision; C(pruned) removes old
        revisions; C(absent) removes O(root).
    type: str
    choices: [present, sealed, pruned, absent]
    default: present
  commit:
    description:
      - The revision's commit, when it is known (a worker gets the head's).
      - Required with O(state=sealed).
    type: str
  repo_id:
    description: The model repo, C(<owner>/<name>), whose O(revision) the hub resolves.
    type: str
  revision:
    description:
      - A branch, tag or commit of O(repo_id). A 40-hex commit needs no hub.
      - Empty - the revision that O(deployed_record) says serves for O(recipe), so that a re-run never
        moves to whatever C(main) became upstream; C(main)'s commit when there is none (a first
        deployment). Set C(main) to follow C(main).
    type: str
    default: ""
  deployed_record:
    description:
      - The deployment record (C(deployments.json) in the head's state directory) whose current
        revision an empty O(revision) keeps. Absent or unreadable - none is recorded.
    type: path
  recipe:
    description: The recipe this run deploys; the recorded revision is kept only when it was deployed with it.
    type: str
  adopt_as:
    description:
      - The commit a checkpoint of the single-directory layout is adopted as when C(huggingface_hub)'s
        metadata in it does not say (a worker's copy from the head has none; the head's adoption names
        it). Ignored when the metadata says.
    type: str
  keep:
    description: O(state=pruned) - the revisions that stay whatever O(keep_count) says, in order.
    type: list
    elements: str
    default: []
  keep_count:
    description: O(state=pruned) - how many revisions stay in all (at least 1).
    type: int
    default: 2
  protect:
    description:
      - With O(state=absent) - paths that must never be removed, nor a directory that holds one (the
        role passes the user's home directory).
    type: list
    elements: path
    default: []
  verified:
    description:
      - O(state=sealed) - what the verification of the revision reported and the settings it ran with,
        returned as RV(verified) while the seal holds. The role keeps C(exl3_file_count), which a
        worker's verification checks against, C(keep_parts) on a node that downloads, and on a
        worker's copy C(source), the head's RV(fingerprint).
      - Required with O(state=sealed).
    type: dict
  verified_with:
    description:
      - O(state=present) - what the seal's O(verified) must hold for RV(complete). A seal made with
        other settings (the parts kept or not) or of another copy of the head's revision does not
        count, and the role fetches and verifies again.
    type: dict
    default: {}
extends_documentation_fragment:
  - sparkserve.dsv41.hub
notes:
  - Check mode resolves the revision (a read-only question to the hub) and changes nothing.
seealso:
  - module: sparkserve.dsv41.checkpoint_download
  - module: sparkserve.dsv41.checkpoint_shards
"""

EXAMPLES = r"""
- name: Remove the checkpoint, only if it holds nothing but its revisions
  sparkserve.dsv41.checkpoint_revision:
    root: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    state: absent
    protect: [/home/spark]
  become: true

- name: Resolve main to its commit and adopt a single directory
  sparkserve.dsv41.checkpoint_revision:
    root: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    repo_id: 0xSero/DeepSeek-V4.1-Flash-Spark
    token_file: /home/spark/.local/state/sparkserve/hf-token
  vars:
    ansible_python_interpreter: /home/spark/.local/state/sparkserve/hf-venv/bin/python
  register: revision

- name: Give a worker the head's revision directory
  sparkserve.dsv41.checkpoint_revision:
    root: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    commit: "{{ revision.commit }}"
    adopt_as: "{{ revision.adopted_commit }}"

- name: Seal the revision once it is downloaded and verified
  sparkserve.dsv41.checkpoint_revision:
    root: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    state: sealed
    commit: "{{ revision.commit }}"
    verified:
      exl3_file_count: 13

- name: Keep the current and the previous revision
  sparkserve.dsv41.checkpoint_revision:
    root: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    state: pruned
    keep: [4f1c0a5d0e6b1f2a3c4d5e6f708192a3b4c5d6e7, 9a8b7c6d5e4f30211fedcba98765432100112233]
    keep_count: 2
"""

RETURN = r"""
commit:
  description: The revision's commit.
  returned: state is present or sealed
  type: str
  sample: 4f1c0a5d0e6b1f2a3c4d5e6f708192a3b4c5d6e7
root:
  description: O(root), absolute.
  returned: always
  type: str
  sample: /home/spark/models/DeepSeek-V4.1-Flash-Spark
model_dir:
  description: The revision's directory, C(<root>/revisions/<commit>).
  returned: state is present or sealed
  type: str
  sample: /home/spark/models/DeepSeek-V4.1-Flash-Spark/revisions/4f1c0a5d0e6b1f2a3c4d5e6f708192a3b4c5d6e7
exists:
  description: O(state=present) - whether that directory exists (after an adoption, when one ran).
  returned: state is present
  type: bool
complete:
  description:
    - O(state=present) - whether the revision is sealed, every file is as the seal lists it, and the
      seal holds O(verified_with).
  returned: state is present
  type: bool
fingerprint:
  description:
    - A digest of the revision's files as sealed - O(state=present) while RV(complete), else null;
      O(state=sealed) as they are now.
  returned: state is present or sealed
  type: str
  sample: 9f2c41d07be35a6e0d14c2b7a8e95f31
verified:
  description: O(state=present) - the seal's O(verified) while RV(complete), else null.
  returned: state is present
  type: dict
  sample:
    exl3_file_count: 13
adopted:
  description: The adoption this run did (or would do in check mode) - C({commit, why}) - or null.
  returned: state is present
  type: dict
  sample:
    commit: 4f1c0a5d0e6b1f2a3c4d5e6f708192a3b4c5d6e7
    why: huggingface_hub's metadata names commit 4f1c0a5d0e6b1f2a3c4d5e6f708192a3b4c5d6e7 for 12 of its files
adopted_commit:
  description: The commit a single directory was adopted as on this node (this run or earlier), or null.
  returned: state is present
  type: str
revisions:
  description: The revision directories after the run, newest first.
  returned: always
  type: list
  elements: str
removed:
  description: O(state=pruned) and O(state=absent) - the revisions removed (or that would be, in check mode).
  returned: state is pruned or absent
  type: list
  elements: str
removed_bytes:
  description: O(state=pruned) and O(state=absent) - their size.
  returned: state is pruned or absent
  type: int
warning:
  description: Why the hub's answer was not used, or null.
  returned: state is present
  type: str
msg:
  description: One line saying what was (or would be) done.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.sparkserve.dsv41.plugins.module_utils._download import (
    DownloadError,
    HubClient,
    HubMissing,
    hub_environment,
    read_token,
    resolve_commit,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._revisions import (
    RevisionError,
    adopt,
    adoption_plan,
    deployed_revision,
    fingerprint,
    is_commit,
    keep_single_directory_view,
    leftover_removals,
    list_revisions,
    plan_seal,
    prune_plan,
    purge,
    purge_refusal,
    read_adopted,
    read_seal,
    remove_revisions,
    revision_path,
    revisions_dir,
    write_seal,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._space import tree_bytes


def _present(module: AnsibleModule, root: str) -> dict:
    params = module.params
    planned = adoption_plan(root, params["adopt_as"])
    adopted = None
    # The copy to a worker lands in revisions/<commit>, which rsync creates, but not its parents.
    created = not os.path.isdir(revisions_dir(root))
    linked: list[str] = []
    leftovers = [os.path.basename(path) for path in leftover_removals(root)]  # removed below
    if planned is not None:
        adopted = {"commit": planned["commit"], "why": planned["why"]}
    if not module.check_mode:
        if planned is not None:
            adopt(root, planned)
        os.makedirs(revisions_dir(root), exist_ok=True)
        # Also after an adoption that was interrupted before its links.
        linked = keep_single_directory_view(root)
        remove_revisions(root, [])  # what an interrupted removal left
    on_disk = list_revisions(root)
    if planned is not None and module.check_mode:
        on_disk = [planned["commit"], *on_disk]
    warning = None
    kept = (
        None
        if params["commit"] or params["revision"]
        else deployed_revision(params["deployed_record"], params["recipe"])
    )
    if params["commit"]:
        commit = params["commit"]
    elif kept:
        commit = kept
    else:
        token = read_token(params["token_file"])
        if token:
            module.no_log_values.add(token)
        hub = HubClient(hub_environment(os.environ, params["endpoint"]), token)
        commit, warning = resolve_commit(hub, params["repo_id"], params["revision"] or None, on_disk)
        if warning:
            module.warn(warning)
    if not is_commit(commit):
        module.fail_json(msg=f"a revision's commit is 40 hex digits, got {commit!r}")
    path = revision_path(root, commit)
    exists = os.path.isdir(path) or (planned is not None and planned["commit"] == commit)
    seal = read_seal(root, commit) if exists else None
    # Complete: sealed, every file as sealed, and sealed with what this run asks (verified_with).
    complete = seal is not None and all(
        seal["verified"].get(key) == value for key, value in params["verified_with"].items()
    )
    what = f"revision {commit} at {path}" + (
        " (complete as sealed: nothing to fetch, verify or copy)" if complete
        else "" if exists else " (to be fetched)"
    )  # fmt: skip
    if kept:
        what += " (the deployed revision, kept: checkpoint_revision is empty; set it to main to follow main)"
    if adopted:
        verb = "would adopt" if module.check_mode else "adopted"
        what = f"{verb} {root} as revision {adopted['commit']} ({adopted['why']}); {what}"
    finish = "would finish" if module.check_mode else "finished"
    left = ", ".join(sorted(leftovers))
    what += f"; {finish} the removal an interrupted run left ({left})" if leftovers else ""
    return {
        "changed": created or adopted is not None or bool(linked) or bool(leftovers),
        "commit": commit,
        "model_dir": path,
        "exists": exists,
        "complete": complete,
        "verified": seal["verified"] if complete else None,
        "fingerprint": seal["fingerprint"] if complete else None,
        "adopted": adopted,
        "adopted_commit": adopted["commit"] if adopted else read_adopted(root),
        "revisions": on_disk,
        "warning": warning,
        "msg": what + (f"; {warning}" if warning else ""),
    }


def _sealed(module: AnsibleModule, root: str) -> dict:
    commit, verified = module.params["commit"], module.params["verified"]
    path = revision_path(root, commit)
    if not is_commit(commit) or not os.path.isdir(path):
        module.fail_json(msg=f"cannot seal revision {commit!r}: {path} is no revision directory", root=root)
    if module.check_mode:
        changed, files = plan_seal(root, commit, verified)
        digest = fingerprint(files)
    else:
        changed, digest = write_seal(root, commit, verified)
    verb = ("would seal" if module.check_mode else "sealed") if changed else "already sealed:"
    return {
        "changed": changed,
        "commit": commit,
        "model_dir": path,
        "fingerprint": digest,
        "revisions": list_revisions(root),
        "msg": f"{verb} revision {commit}; later runs trust it while its files keep their sizes and times",
    }


def _pruned(module: AnsibleModule, root: str) -> dict:
    params = module.params
    if params["keep_count"] < 1:
        module.fail_json(
            msg=f"keep_count must be at least 1 (checkpoint_keep_revisions), got {params['keep_count']}"
        )
    # An empty name is a deployment recorded before revisions: served from the adopted one.
    adopted = read_adopted(root)
    planned = prune_plan(root, [name or adopted or "" for name in params["keep"]], params["keep_count"])
    leftovers = leftover_removals(root)
    removed_bytes = sum(tree_bytes(os.path.join(root, "revisions", name)) for name in planned["removed"])
    if not module.check_mode:
        remove_revisions(root, planned["removed"])
    verb = "would remove" if module.check_mode else "removed"
    kept = ", ".join(planned["kept"]) or "none"
    removed = ", ".join(planned["removed"])
    msg = f"{verb} old revisions {removed}; kept {kept}" if removed else f"kept {kept}"
    return {
        "changed": bool(planned["removed"] or leftovers),
        "removed": planned["removed"],
        "removed_bytes": removed_bytes,
        "revisions": planned["kept"] if not module.check_mode else list_revisions(root),
        "msg": msg,
    }


def _absent(module: AnsibleModule, root: str) -> dict:
    refusal = purge_refusal(root, module.params["protect"])
    if refusal:
        module.fail_json(
            msg=f"refusing to remove the model directory {root}: {refusal}. Nothing was deleted. Set"
            " deployment_model_dir to the checkpoint's own directory (the one holding revisions/),"
            " or remove what you no longer want by hand.",
            root=root,
        )
    doomed = os.path.join(os.path.dirname(root), f".{os.path.basename(root)}.removing")
    exists = os.path.lexists(root)
    if not (exists or os.path.lexists(doomed)):
        return {
            "changed": False,
            "revisions": [],
            "removed": [],
            "removed_bytes": 0,
            "msg": f"{root} is absent",
        }
    revisions = list_revisions(root) if exists else []
    removed_bytes = tree_bytes(root) if exists else 0
    if not module.check_mode:
        purge(root)
    verb = "would remove" if module.check_mode else "removed"
    return {
        "changed": True,
        # In check mode they are still there.
        "revisions": revisions if module.check_mode else [],
        "removed": revisions,
        "removed_bytes": removed_bytes,
        "msg": f"{verb} {root} (revisions: {', '.join(revisions) or 'none'})",
        "diff": {"before": {"path": root, "state": "directory"}, "after": {"path": root, "state": "absent"}},
    }


_STATES = {"present": _present, "sealed": _sealed, "pruned": _pruned, "absent": _absent}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "state": {"type": "str", "choices": list(_STATES), "default": "present"},
            "commit": {"type": "str"},
            "repo_id": {"type": "str"},
            "revision": {"type": "str", "default": ""},
            "deployed_record": {"type": "path"},
            "recipe": {"type": "str"},
            "token_file": {"type": "path"},
            "endpoint": {"type": "str", "default": ""},
            "adopt_as": {"type": "str"},
            "keep": {"type": "list", "elements": "str", "default": []},
            "keep_count": {"type": "int", "default": 2},
            "verified": {"type": "dict"},
            "verified_with": {"type": "dict", "default": {}},
            "protect": {"type": "list", "elements": "path", "default": []},
        },
        mutually_exclusive=[("commit", "repo_id")],
        required_if=[
            ("state", "present", ("commit", "repo_id"), True),
            ("state", "sealed", ("commit", "verified")),
        ],
        supports_check_mode=True,
    )
    root = os.path.abspath(module.params["root"])
    try:
        run_state = _STATES[module.params["state"]]
        result = run_state(module, root)
    except HubMissing as exc:
        module.fail_json(
            msg=f"{missing_required_lib('huggingface_hub')} ({exc}) The sparkserve.dsv41.checkpoint role runs"
            " this module with its download virtualenv's Python to resolve a revision."
        )
    except (RevisionError, DownloadError) as exc:
        module.fail_json(msg=str(exc), root=root)
    except OSError as exc:
        module.fail_json(msg=f"cannot change {exc.filename or root}: {exc.strerror or exc}", root=root)
    module.exit_json(root=root, **result)


if __name__ == "__main__":
    main()
