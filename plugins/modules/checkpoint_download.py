#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: download the checkpoint from a Hugging Face hub, resumably."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_download
short_description: Download a checkpoint from a Hugging Face hub into a directory, resumably
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Downloads every file of a Hugging Face model repo at a revision into O(model_dir) with
    C(huggingface_hub.snapshot_download), which fetches only what is missing or changed and keeps
    its metadata in C(<model_dir>/.cache/huggingface/).
  - The parts (C(<shard>.partNN)) of the shards that M(sparkserve.dsv41.checkpoint_shards) already
    rebuilt and verified, and that are unchanged since (its O(state_file)), are not fetched again.
    The rebuild deletes the parts, and a re-run must not bring them back (~197 GB for
    DeepSeek-V4.1-Flash).
  - C(changed) is true when the file listing of O(model_dir) (C(.cache/) aside) differs after the
    download, so a re-run on a complete directory reports no change.
  - A download killed mid-file (a reboot, a kill) leaves partial files that C(huggingface_hub)
    never resumes (each attempt writes a file of its own). They are removed first, unless a process
    still writes them (RV(partials_removed)); the files completed before the kill are kept.
  - Needs C(huggingface_hub) in the Python that runs the module. The C(sparkserve.dsv41.checkpoint)
    role installs it in a virtualenv of its own and runs this module with that virtualenv's Python
    (C(ansible_python_interpreter) on the task).
  - Meant to run with C(async) and O(progress_file); the M(sparkserve.dsv41.job_wait) module shows its
    progress.
options:
  repo_id:
    description: The model repo, C(<owner>/<name>).
    type: str
    required: true
  revision:
    description: A branch, tag or commit to download. Empty - C(main).
    type: str
    default: ""
  model_dir:
    description: The directory to download into; created when missing.
    type: path
    required: true
  workers:
    description: Files downloaded at the same time.
    type: int
    default: 8
  link_from:
    description:
      - Directories of other revisions of the checkpoint (the one serving first). Each file they hold
        unchanged (same size, and the same etag in C(huggingface_hub)'s metadata) is hard-linked into
        O(model_dir) before the download, which then only asks the hub about it; the rebuilt shards
        too, when the manifest is unchanged and their verification vouches for them. A new revision
        then fetches only what changed (RV(linked)).
    type: list
    elements: path
    default: []
  manifest_from_hub:
    description:
      - For a checkpoint that ships no manifest, write one as C(<model_dir>/<manifest_from_hub>) - a
        C(sha256sum)-format line for every file the hub keeps in LFS, whose sha256 the hub lists - for
        M(sparkserve.dsv41.checkpoint_shards) to verify the download and each worker's copy against.
        Written only when it differs (RV(manifest_written)); empty writes none.
    type: str
    default: ""
  state_file:
    description:
      - The verification records of M(sparkserve.dsv41.checkpoint_shards), read to find the shards
        whose parts are not needed. Defaults to C(<model_dir>/.cache/sparkserve/verified.json), that
        module's default.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - sparkserve.dsv41.progress
  - sparkserve.dsv41.hub
attributes:
  check_mode:
    support: full
    details: Asks the hub for its file list (read only) and reports what would be fetched; writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The progress document (O(progress_file)) counts C(bytes) - C(done) and C(total) the bytes this
    run fetches.
  - When the hub cannot list the repo (offline, a refused token) but O(model_dir) already holds the
    files, C(huggingface_hub) keeps them and the module succeeds with a warning in RV(msg) and
    RV(listing_error).
  - An interrupted download resumes per file on the next run; a file being fetched when the job
    was stopped is fetched again from its start.
  - In check mode a file is reported in RV(would_download) when it is absent or its size differs
    from the hub's; a real run may also refresh a file of the same size whose content changed.
requirements:
  - huggingface_hub (in the Python that runs the module)
seealso:
  - module: sparkserve.dsv41.checkpoint_shards
  - module: sparkserve.dsv41.job_wait
  - name: huggingface_hub download guide
    description: How C(snapshot_download) works.
    link: https://huggingface.co/docs/huggingface_hub/guides/download
"""

EXAMPLES = r"""
- name: Download the checkpoint in the background, with the download virtualenv's Python
  sparkserve.dsv41.checkpoint_download:
    repo_id: 0xSero/DeepSeek-V4.1-Flash-Spark
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    token_file: /home/spark/.dsv41-two-sparks/hf-token
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint/download-progress.json
  vars:
    ansible_python_interpreter: /home/spark/.dsv41-two-sparks/hf-venv/bin/python
  async: 86400
  poll: 0
  register: download_job

- name: Download a pinned revision from a local hub mirror
  sparkserve.dsv41.checkpoint_download:
    repo_id: 0xSero/DeepSeek-V4.1-Flash-Spark
    revision: 0123456789abcdef0123456789abcdef01234567
    model_dir: /srv/models/DeepSeek-V4.1-Flash-Spark
    endpoint: http://hub.lan:5080
  environment:
    HF_HUB_DISABLE_XET: "1"
"""

RETURN = r"""
partials_removed:
  description:
    - Partial downloads (C(.incomplete) files under C(.cache/huggingface/download)) that no process was
      writing - left by a download that was killed - removed before downloading (check mode - would be).
  returned: success
  type: int
  sample: 0
repo_id:
  description: The repo downloaded.
  returned: always
  type: str
  sample: 0xSero/DeepSeek-V4.1-Flash-Spark
revision:
  description: The revision downloaded (C(main) when none was given).
  returned: always
  type: str
  sample: main
model_dir:
  description: The directory, absolute.
  returned: always
  type: str
  sample: /home/spark/models/DeepSeek-V4.1-Flash-Spark
manifest_written:
  description: Whether O(manifest_from_hub) was (or in check mode would be) written.
  returned: when O(manifest_from_hub) is set
  type: bool
ignore_patterns:
  description: The parts not fetched, because their shard is rebuilt and verified.
  returned: always
  type: list
  elements: str
  sample: [model-00005-of-00006.safetensors.part*, model-00006-of-00006.safetensors.part*]
files_total:
  description: Files of the repo the download covers (ignored parts aside); 0 when the hub did not list them.
  returned: always
  type: int
  sample: 214
bytes_total:
  description: Their bytes; null when the hub did not list them.
  returned: always
  type: int
  sample: 265214312448
added:
  description: Files that were not there before.
  returned: success, not in check mode
  type: list
  elements: str
  sample: [config.json]
updated:
  description: Files whose size or mtime changed.
  returned: success, not in check mode
  type: list
  elements: str
  sample: []
bytes_downloaded:
  description: Bytes of the added and updated files.
  returned: success, not in check mode
  type: int
  sample: 1024
linked:
  description: The files hard-linked from O(link_from) instead of downloaded (none in check mode).
  returned: always
  type: list
  elements: str
  sample: [config.json, model-00001-of-00006.safetensors]
would_download:
  description: The files a download would fetch (absent, or of another size than the hub's).
  returned: check mode
  type: list
  elements: str
  sample: [model-00001-of-00006.safetensors]
seconds:
  description: Time the module took.
  returned: always
  type: float
  sample: 3601.5
listing_error:
  description: Why the hub did not list the repo (the download then kept the local files), or null.
  returned: always
  type: str
  sample: "RepositoryNotFoundError: 401 Client Error."
msg:
  description: One line saying what was (or would be) downloaded.
  returned: always
  type: str
  sample: downloaded 3 files (12.4 GiB) of 0xSero/DeepSeek-V4.1-Flash-Spark into /home/spark/models/M
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.sparkserve.dsv41.plugins.module_utils._download import (
    DownloadError,
    HubClient,
    HubMissing,
    check_download,
    hub_environment,
    ignore_patterns,
    link_revision,
    plan_hub_manifest,
    read_token,
    run_download,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import write_atomically
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "default": ""},
            "model_dir": {"type": "path", "required": True},
            "token_file": {"type": "path"},
            "endpoint": {"type": "str", "default": ""},
            "workers": {"type": "int", "default": 8},
            "state_file": {"type": "path"},
            "progress_file": {"type": "path"},
            "link_from": {"type": "list", "elements": "path", "default": []},
            "manifest_from_hub": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    started = time.monotonic()
    params = module.params
    model_dir = os.path.abspath(params["model_dir"])
    revision = params["revision"] or None
    result = {
        "changed": False,
        "repo_id": params["repo_id"],
        "revision": revision or "main",
        "model_dir": model_dir,
        "ignore_patterns": [],
        "linked": [],
        "files_total": 0,
        "bytes_total": None,
        "seconds": 0.0,
        "listing_error": None,
    }
    if params["workers"] < 1:
        module.fail_json(msg=f"workers must be at least 1, got {params['workers']}", **result)
    try:
        token = read_token(params["token_file"])
        if token:
            module.no_log_values.add(token)
        endpoint = hub_environment(os.environ, params["endpoint"])
        hub = HubClient(endpoint, token)
        if params["link_from"] and not module.check_mode:
            result["linked"] = link_revision(hub, params["repo_id"], revision, model_dir, params["link_from"])
        result["ignore_patterns"] = patterns = ignore_patterns(
            model_dir, params["state_file"], borrow_from=params["link_from"]
        )
        if module.check_mode:
            report = check_download(
                hub, repo_id=params["repo_id"], revision=revision, model_dir=model_dir, patterns=patterns
            )
        else:
            os.makedirs(model_dir, exist_ok=True)
            progress = ProgressWriter(params["progress_file"], "download")
            report = run_download(
                hub,
                repo_id=params["repo_id"],
                revision=revision,
                model_dir=model_dir,
                patterns=patterns,
                workers=params["workers"],
                progress=progress,
            )
        if params["manifest_from_hub"]:
            manifest = plan_hub_manifest(
                hub, params["repo_id"], revision, model_dir, params["manifest_from_hub"]
            )
            result["manifest_written"] = manifest is not None
            if manifest is not None and not module.check_mode:
                write_atomically(
                    module, os.path.join(model_dir, params["manifest_from_hub"]), manifest.encode(), 0o644
                )
    except HubMissing as exc:
        module.fail_json(
            msg=f"{missing_required_lib('huggingface_hub')} ({exc}) The sparkserve.dsv41.checkpoint role "
            "installs it in its own virtualenv and runs this module with that virtualenv's Python.",
            **result,
        )
    except DownloadError as exc:
        result.update(
            changed=exc.changed or bool(result["linked"]), seconds=round(time.monotonic() - started, 3)
        )
        module.fail_json(msg=str(exc), **result)
    except OSError as exc:
        module.fail_json(msg=f"cannot create {exc.filename or model_dir}: {exc.strerror or exc}", **result)
    manifest_written = result.get("manifest_written", False)
    result.update(report)
    # Files linked in from another revision are a change the download itself did not see.
    result["changed"] = result["changed"] or manifest_written or bool(result["linked"])
    if result["linked"]:
        result["msg"] = (
            f"linked {len(result['linked'])} unchanged files from another revision; {result['msg']}"
        )
    result["seconds"] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
