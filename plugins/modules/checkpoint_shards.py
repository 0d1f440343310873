#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Rebuild the split Engram shards of the checkpoint and verify it against its manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_shards
short_description: Rebuild split checkpoint shards and verify the checkpoint against its manifest
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Hugging Face caps files at 50 GB, so the large shards of the DeepSeek-V4.1-Flash checkpoint
    (C(model-00005-of-00006.safetensors) and C(model-00006-of-00006.safetensors)) are stored as
    C(<shard>.part00), C(<shard>.part01), ... This module rebuilds every manifest entry that exists
    only as parts, verifies every entry of the C(sha256sum)-format manifest, deletes the parts
    once their shard is verified, and checks the EXL3 bank layout.
  - A shard is rebuilt in one pass. The parts are read in numeric order (C(part10) after C(part9))
    and each chunk is hashed and written to a hidden temporary file C(.<shard>.sparkserve-tmp) in
    the same directory. The file is renamed into place only when its sha256 matches the manifest;
    on a mismatch the temporary file is removed and the parts are kept.
  - The other entries are hashed in parallel by O(workers) threads.
  - Each verified file's size, mtime_ns and sha256 are recorded in O(state_file). A later run
    trusts a file whose size and mtime_ns are unchanged without reading it, so re-running on a
    verified directory reads no data (RV(bytes_read) is 0) and reports no change.
  - Parts are deleted only after their shard is verified, and only when O(keep_parts=false). When
    a shard and its parts both exist (an earlier run with O(keep_parts=true)), the shard is verified
    (or trusted) and the parts are then deleted.
  - Before anything is written, the filesystem of each shard to rebuild must have as many free
    bytes as its parts hold (summed over the shards rebuilt there); otherwise the module fails and
    names the bytes needed and available.
  - An interrupted run is resumed by running again; a stale temporary file is discarded and shards
    already rebuilt are kept.
  - Only files listed in the manifest are verified; the EXL3 banks are checked for layout and file
    count, not hashed.
  - With O(adopt=true) the module only takes over a directory prepared by another tool (upstream
    C(download.sh) rebuilds, verifies and deletes the parts itself but keeps no record of ours); see
    O(adopt).
options:
  model_dir:
    description:
      - The checkpoint directory; holds the manifest, the shards or their parts and C(exl3/).
    type: path
    required: true
  manifest:
    description:
      - The checksum manifest, relative to O(model_dir). Lines are C(<sha256>  <file>) as written by
        C(sha256sum) (the binary marker C(<sha256> *<file>) is accepted too); blank lines are ignored
        and any other line fails the module with its line number.
    type: str
    default: sha256-manifest.txt
  keep_parts:
    description:
      - Keep the C(.partNN) files after their shard is rebuilt and verified (upstream C(KEEP_PARTS=1)).
    type: bool
    default: false
  workers:
    description:
      - Number of files hashed at the same time. hashlib releases the GIL on large buffers, so
        this scales with cores until the disk is the limit.
    type: int
    default: 4
  state_file:
    description:
      - Where the records of verified files are kept (JSON, written atomically).
      - Defaults to C(<model_dir>/.cache/sparkserve/verified.json). C(.cache/) is never copied to a
        worker, so a worker never inherits the head's records and verifies its own copy.
    type: path
  borrow_from:
    description:
      - Directories of other revisions of the checkpoint. A file of O(model_dir) that is the very same
        file as theirs (a hard link, see
        O(sparkserve.dsv41.checkpoint_download#module:link_from) and
        O(sparkserve.dsv41.checkpoint_copy#module:link_dest)) is trusted on their verification
        record, so a new revision re-reads only what changed (RV(borrowed)).
    type: list
    elements: path
    default: []
  verify_exl3:
    description:
      - Check the EXL3 layout under C(<model_dir>/exl3/) - every bank of O(exl3_banks) exists and
        holds at least one C(L??.part.safetensors), and the plan C(exl3/plan/<exl3_plan>) is valid
        JSON with a C(qdir) field - and count the files under C(exl3/).
    type: bool
    default: true
  exl3_banks:
    description:
      - EXL3 bank directories, relative to C(<model_dir>/exl3/).
    type: list
    elements: str
    default: [qn, q31, q31s]
  exl3_plan:
    description:
      - File name of the EXL3 plan in C(<model_dir>/exl3/plan/) (upstream C(PLAN_NAME)).
    type: str
    default: J268-ho-v31-K5n.json
  expect_exl3_file_count:
    description:
      - When set, fail unless C(exl3/) holds exactly this many files; pass the head's
        RV(exl3_file_count) when verifying a worker's copy. Requires O(verify_exl3=true).
      - Mutually exclusive with O(adopt=true).
    type: int
  adopt:
    description:
      - Adopt a directory prepared by another tool instead of rebuilding and verifying it. Every
        manifest entry present as a whole file and not yet trusted by O(state_file) is hashed (in
        parallel, with O(progress_file)), and recorded in O(state_file) when it matches. The download
        then skips the parts of the recorded shards instead of fetching them again.
      - Nothing is rebuilt, deleted or discarded, parts and stale temporary files included;
        O(keep_parts), O(verify_exl3), O(exl3_banks) and O(exl3_plan) are ignored.
      - Entries that are missing or exist only as parts are skipped, not an error. A whole file that
        does not match the manifest is not recorded (an earlier record of it is dropped), listed in
        RV(mismatched) and warned about, but does not fail the module; a run without O(adopt) fails
        on it.
      - When the manifest (or O(model_dir)) does not exist yet, nothing is adopted and nothing
        changes. Only a file that cannot be read or a state file that cannot be written fails.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - sparkserve.dsv41.progress
attributes:
  check_mode:
    support: full
    details: Reads no file data and writes nothing; reports the planned actions (see the notes).
  diff_mode:
    support: none
    details: The result lists per file what was (or would be) done; there is no text diff.
  platform:
    platforms: posix
notes:
  - The progress document (O(progress_file)) counts C(bytes) - C(done) and C(total) the bytes this
    run reads, C(detail) the file at hand.
  - Check mode reads no file data - hashing 462 GB is not a dry run - and writes or deletes
    nothing. It reports the planned actions (C(would_verify), C(would_rebuild)) and trusts files
    exactly as a real run would; RV(changed) is true when a real run would rebuild, delete, discard
    a temporary file or record a new verification.
  - Files are trusted on size and mtime_ns only. A change that keeps both (deliberate tampering with
    the timestamps) is not detected; delete O(state_file) to force a full verification.
  - Read and write hints (C(posix_fadvise), C(sync_file_range)) keep the page cache from filling
    with data that is read once, and flush rebuilt shards while later parts are still being read.
    The rebuilt shard is fsynced before it is renamed into place.
  - Do not run two instances on the same O(model_dir) at the same time.
  - With O(adopt=true), check mode reports C(would_adopt) for the files a real run would hash, and
    RV(changed) is true when there is any.
seealso:
  - name: sha256sum manual
    description: The manifest format.
    link: https://www.gnu.org/software/coreutils/manual/html_node/sha2-utilities.html
"""

EXAMPLES = r"""
- name: Rebuild shards 5 and 6 and verify the checkpoint on the head
  sparkserve.dsv41.checkpoint_shards:
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash-Spark
  register: head_checkpoint

- name: Same, in the background, keeping the parts, with a progress file to poll
  sparkserve.dsv41.checkpoint_shards:
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    keep_parts: true
    workers: 8
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint-progress.json
  async: 14400
  poll: 0
  register: checkpoint_job

- name: Record the shards of a directory prepared by download.sh, so that their parts are not downloaded again
  sparkserve.dsv41.checkpoint_shards:
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    adopt: true
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint-progress.json
  register: adopted_checkpoint

- name: Verify a worker's copy against the head
  sparkserve.dsv41.checkpoint_shards:
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    expect_exl3_file_count: "{{ hostvars[groups['head'][0]].head_checkpoint.exl3_file_count }}"
"""

RETURN = r"""
msg:
  description:
    - One line about the result - the shards that match, rebuilt, bytes read, EXL3 files, parts deleted.
    - With O(adopt), the shards recorded and those that do not match.
  returned: success
  type: str
  sample: 6 shards match the manifest (0 rebuilt, 0 B read), 2412 EXL3 files, 0 parts deleted
changed:
  description:
    - Whether a shard was rebuilt, parts or a temporary file deleted, or O(state_file) updated; in
      check mode, whether a real run would do any of that.
  returned: always
  type: bool
  sample: false
files:
  description: What was done (or, in check mode, would be done) for each manifest entry, in manifest order.
  returned: always
  type: list
  elements: dict
  contains:
    file:
      description: The manifest name, relative to O(model_dir).
      type: str
      sample: model-00005-of-00006.safetensors
    action:
      description:
        - C(trusted) (unchanged since verified; not read), C(verified) (hashed, matches),
          C(rebuilt) (concatenated from its parts, matches), C(failed) (see the error message).
        - In check mode C(would_verify) or C(would_rebuild) instead of C(verified) and C(rebuilt).
        - With O(adopt=true) C(trusted), C(adopted) (hashed, matches, recorded), C(mismatched) (hashed,
          does not match, not recorded), C(skipped) (no whole file, only parts or nothing; left
          alone) or C(failed); in check mode C(would_adopt) instead of C(adopted) and C(mismatched).
      type: str
      sample: rebuilt
    size:
      description: Size of the file in bytes.
      type: int
      sample: 53687091200
    sha256:
      description: The file's sha256 when known to match the manifest, else null.
      type: str
      sample: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    parts:
      description: The parts found next to the file, in order, relative to O(model_dir).
      type: list
      elements: str
      sample: [model-00005-of-00006.safetensors.part00, model-00005-of-00006.safetensors.part01]
    parts_deleted:
      description: Parts deleted (in check mode, parts that would be deleted).
      type: list
      elements: str
      sample: [model-00005-of-00006.safetensors.part00, model-00005-of-00006.safetensors.part01]
    temp_discarded:
      description: Whether a stale temporary file of an interrupted run was (would be) removed.
      type: bool
      sample: false
    bytes_read:
      description: Bytes read for this file.
      type: int
      sample: 53687091200
    bytes_written:
      description: Bytes written for this file.
      type: int
      sample: 53687091200
    seconds:
      description: Time spent on this file.
      type: float
      sample: 61.2
bytes_read:
  description: Bytes of checkpoint data read in total; 0 when every file was trusted.
  returned: always
  type: int
  sample: 0
bytes_written:
  description: Bytes written into rebuilt shards.
  returned: always
  type: int
  sample: 0
seconds:
  description: Wall-clock time of the module run.
  returned: always
  type: float
  sample: 0.02
shards:
  description: Manifest name -> sha256 of every entry known to match the manifest after this run.
  returned: always
  type: dict
  sample:
    model-00001-of-00006.safetensors: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
parts_deleted:
  description: Every part deleted (in check mode, that would be deleted), relative to O(model_dir).
  returned: always
  type: list
  elements: str
  sample: [model-00006-of-00006.safetensors.part00]
exl3_file_count:
  description:
    - Number of files under C(<model_dir>/exl3/), dot-files excluded.
    - Null when O(verify_exl3=false).
  returned: always
  type: int
  sample: 187
exl3_bank_files:
  description:
    - Bank name -> number of C(L??.part.safetensors) files in it.
    - Empty when O(verify_exl3=false).
  returned: always
  type: dict
  sample: {qn: 61, q31: 61, q31s: 61}
adopted:
  description: Manifest names hashed, found to match and recorded by this run; empty in check mode.
  returned: when O(adopt=true)
  type: list
  elements: str
  sample: [model-00001-of-00006.safetensors, model-00005-of-00006.safetensors]
mismatched:
  description: Whole files that do not match the manifest and were not recorded (nor deleted).
  returned: when O(adopt=true)
  type: list
  elements: dict
  contains:
    file:
      description: The manifest name, relative to O(model_dir).
      type: str
      sample: model-00002-of-00006.safetensors
    expected:
      description: The sha256 the manifest lists.
      type: str
      sample: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
    actual:
      description: The sha256 of the file.
      type: str
      sample: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
borrowed:
  description: The files trusted on another revision's record (O(borrow_from)); none with O(adopt=true).
  returned: always
  type: list
  elements: str
  sample: [model-00001-of-00006.safetensors]
state_file:
  description: Path of the state file with the verification records.
  returned: always
  type: str
  sample: /home/spark/models/DeepSeek-V4.1-Flash-Spark/.cache/sparkserve/verified.json
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._adoption import (
    adopt_checkpoint,
    adoption_message,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._checkpoint import (
    DEFAULT_MANIFEST,
    CheckpointError,
    apply_plan,
    borrow_records,
    check_exl3,
    check_free_space,
    default_state_file,
    load_state,
    plan_actions,
    read_manifest,
    scan_checkpoint,
    verification_message,
)


def adopt(module: AnsibleModule, model_dir: str, state_file: str, result: dict, started: float) -> None:
    """The O(adopt=true) run: record what another tool verified; exits the module."""
    params = module.params
    if os.path.lexists(model_dir) and not os.path.isdir(model_dir):
        module.fail_json(msg=f"model_dir {model_dir} is not a directory", **result)
    try:
        report, warnings, errors = adopt_checkpoint(
            model_dir,
            state_file,
            params["manifest"],
            check_mode=module.check_mode,
            workers=params["workers"],
            progress_file=params["progress_file"],
        )
    except CheckpointError as exc:
        module.fail_json(msg=str(exc), **result)
    except OSError as exc:
        module.fail_json(msg=f"cannot inspect {exc.filename or model_dir}: {exc.strerror or exc}", **result)
    for warning in warnings:
        module.warn(warning)
    result.update(report)
    result["seconds"] = round(time.monotonic() - started, 3)
    if errors:
        module.fail_json(msg=" ".join(errors), **result)
    result.setdefault("msg", adoption_message(result))
    module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "manifest": {"type": "str", "default": DEFAULT_MANIFEST},
            "keep_parts": {"type": "bool", "default": False},
            "workers": {"type": "int", "default": 4},
            "state_file": {"type": "path"},
            "borrow_from": {"type": "list", "elements": "path", "default": []},
            "progress_file": {"type": "path"},
            "verify_exl3": {"type": "bool", "default": True},
            "exl3_banks": {"type": "list", "elements": "str", "default": ["qn", "q31", "q31s"]},
            "exl3_plan": {"type": "str", "default": "J268-ho-v31-K5n.json"},
            "expect_exl3_file_count": {"type": "int"},
            "adopt": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    started = time.monotonic()
    params = module.params
    model_dir = os.path.abspath(params["model_dir"])
    state_file = params["state_file"] or default_state_file(model_dir)
    result: dict = {
        "changed": False,
        "state_file": state_file,
        "borrowed": [],
        "files": [],
        "bytes_read": 0,
        "bytes_written": 0,
        "seconds": 0.0,
        "shards": {},
        "parts_deleted": [],
        "exl3_file_count": None,
        "exl3_bank_files": {},
    }
    if params["workers"] < 1:
        module.fail_json(msg=f"workers must be at least 1, got {params['workers']}", **result)
    if params["adopt"] and params["expect_exl3_file_count"] is not None:
        module.fail_json(
            msg="expect_exl3_file_count cannot be used with adopt=true, which checks no EXL3", **result
        )
    if params["expect_exl3_file_count"] is not None and not params["verify_exl3"]:
        module.fail_json(msg="expect_exl3_file_count needs verify_exl3=true", **result)
    if params["adopt"]:
        adopt(module, model_dir, state_file, result, started)
    if not os.path.isdir(model_dir):
        module.fail_json(
            msg=f"model_dir {model_dir} is not a directory; download the checkpoint first.", **result
        )

    # Plan from metadata only; the EXL3 layout and free space are checked before any write.
    try:
        manifest = read_manifest(model_dir, params["manifest"])
        found = scan_checkpoint(model_dir, manifest)
        records, warning = load_state(state_file, model_dir)
        if warning:
            module.warn(warning)
        result["borrowed"] = borrow_records(model_dir, manifest, records, params["borrow_from"])
        actions = plan_actions(manifest, found, records, params["keep_parts"])
        if params["verify_exl3"]:
            exl3 = check_exl3(
                model_dir,
                banks=params["exl3_banks"],
                plan_name=params["exl3_plan"],
                expect_file_count=params["expect_exl3_file_count"],
            )
            result.update(exl3_file_count=exl3["file_count"], exl3_bank_files=exl3["bank_files"])
        check_free_space(actions)
    except CheckpointError as exc:
        module.fail_json(msg=str(exc), **result)
    except OSError as exc:
        module.fail_json(msg=f"cannot inspect {exc.filename or model_dir}: {exc.strerror or exc}", **result)

    report, errors = apply_plan(
        actions,
        model_dir,
        records,
        state_file,
        check_mode=module.check_mode,
        workers=params["workers"],
        progress_file=params["progress_file"],
    )
    result.update(report)
    result["seconds"] = round(time.monotonic() - started, 3)
    if errors:
        module.fail_json(msg=" ".join(errors), **result)
    module.exit_json(msg=verification_message(result), **result)


if __name__ == "__main__":
    main()
