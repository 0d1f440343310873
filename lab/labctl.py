#!/usr/bin/env python3
"""The lab: two (or more) simulated DGX Sparks on one machine.

Everything here is real except the three stand-ins kept under ``lab/standins/``: the RDMA
sysfs tree, the serving engine and the Hugging Face hub. The nodes are Debian containers with
systemd as PID 1, their own Docker engine and SSH; they are joined by a management network and
two fabric networks whose interfaces carry the Spark's names. A real OCI registry serves the
stand-in engine image by digest.

    python3 lab/labctl.py up      # build what is missing, start everything (idempotent)
    python3 lab/labctl.py down    # remove every container, network, volume and process of it
    python3 lab/labctl.py status  # what runs

Two labs can run side by side on one machine (CI runs the real engine's beside the stand-in's):
SPARKSERVE_LAB_INSTANCE numbers them (0, the lab of inventory/lab, unless set), and everything of
one lab follows from its number: its networks' subnets, its containers' and volumes' names (the
nodes' hostnames stay head, worker...), its services' ports and its state directory. Each command
acts on its own lab only.

Only the standard library: this runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "lab" / "standins"
# Every lab's state lives here; what outlives one lab (the vLLM wheels, the suites' results) too.
LAB_ROOT = Path(os.environ.get("SPARKSERVE_LAB_STATE", REPO / ".lab"))
LABEL = "sparkserve.lab"
INSTANCE_LABEL = "sparkserve.lab.instance"
INSTANCES = range(10)  # the subnets and ports below leave room for ten
SUITE = "bookworm"
MIRROR = os.environ.get("SPARKSERVE_LAB_MIRROR", "http://deb.debian.org/debian")


def lab_instance() -> int:
    value = os.environ.get("SPARKSERVE_LAB_INSTANCE", "0")
    if not value.isdigit() or int(value) not in INSTANCES:
        sys.exit(f"[lab] error: SPARKSERVE_LAB_INSTANCE={value!r}: a number from 0 to {INSTANCES[-1]}")
    return int(value)


INSTANCE = lab_instance()
STATE = LAB_ROOT / f"instance-{INSTANCE}" if INSTANCE else LAB_ROOT
PREFIX = f"lab{INSTANCE}-" if INSTANCE else ""  # of the containers, volumes and networks
MGMT = (f"{PREFIX}sparkserve-mgmt", f"198.19.{INSTANCE}.0/24", f"198.19.{INSTANCE}.1")
# The cabled QSFP port shows up as two PCIe halves: one subnet per half (lab n: 198.18.2n, 2n+1).
FABRICS = tuple(
    (f"{PREFIX}sparkserve-fabric{half}", f"198.18.{octet}.0/24", f"198.18.{octet}.1", ifname, hca)
    for half, ifname, hca in ((0, "enp1s0f1np1", "rocep1s0f1"), (1, "enP2p1s0f1np1", "roceP2p1s0f1"))
    for octet in [2 * INSTANCE + half]
)
# The Spark's other port is not cabled: its devices exist but stay DOWN.
UNCABLED = (("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0"))
MGMT_IFNAME = "wlP9s9"  # a decoy that holds IPv4, as Wi-Fi does on a real Spark
FABRIC_MTU = 9000
PORT_OFFSET = 100 * INSTANCE
REGISTRY_PORT = 5000 + PORT_OFFSET
HUB_PORT = 5080 + PORT_OFFSET
WHEELS_PORT = 5081 + PORT_OFFSET
# The lab's Prometheus (Debian's package), on this machine's loopback: it scrapes the head's API
# gateway as an owner's Prometheus would, with the API key from PROMETHEUS_KEY_FILE.
PROMETHEUS_PORT = 9390 + PORT_OFFSET
PROMETHEUS_DIR = STATE / "prometheus"
PROMETHEUS_KEY_FILE = PROMETHEUS_DIR / "api_key"  # the tests write the deployment's key here
# The registry's storage is a cache, as Docker's image store is: it outlives `down` (and a fresh
# clone), so the real engine's 2.6 GB image is not pushed again by every `up --vllm`. Each `up`
# still pushes, and the nodes pull by the digest that push returns. One storage per lab: two
# registries never write the same files.
_REGISTRY_CACHE = Path(
    os.environ.get(
        "SPARKSERVE_LAB_REGISTRY",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkserve-lab" / "registry",
    )
)
REGISTRY_STORAGE = (
    _REGISTRY_CACHE.with_name(f"{_REGISTRY_CACHE.name}-{INSTANCE}") if INSTANCE else _REGISTRY_CACHE
)
API_PORT = 8000  # the inventories' deployment_api_port
HUB_REPO = "0xSero/DeepSeek-V4.1-Flash-Spark"
# The real engine's lab serves this tiny model (lab/vllm/make_tiny_model.py), trained when it is built.
VLLM_MODEL_REPO = "sparkserve-lab/tiny-chat"
ENGINE_REPO = "sparkserve-lab/vllm-standin"
LAB_USER = "spark"
# The lab's services listen on every address: the nodes reach them through the network gateways,
# this machine over loopback (which Docker trusts for a registry without TLS).
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - see above
SYSFS_ROOT = "/opt/sparkserve-lab/sysfs"


@dataclass(frozen=True)
class Node:
    name: str  # the hostname and the inventory's name
    host_octet: int
    gid_index: int

    @property
    def container(self) -> str:
        return PREFIX + self.name

    def address(self, subnet_gateway: str) -> str:
        return subnet_gateway.rsplit(".", 1)[0] + f".{self.host_octet}"


def nodes_for(workers: int) -> list[Node]:
    nodes = [Node("head", 13, 3), Node("worker", 11, 3)]
    nodes += [Node(f"worker{i}", 10 + 10 * i + 1, 3) for i in range(2, workers + 1)]
    return nodes


# python3-apt as on DGX OS (Ubuntu installs it): Ansible's apt module needs it in check mode.
NODE_PACKAGES = (
    "python3,python3-apt,python3-venv,python3-requests,python3-prometheus-client,"
    "openssh-server,rsync,sudo,iproute2,iputils-ping,curl,procps,"
    "systemd,systemd-sysv,dbus,docker.io,ca-certificates,less,haproxy,nftables"
)
ENGINE_BASE_PACKAGES = "python3"

# Applied inside the node rootfs before import; part of the image recipe hash.
NODE_SETUP = f"""
set -eu
rm -f /etc/ssh/ssh_host_*
cat > /etc/systemd/system/lab-ssh-hostkeys.service <<'EOF'
[Unit]
Description=Generate this node's own SSH host keys (the image ships none)
Before=ssh.service
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/lab-ssh-hostkeys.service \
  /etc/systemd/system/multi-user.target.wants/lab-ssh-hostkeys.service
printf 'PasswordAuthentication no\\nPermitRootLogin prohibit-password\\n' \
  > /etc/ssh/sshd_config.d/lab.conf
mkdir -p /etc/docker
# Every lab's registry, on its first fabric network's gateway.
printf '{{"insecure-registries": ["198.18.0.0/16"]}}\\n' > /etc/docker/daemon.json
useradd --create-home --shell /bin/bash --groups docker,sudo {LAB_USER}
echo '{LAB_USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{LAB_USER}
chmod 0440 /etc/sudoers.d/{LAB_USER}
for unit in getty@tty1.service console-getty.service systemd-udevd.service \
            systemd-udev-trigger.service systemd-firstboot.service; do
  ln -sf /dev/null /etc/systemd/system/$unit
done
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


class LabError(RuntimeError):
    """A step of the lab failed; the message says which and what to do."""


def log(message: str) -> None:
    print(f"[lab] {message}", flush=True)


def run(
    argv: list[str], *, check: bool = True, capture: bool = True, **kwargs
) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, check=False, text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip() if capture else ""
        raise LabError(f"{' '.join(argv)} failed ({result.returncode}): {detail}")
    return result


def docker(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return run(["docker", *args], check=check, **kwargs)


def docker_ok(*args: str) -> bool:
    return docker(*args, check=False).returncode == 0


# --- the machine's own Docker engine -------------------------------------------------------


POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def apt_install(*packages: str, recommends: bool = True, start_services: bool = True) -> None:
    missing = [
        p
        for p in packages
        if run(["dpkg-query", "-W", "-f=${Status}", p], check=False).stdout != "install ok installed"
    ]
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"missing packages {missing}: run as root or install them first")
    log(f"installing {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    extra = [] if recommends else ["--no-install-recommends"]
    # A package's own service (Debian's prometheus.service on every interface) is not the lab's:
    # policy-rc.d's "101" keeps it from starting, as Debian's container images do.
    blocked = not start_services and not POLICY_RC_D.exists()
    if blocked:
        POLICY_RC_D.write_text("#!/bin/sh\n# sparkserve lab: no service starts while it installs\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        run(["apt-get", "install", "-y", "-qq", *extra, *missing], env=env)
    finally:
        if blocked:
            POLICY_RC_D.unlink()


# What this machine needs to reach the nodes the way a controller does (SSH), and what the unit
# tests of checkpoint_copy run for real (rsync).
# haproxy: the unit tests run the API gateway's configuration in the real HAProxy.
CONTROLLER_PACKAGES = ("openssh-client", "rsync", "haproxy")


def ensure_controller_tools() -> None:
    """What this machine runs for the lab, installed before any lab starts: apt takes one install at
    a time, and two labs may start side by side."""
    apt_install(*CONTROLLER_PACKAGES, "docker-registry")
    apt_install("prometheus", recommends=False, start_services=False)  # not its node exporter


def ensure_engine() -> None:
    """Start a Docker engine on this machine unless one answers already."""
    if docker_ok("info"):
        return
    if not shutil.which("dockerd"):
        apt_install("docker.io")
    log("starting dockerd (this machine runs no service manager)")
    STATE.mkdir(parents=True, exist_ok=True)
    with open("/var/log/sparkserve-lab-dockerd.log", "ab") as out:
        subprocess.Popen(
            ["dockerd"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    for _ in range(60):
        if docker_ok("info"):
            return
        time.sleep(1)
    raise LabError("dockerd did not answer within 60 s: see /var/log/sparkserve-lab-dockerd.log")


# --- images ------------------------------------------------------------------------------------


def recipe_hash(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def image_exists(ref: str) -> bool:
    return docker_ok("image", "inspect", ref)


def build_rootfs_image(ref: str, packages: str, setup: str, cmd: str) -> None:
    if image_exists(ref):
        log(f"image {ref} is up to date")
        return
    apt_install("debootstrap")
    workdir = Path(tempfile.mkdtemp(prefix="rootfs-", dir="/var/tmp"))
    try:
        log(f"debootstrap {SUITE} for {ref} (about 1-2 minutes)")
        run(["debootstrap", "--variant=minbase", f"--include={packages}", SUITE, str(workdir), MIRROR])
        if setup:
            run(["chroot", str(workdir), "/bin/sh", "-c", setup])
        tar = subprocess.Popen(["tar", "-C", str(workdir), "-c", "."], stdout=subprocess.PIPE)
        changes = [
            "-c",
            f"CMD {json.dumps(cmd.split())}",
            "-c",
            "ENV container=docker",
            "-c",
            f"LABEL {LABEL}=image",
        ]
        run(["docker", "import", *changes, "-", ref], stdin=tar.stdout)
        if tar.wait() != 0:
            raise LabError("tar of the rootfs failed")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def node_image() -> str:
    ref = f"sparkserve-lab/node:{recipe_hash(SUITE, NODE_PACKAGES, NODE_SETUP)}"
    build_rootfs_image(ref, NODE_PACKAGES, NODE_SETUP, "/lib/systemd/systemd")
    return ref


def engine_image() -> str:
    base = f"sparkserve-lab/pybase:{recipe_hash(SUITE, ENGINE_BASE_PACKAGES)}"
    build_rootfs_image(base, ENGINE_BASE_PACKAGES, "apt-get clean; rm -rf /var/lib/apt/lists/*", "python3")
    context = STANDINS / "engine"
    files = sorted(p for p in context.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    ref = f"{ENGINE_REPO}:{recipe_hash(base, *(p.read_bytes() for p in files))}"
    if image_exists(ref):
        log(f"image {ref} is up to date")
    else:
        log(f"building {ref}")
        docker(
            "build",
            "--quiet",
            "--build-arg",
            f"BASE={base}",
            "--label",
            f"{LABEL}=image",
            "-t",
            ref,
            str(context),
        )
    return ref


def build_images() -> tuple[str, str]:
    """The node's and the engine's images, built where missing: (node, engine)."""
    ensure_engine()
    return node_image(), engine_image()


# --- background processes on this machine (registry, hub) ----------------------------------


def pid_alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def start_process(name: str, argv: list[str], ready_url: str, headers: dict[str, str] | None = None) -> None:
    pidfile = STATE / f"{name}.pid"
    if pid_alive(pidfile) and http_status(ready_url, headers) == 200:
        return
    stop_process(name)
    log(f"starting {name}")
    with open(STATE / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    for _ in range(60):
        if http_status(ready_url, headers) == 200:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise LabError(f"{name} did not come up: see {STATE / (name + '.log')}")


def stop_process(name: str) -> None:
    pidfile = STATE / f"{name}.pid"
    if pid_alive(pidfile):
        pid = int(pidfile.read_text())
        os.killpg(pid, signal.SIGTERM)
        for _ in range(50):
            if not pid_alive(pidfile):
                break
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - lab URLs only
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def start_registry() -> None:
    REGISTRY_STORAGE.mkdir(parents=True, exist_ok=True)
    config = STATE / "registry.yml"
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "storage": {
                    "filesystem": {"rootdirectory": str(REGISTRY_STORAGE)},
                    "delete": {"enabled": True},
                },
                "http": {"addr": f"{ALL_INTERFACES}:{REGISTRY_PORT}"},
            }
        )
    )
    start_process(
        "registry", ["docker-registry", "serve", str(config)], f"http://127.0.0.1:{REGISTRY_PORT}/v2/"
    )


def push_image(ref: str, repository: str = ENGINE_REPO) -> str:
    """Push an image to the lab registry as ``repository`` and return its digest."""
    local = f"127.0.0.1:{REGISTRY_PORT}/{repository}:lab"
    docker("tag", ref, local)
    docker("push", "--quiet", local)
    repo_digests = json.loads(docker("image", "inspect", "--format", "{{json .RepoDigests}}", local).stdout)
    for entry in repo_digests:
        if entry.startswith(f"127.0.0.1:{REGISTRY_PORT}/{repository}@"):
            return entry.split("@", 1)[1]
    raise LabError(f"no registry digest for {local}: {repo_digests}")


def hub_token() -> str:
    path = STATE / "hub-token"
    if not path.exists():
        path.write_text("hf_lab_" + hashlib.sha256(os.urandom(32)).hexdigest()[:32])
        path.chmod(0o600)
    return path.read_text().strip()


def fill_once(directory: Path, recipe: str, message: str, argv: list[str]) -> None:
    """Fill ``directory`` by running ``argv`` unless it was already filled for this ``recipe``.

    The stamp is written last, so an interrupted fill starts over instead of being trusted.
    """
    stamp = directory / f".filled-{recipe}"
    if stamp.exists():
        return
    shutil.rmtree(directory, ignore_errors=True)
    log(message)
    run(argv)
    directory.mkdir(parents=True, exist_ok=True)
    stamp.touch()


def start_hub(size_mb: int) -> None:
    """Serve the synthetic DeepSeek checkpoint (and whatever else `up` published) as hub repos."""
    root = STATE / "hub"
    repo_dir = root / HUB_REPO
    fill_once(
        repo_dir,
        f"generated-{size_mb}mb",
        f"generating the synthetic checkpoint ({size_mb} MB)",
        [
            sys.executable,
            str(STANDINS / "hub" / "make_checkpoint.py"),
            "--out",
            str(repo_dir),
            "--size-mb",
            str(size_mb),
        ],
    )
    token = hub_token()
    start_process(
        "hub",
        [
            sys.executable,
            str(STANDINS / "hub" / "hf_hub_standin.py"),
            "--root",
            str(root),
            "--host",
            ALL_INTERFACES,
            "--port",
            str(HUB_PORT),
            "--token-file",
            str(STATE / "hub-token"),
            "--access-log",
            str(STATE / "hub-access.log"),
        ],
        f"http://127.0.0.1:{HUB_PORT}/api/models/{HUB_REPO}",
        headers={"Authorization": f"Bearer {token}"},
    )


def prometheus_config(head_address: str, nodes: list[str]) -> dict:
    """Scrape vLLM's /metrics and the pair's own endpoints through the head's gateway, with the key."""
    gateway = f"{head_address}:{API_PORT}"
    authorization = {"type": "Bearer", "credentials_file": str(PROMETHEUS_KEY_FILE)}

    def job(name: str, path: str, targets: list[dict]) -> dict:
        return {
            "job_name": name,
            "metrics_path": path,
            "authorization": authorization,
            "static_configs": targets,
        }

    guards = job(
        "dsv41-memguard",
        "/metrics/memguard",
        [{"targets": [gateway], "labels": {"node": node}} for node in nodes],
    )
    # One target per node, all through the gateway: the node's name picks the path.
    guards["relabel_configs"] = [
        {"source_labels": ["node"], "target_label": "__metrics_path__", "replacement": "/metrics/memguard/$1"}
    ]
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
        "scrape_configs": [
            job("vllm", "/metrics", [{"targets": [gateway]}]),
            job("dsv41-supervisor", "/metrics/supervisor", [{"targets": [gateway]}]),
            guards,
        ],
    }


def start_prometheus(nodes: list[Node]) -> None:
    PROMETHEUS_DIR.mkdir(parents=True, exist_ok=True)
    config = PROMETHEUS_DIR / "prometheus.yml"
    # JSON is YAML; Prometheus reads the key file at every scrape, so it may come later.
    config.write_text(
        json.dumps(prometheus_config(nodes[0].address(MGMT[2]), [n.name for n in nodes]), indent=1)
    )
    start_process(
        "prometheus",
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={PROMETHEUS_DIR / 'data'}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
        ],
        f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready",
    )


def start_wheels() -> None:
    """Serve huggingface_hub's wheels to the nodes, which reach no package index themselves."""
    wheels = STATE / "wheels"
    pin = next(
        line
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.startswith("huggingface_hub==")
    )
    fill_once(
        wheels,
        pin,
        f"downloading the wheels of {pin} for the nodes",
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            str(wheels),
            pin,
        ],
    )
    start_process(
        "wheels",
        [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            ALL_INTERFACES,
            "--directory",
            str(wheels),
            str(WHEELS_PORT),
        ],
        f"http://127.0.0.1:{WHEELS_PORT}/",
    )


# --- networks and nodes -------------------------------------------------------------------------


def ensure_network(name: str, subnet: str, gateway: str, mtu: int | None = None) -> None:
    if docker_ok("network", "inspect", name):
        return
    args = [
        "network",
        "create",
        "--driver",
        "bridge",
        "--subnet",
        subnet,
        "--gateway",
        gateway,
        "--label",
        f"{LABEL}=network",
        "--label",
        f"{INSTANCE_LABEL}={INSTANCE}",
    ]
    if mtu:
        args += ["--opt", f"com.docker.network.driver.mtu={mtu}"]
    docker(*args, name)


def ssh_keypair() -> Path:
    key = STATE / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkserve-lab", "-f", str(key)])
    return key


def node_exec(node: str, script: str, *, user: str = "root") -> str:
    return docker("exec", "--user", user, node, "/bin/sh", "-c", script).stdout


def create_node(node: Node, image: str) -> None:
    state = docker("inspect", "--format", "{{.State.Running}} {{.Config.Image}}", node.container, check=False)
    if state.returncode == 0:
        running, current_image = state.stdout.split()
        if current_image == image and running == "true":
            return
        if current_image != image:
            raise LabError(
                f"container {node.container} runs {current_image}, not {image}: run 'labctl down' first"
            )
        docker("start", node.container)
        return
    log(f"creating node {node.container}")
    capabilities = [
        "SYS_ADMIN",
        "NET_ADMIN",
        "SYS_PTRACE",
        "MKNOD",
        "AUDIT_WRITE",
        "SYS_CHROOT",
        "SETFCAP",
        "NET_RAW",
        "DAC_READ_SEARCH",
        "SYS_MODULE",
        "IPC_LOCK",
        "SYS_NICE",
        "SYS_RAWIO",
        "LINUX_IMMUTABLE",
        "NET_BROADCAST",
        "SYSLOG",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_BOOT",
    ]
    args = [
        "create",
        "--name",
        node.container,
        "--hostname",
        node.name,
        "--label",
        f"{LABEL}=node",
        "--label",
        f"{INSTANCE_LABEL}={INSTANCE}",
        "--network",
        MGMT[0],
        "--ip",
        node.address(MGMT[2]),
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--cgroupns=host",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--mount",
        f"type=volume,source=sparkserve-lab-{node.container}-docker,target=/var/lib/docker,"
        f"volume-label={LABEL}=volume,volume-label={INSTANCE_LABEL}={INSTANCE}",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        # A host's /dev/shm is half its memory; Docker gives a container 64 MiB. The ranks share the
        # node's (host IPC, as on a Spark), and vLLM's engine needs 160 MiB of it for one broadcast ring.
        "--shm-size",
        "4g",
        "--stop-signal",
        "SIGRTMIN+3",
    ]
    # --privileged fails on this machine (no CAP_SYS_RESOURCE): list what systemd and dockerd need.
    for capability in capabilities:
        args += ["--cap-add", capability]
    docker(*args, image, "/lib/systemd/systemd")
    for network, _subnet, gateway, _ifname, _hca in FABRICS:
        docker("network", "connect", "--ip", node.address(gateway), network, node.container)
    docker("start", node.container)


def wait_for_systemd(node: str) -> None:
    for _ in range(90):
        result = docker("exec", node, "systemctl", "is-system-running", check=False)
        state = result.stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(1)
    else:
        raise LabError(f"systemd in {node} did not finish booting ({state})")
    for unit in ("ssh", "docker"):
        if docker("exec", node, "systemctl", "is-active", unit, check=False).stdout.strip() != "active":
            status = docker("exec", node, "systemctl", "status", "--no-pager", unit, check=False).stdout
            raise LabError(f"{unit} is not active in {node}:\n{status}")


def sysfs_fixture_argv(root: str, gid_index: int) -> list[str]:
    """The command, run inside a node, that writes its STAND-IN RDMA sysfs tree under ``root``."""
    devices = [f"{hca}={ifname}:ACTIVE" for _n, _s, _g, ifname, hca in FABRICS]
    devices += [f"{hca}={ifname}:DOWN" for hca, ifname in UNCABLED]
    argv = ["python3", "/opt/sparkserve-lab/make_rdma_sysfs.py", "--root", root]
    argv += ["--gid-index", str(gid_index), "--link-class-net"]
    for device in devices:
        argv += ["--device", device]
    return argv


NETNAMES_SCRIPT = "/usr/local/sbin/sparkserve-lab-netnames"
NETNAMES_UNIT = "sparkserve-lab-netnames.service"


def netnames_script(by_mac: dict[str, str]) -> str:
    """The boot script that gives a node its Spark interface names by MAC, as udev does on a real
    Spark, so a node comes back from `docker restart` with its names and addresses by itself."""
    lines = ["#!/bin/sh", "# Written by lab/labctl.py (lab only): the Spark's interface names, by MAC."]
    lines += ["set -eu", "rename() {"]
    awk = '$0 ~ "link/ether " mac {sub(":", "", $2); sub("@.*", "", $2); print $2}'
    lines.append(f"  cur=$(ip -o link | awk -v mac=\"$1\" '{awk}')")
    lines.append('  [ -n "$cur" ] || { echo "no interface with MAC $1" >&2; exit 1; }')
    lines.append('  if [ "$cur" != "$2" ]; then ip link set "$cur" down; ip link set "$cur" name "$2"; fi')
    lines.append('  ip link set "$2" up')
    lines.append("}")
    lines += [f"rename {mac} {ifname}" for mac, ifname in sorted(by_mac.items())]
    for _hca, ifname in UNCABLED:
        # A down bridge stands for the uncabled port's netdev (this kernel has no dummy driver).
        lines.append(f"ip link show {ifname} >/dev/null 2>&1 || ip link add {ifname} type bridge")
    lines.append(f"ip route replace default via {MGMT[2]} dev {MGMT_IFNAME}")
    return "\n".join(lines) + "\n"


NETNAMES_UNIT_TEXT = f"""[Unit]
Description=Spark interface names by MAC (sparkserve lab)
DefaultDependencies=no
Before=network-pre.target docker.service ssh.service
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={NETNAMES_SCRIPT}

[Install]
WantedBy=multi-user.target
"""


def interface_macs(node: Node) -> dict[str, str]:
    """MAC -> Spark name of the node's management and fabric interfaces, found by their addresses
    (Docker derives a fixed address's MAC from it, so the MACs stay across restarts)."""
    wanted = {node.address(MGMT[2]): MGMT_IFNAME}
    wanted |= {node.address(gateway): ifname for _n, _s, gateway, ifname, _h in FABRICS}
    by_mac = {}
    for address, ifname in wanted.items():
        mac = node_exec(
            node.container,
            f"cur=$(ip -o -4 addr show | awk '$4 ~ /^{address}\\// {{print $2}}');"
            ' cat /sys/class/net/"$cur"/address',
        ).strip()
        if not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", mac):
            raise LabError(f"no MAC for {address} in {node.name}: {mac!r}")
        by_mac[mac] = ifname
    return by_mac


def configure_node(node: Node, public_key: str) -> None:
    """Give the node the Spark's interface names (now and at every boot), the fixture sysfs tree and
    our SSH key."""
    by_mac = interface_macs(node)
    container = node.container
    write_node_file(container, NETNAMES_SCRIPT, netnames_script(by_mac), mode="0755")
    write_node_file(container, f"/etc/systemd/system/{NETNAMES_UNIT}", NETNAMES_UNIT_TEXT, mode="0644")
    node_exec(container, f"systemctl daemon-reload && systemctl enable {NETNAMES_UNIT} && {NETNAMES_SCRIPT}")

    docker("exec", container, "mkdir", "-p", "/opt/sparkserve-lab")
    docker("cp", str(STANDINS / "sysfs" / "make_rdma_sysfs.py"), f"{container}:/opt/sparkserve-lab/")
    docker("exec", container, *sysfs_fixture_argv(SYSFS_ROOT, node.gid_index))

    home = f"/home/{LAB_USER}"
    node_exec(
        container,
        f"install -d -m 0700 -o {LAB_USER} -g {LAB_USER} {home}/.ssh && "
        f"printf '%s\\n' '{public_key}' > {home}/.ssh/authorized_keys && "
        f"chown {LAB_USER}:{LAB_USER} {home}/.ssh/authorized_keys && "
        f"chmod 0600 {home}/.ssh/authorized_keys",
    )


def write_node_file(node: str, path: str, text: str, mode: str) -> None:
    """Write a file inside a node (root-owned)."""
    script = f'cat > "$1" && chmod {mode} "$1"'
    run(["docker", "exec", "-i", node, "sh", "-c", script, "sh", path], input=text)


def wait_for_ssh(node: Node, key: Path) -> None:
    address = node.address(MGMT[2])
    for _ in range(30):
        result = run(["ssh", *ssh_options(key), f"{LAB_USER}@{address}", "true"], check=False)
        if result.returncode == 0:
            return
        time.sleep(1)
    raise LabError(f"no SSH to {node.name} at {address}: {result.stderr.strip()}")


def ssh_options(key: Path) -> list[str]:
    return [
        "-i",
        str(key),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        f"UserKnownHostsFile={STATE / 'ssh' / 'known_hosts'}",
        "-o",
        "ConnectTimeout=5",
    ]


# --- commands ----------------------------------------------------------------------------------------


def up(args: argparse.Namespace) -> None:
    started = time.monotonic()
    STATE.mkdir(parents=True, exist_ok=True)
    ensure_engine()
    ensure_controller_tools()
    nodes = nodes_for(args.workers)
    node_ref, engine_ref = build_images()
    ensure_network(MGMT[0], MGMT[1], MGMT[2])
    for network, subnet, gateway, _ifname, _hca in FABRICS:
        ensure_network(network, subnet, gateway, FABRIC_MTU)
    start_registry()
    digest = push_image(engine_ref)
    (STATE / "engine-digest").write_text(digest)
    start_hub(args.checkpoint_mb)
    if args.vllm:
        publish_vllm()
    start_wheels()
    key = ssh_keypair()
    public_key = key.with_suffix(".pub").read_text().strip()
    for node in nodes:
        create_node(node, node_ref)
    for node in nodes:
        wait_for_systemd(node.container)
        configure_node(node, public_key)
        wait_for_ssh(node, key)
    (STATE / "nodes.json").write_text(json.dumps([n.name for n in nodes]))
    start_prometheus(nodes)
    log(
        f"lab {INSTANCE} up in {time.monotonic() - started:.0f} s: engine image "
        f"{FABRICS[0][2]}:{REGISTRY_PORT}/{ENGINE_REPO}@{digest}; hub http://{MGMT[2]}:{HUB_PORT}"
    )


def build_all_images(args: argparse.Namespace) -> None:
    build_images()
    if args.vllm:
        import vllm_engine  # noqa: PLC0415 - only this command needs it (it imports this module)

        vllm_engine.build_image()


def publish_vllm() -> None:
    """The real engine's lab (inventory/lab-vllm): vLLM's CPU build in the registry, pinned by the
    digest in .lab/vllm-engine-digest, and a tiny trained model on the hub as VLLM_MODEL_REPO."""
    import vllm_engine  # noqa: PLC0415 - only this command needs it (it imports this module)

    image = vllm_engine.build_image()
    (STATE / "vllm-engine-digest").write_text(push_image(image, vllm_engine.IMAGE_REPO))
    vllm_engine.make_model(image, STATE / "hub" / VLLM_MODEL_REPO, "good")


def lab_listing(kind: str, field: str = "") -> list[tuple[str, str]]:
    """(name, ``field``) of this lab's containers, volumes or networks. Resources made before labs
    were numbered carry no number: they are lab 0's."""
    name = "{{.Names}}" if kind == "container" else "{{.Name}}"
    listing = docker(
        kind,
        "ls",
        *(["--all"] if kind == "container" else []),
        "--filter",
        f"label={LABEL}",
        "--format",
        f'{name}\t{{{{.Label "{INSTANCE_LABEL}"}}}}\t{field}',
    ).stdout
    rows = [line.split("\t", 2) for line in listing.splitlines() if line]
    return [(row[0], row[2]) for row in rows if (row[1] or "0") == str(INSTANCE)]


def lab_resources(kind: str) -> list[str]:
    return [name for name, _ in lab_listing(kind)]


def down(_args: argparse.Namespace) -> None:
    if docker_ok("info"):
        containers = lab_resources("container")
        if containers:
            log(f"removing nodes {' '.join(containers)}")
            docker("rm", "--force", "--volumes", *containers)
        for volume in lab_resources("volume"):
            docker("volume", "rm", "--force", volume)
        for network in lab_resources("network"):
            docker("network", "rm", network)
    for name in ("hub", "registry", "wheels", "prometheus"):
        stop_process(name)
    # Node host keys are new with every node: forget them, and the per-run state with them.
    for transient in (
        "ssh/known_hosts",
        "engine-digest",
        "vllm-engine-digest",
        "nodes.json",
        "registry",  # where the registry's storage was before it became a cache (REGISTRY_STORAGE)
        "prometheus",
    ):
        path = STATE / transient
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    log(f"lab {INSTANCE} down")


def status(_args: argparse.Namespace) -> None:
    if not docker_ok("info"):
        print("docker engine: not answering")
        return
    for name, state in lab_listing("container", "{{.Status}}"):
        print(f"{name}\t{state}")
    for name in ("registry", "hub", "wheels", "prometheus"):
        print(f"{name}: {'running' if pid_alive(STATE / f'{name}.pid') else 'stopped'}")


def layout(workers: int) -> dict:
    """This lab's names, addresses, ports and state directory: what its inventory must name."""
    return {
        "instance": INSTANCE,
        "state": str(STATE),
        "nodes": {
            node.name: {
                "container": node.container,
                "mgmt": node.address(MGMT[2]),
                "fabric": node.address(FABRICS[0][2]),
            }
            for node in nodes_for(workers)
        },
        "registry": f"{FABRICS[0][2]}:{REGISTRY_PORT}",
        "hub": f"http://{MGMT[2]}:{HUB_PORT}",
        "wheels": f"http://{MGMT[2]}:{WHEELS_PORT}/",
        "prometheus": f"http://127.0.0.1:{PROMETHEUS_PORT}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="build what is missing and start the lab")
    up_parser.add_argument("--workers", type=int, default=1, help="number of worker nodes (default 1)")
    up_parser.add_argument(
        "--checkpoint-mb",
        type=int,
        default=24,
        help="size of the synthetic checkpoint the hub serves (default 24)",
    )
    up_parser.add_argument(
        "--vllm",
        action="store_true",
        help="also build the real vLLM engine (CPU) and publish its tiny model, for inventory/lab-vllm",
    )
    up_parser.set_defaults(func=up)
    commands.add_parser("down", help="remove the lab").set_defaults(func=down)
    commands.add_parser("status", help="show the lab").set_defaults(func=status)
    layout_parser = commands.add_parser("layout", help="print the lab's names, addresses and ports (JSON)")
    layout_parser.add_argument("--workers", type=int, default=1, help="number of worker nodes (default 1)")
    layout_parser.set_defaults(func=lambda a: print(json.dumps(layout(a.workers), indent=1)))
    commands.add_parser("engine", help="only make sure a Docker engine answers").set_defaults(
        func=lambda _a: ensure_engine()
    )
    commands.add_parser(
        "tools", help="only install what this machine runs for the lab (ssh, rsync, the registry, Prometheus)"
    ).set_defaults(func=lambda _a: ensure_controller_tools())
    images_parser = commands.add_parser("images", help="only build the lab's images that are missing")
    images_parser.add_argument("--vllm", action="store_true", help="the real vLLM engine's image too")
    images_parser.set_defaults(func=build_all_images)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except LabError as error:
        print(f"[lab] error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
