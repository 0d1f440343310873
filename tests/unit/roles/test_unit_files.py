"""The supervisor's and the memory guard's unit files: their command lines quoted for systemd
(tests/lab/test_unit_command_lines.py has systemd read such lines back), and no restart loop on
a bad configuration (both programs exit 2 on one: test_supervisor.py, test_memguard.py)."""

from __future__ import annotations

import hashlib

import jinja2
import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._systemd import systemd_exec
from role_defaults import ROLES, SHARED_ROLE, role_defaults

STATE = "/home/spark user/.local/state/dsv41"  # a home directory with a space in its name
FABRIC_ADDRESS = "192.168.100.13"


def unit_text(role: str, template: str, **overrides) -> str:
    """The unit as the role renders it (Ansible's own filters and its file lookup stubbed)."""
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    environment.filters["sparkserve.dsv41.systemd_exec"] = systemd_exec
    environment.filters["join"] = lambda value, sep="": sep.join(value)
    environment.filters["hash"] = lambda value, algorithm: hashlib.new(algorithm, value.encode()).hexdigest()
    environment.globals["lookup"] = lambda _kind, name, rstrip: (ROLES / role / "files" / name).read_text()
    values = {
        **role_defaults(SHARED_ROLE, role),
        "ansible_managed": "managed",
        "deployment_rank_nodes": ["spark-a", "spark-b"],
        "deployment_state_path": STATE,
        "deployment_config_dir": "/etc/sparkserve dsv41",
        "fabric_selected": {"ipv4": FABRIC_ADDRESS},
        "fabric_sysfs_root": "/sys",
        **overrides,
    }
    return environment.from_string((ROLES / role / "templates" / template).read_text()).render(values)


def render(role: str, template: str, **overrides) -> dict[str, str]:
    """The unit's [Service] keys as the role renders them."""
    service = unit_text(role, template, **overrides).split("[Service]", 1)[1].split("[Install]", 1)[0]
    return dict(
        line.split("=", 1) for line in service.splitlines() if "=" in line and not line.startswith("#")
    )


def memguard_argv(install_dir: str) -> list[str]:
    """The guard's command line with the role's defaults."""
    d = role_defaults(SHARED_ROLE, "memguard")
    return [
        "/usr/bin/python3", f"{install_dir}/dsv41_memguard.py",
        "--floor-gib", str(d["memguard_floor_gib"]), "--interval", str(d["memguard_interval_seconds"]),
        "--container-prefix", d["deployment_rank_container_prefix"],
        "--trace-below-gib", str(d["memguard_trace_below_gib"]),
        "--log", f"{STATE}/memguard.log", "--kill-record", f"{STATE}/memguard-last-kill",
        "--log-max-bytes", str(d["memguard_log_max_bytes"]), "--log-backups", str(d["memguard_log_backups"]),
        "--metrics-address", FABRIC_ADDRESS, "--metrics-port", str(d["deployment_memguard_metrics_port"]),
        "--sysfs-root", "/sys",
    ]  # fmt: skip


INSTALL_DIR = "/opt/spark serve"


@pytest.mark.parametrize(
    ("role", "template", "argv"),
    [
        pytest.param(
            "supervisor",
            "dsv41-supervisor.service.j2",
            ["/usr/bin/python3", f"{INSTALL_DIR}/dsv41_supervisor.py",
             "--config", "/etc/sparkserve dsv41/supervisor.json"],
            id="supervisor",
        ),
        pytest.param("memguard", "dsv41-memguard.service.j2", memguard_argv(INSTALL_DIR), id="memguard"),
    ],
)  # fmt: skip
def test_the_command_line_is_quoted_and_a_bad_configuration_stops_the_restarts(role, template, argv):
    service = render(role, template, deployment_install_dir=INSTALL_DIR)
    assert service["ExecStart"] == systemd_exec(argv)
    assert '"' in service["ExecStart"], "the paths with a space are quoted"
    assert service["Restart"] == "always"
    assert service["RestartPreventExitStatus"] == "2"


@pytest.mark.parametrize(
    ("role", "template"),
    [("supervisor", "dsv41-supervisor.service.j2"), ("memguard", "dsv41-memguard.service.j2")],
)
def test_the_unit_changes_with_the_shared_module_so_that_its_daemon_restarts_onto_a_new_one(role, template):
    """Both roles install dsv41_node.py; whichever wrote a new one, each daemon's unit changes (and
    its role restarts it), not only the one whose role ran first."""
    shared = (ROLES / role / "files" / "dsv41_node.py").read_bytes()
    assert f"dsv41_node.py sha256 {hashlib.sha256(shared).hexdigest()}" in unit_text(role, template)


def test_the_gateway_unit_quotes_its_paths_loads_the_guard_first_and_never_holds_the_key():
    config_dir = "/etc/spark serve"
    text = (ROLES / "rank" / "templates" / "dsv41-gateway.service.j2").read_text()
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    environment.filters["sparkserve.dsv41.systemd_exec"] = systemd_exec
    unit = environment.from_string(text).render(
        ansible_managed="managed",
        deployment_served_model_name="m",
        __rank_env_file=f"{STATE}/rank.env",
        __rank_gateway_binary="/usr/sbin/haproxy",
        __rank_gateway_config=f"{config_dir}/gateway.cfg",
        __rank_rendezvous_rules=f"{config_dir}/rendezvous.nft",
    )
    lines = [line for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    pre = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStartPre=")]
    assert pre == [
        systemd_exec(["/usr/sbin/nft", "-f", f"{config_dir}/rendezvous.nft"]),
        systemd_exec(["/usr/sbin/haproxy", "-c", "-q", "-f", f"{config_dir}/gateway.cfg"]),
    ], "the guard's rules are loaded before HAProxy starts"
    assert (
        f"ExecStart={systemd_exec(['/usr/sbin/haproxy', '-Ws', '-f', f'{config_dir}/gateway.cfg'])}" in lines
    )
    assert f"EnvironmentFile={STATE}/rank.env" in lines, "the key comes from the root-only env file"
    assert "Before=dsv41-supervisor.service" in lines
