"""Every socket a one-machine launch listens on is bound to loopback (issue 41, item 1).

Each test starts a real job whose processes set up their process group, all-reduce once, say they
are ready and wait; meanwhile the test lists the sockets the job's processes (the launcher and all its
descendants) listen on (tests/listener_probe.py) and asserts none is on an address other machines
reach. The rendezvous store itself must be among them, on loopback, or the probe saw nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from accelerando.core.listeners import is_loopback, listen_address, store_server
from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.plan import Command, build
from listener_probe import Listener, job_pids, listeners, non_loopback

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

JOB = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch
    from accelerando import Accelerator

    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    total = accelerator.reduce(torch.ones(1), reduction="sum")
    assert total.item() == accelerator.num_processes
    (out / f"ready{accelerator.process_index}").write_text(str(os.getpid()))
    while not (out / "stop").exists():
        time.sleep(0.05)
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "TORCHFT"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def watch(argv: list[str], out: Path, ready: int, timeout: float = 240, split_ready: bool = False) -> Any:
    """Run ``argv`` until ``ready`` processes wrote their ready file; return what the job listens on then.

    With ``split_ready``: ``(what the ready processes and their descendants listen on, what the rest of
    the job listens on)``.
    """
    log = open(out / "job.log", "w")  # noqa: SIM115 - the job writes it until it exits
    job = subprocess.Popen(argv, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=out)
    try:
        deadline = time.monotonic() + timeout
        while sum((out / f"ready{i}").exists() for i in range(ready)) < ready:
            if job.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the job was not ready (status {job.poll()}):\n{(out / 'job.log').read_text()}"
                )
            time.sleep(0.1)
        everything = job_pids(job.pid)
        found = listeners(everything)
        if split_ready:
            scripts = set().union(*(job_pids(int((out / f"ready{i}").read_text())) for i in range(ready)))
            found = (listeners(scripts), listeners(everything - scripts))
        (out / "stop").write_text("")
        assert job.wait(timeout=120) == 0, (out / "job.log").read_text()
        return found
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        log.close()


def _check(found: list[Listener], store_port: int | None = None) -> None:
    exposed = non_loopback(found)
    print(f"listeners: {len(found)}, on non-loopback addresses: {len(exposed)}")
    assert exposed == [], "\n".join(map(str, exposed))
    assert found, "the probe saw no listening socket at all (the store must be one)"
    if store_port is not None:
        assert any(s.port == store_port and s.loopback for s in found), [str(s) for s in found]


def test_default_launch_listens_on_loopback_only(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    port = 29000 + os.getpid() % 1000
    argv = [sys.executable, "-m", "accelerando.commands.launch", "--cpu", "--num_processes", "2",
            "--main_process_port", str(port), str(tmp_path / "job.py"), str(tmp_path)]  # fmt: skip
    _check(watch(argv, tmp_path, 2), store_port=port)


@pytest.mark.slow
def test_c10d_launch_on_one_machine_listens_on_loopback_only(tmp_path: Path) -> None:
    """torch's dynamic rendezvous unpickles what its store holds: that store must be this machine's only."""
    (tmp_path / "job.py").write_text(JOB)
    argv = [sys.executable, "-m", "accelerando.commands.launch", "--cpu", "--num_processes", "2",
            "--rdzv_backend", "c10d", "--rdzv_conf", "last_call_timeout=1",
            str(tmp_path / "job.py"), str(tmp_path)]  # fmt: skip
    _check(watch(argv, tmp_path, 2))


NOTEBOOK = textwrap.dedent(
    """
    import sys
    from accelerando import notebook_launcher

    def job(out):
        exec(open(out + "/job.py").read().replace("sys.argv[1]", repr(out)), {})

    notebook_launcher(job, (sys.argv[1],), num_processes=2, use_port=sys.argv[2])
    """
)


def test_notebook_launch_listens_on_loopback_only(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "notebook.py").write_text(NOTEBOOK)
    port = 30000 + os.getpid() % 1000
    argv = [sys.executable, str(tmp_path / "notebook.py"), str(tmp_path), str(port)]
    _check(watch(argv, tmp_path, 2), store_port=port)


@pytest.mark.slow
def test_ray_launch_listens_on_loopback_only(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    (tmp_path / "job.py").write_text(JOB)
    argv = [sys.executable, "-m", "accelerando.commands.launch", "--ray", "--cpu", "--num_processes", "2",
            str(tmp_path / "job.py"), str(tmp_path)]  # fmt: skip
    found, ray_services = watch(argv, tmp_path, 2, timeout=300, split_ready=True)
    # Ray's own services (GCS, raylet, the actors' workers) listen on every interface whatever the launch
    # asks (Ray 2.60 authenticates them with its cluster token); the job's processes are the scripts.
    print(
        f"Ray's own services: {len(ray_services)} listener(s), {len(non_loopback(ray_services))} non-loopback"
    )
    _check(found)


# --- the pieces, without a job ---------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "localhost"])
def test_store_server_binds_the_given_address_only(address: str) -> None:
    import torch.distributed as dist

    store = store_server(address, 0, timeout=timedelta(seconds=10))
    found = [s for s in listeners({os.getpid()}) if s.port == store.port]
    assert [s.loopback for s in found] == [True], [str(s) for s in found]
    client = dist.TCPStore(address, store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("key", "value")
    assert store.get("key") == b"value"


def test_torch_alone_would_bind_every_interface() -> None:
    """Why store_server exists: torch's TCPStore server listens on the wildcard even for 127.0.0.1."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    found = [s for s in listeners({os.getpid()}) if s.port == store.port]
    assert found and not any(s.loopback for s in found)


def test_the_launch_binds_what_the_user_named() -> None:
    assert listen_address(None, None) == "127.0.0.1"
    assert listen_address(None, "10.0.0.1") == "10.0.0.1"
    assert listen_address("0.0.0.0", "10.0.0.1") == "0.0.0.0"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("0.0.0.0") and not is_loopback("node0")


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "10.0.0.1", "0.0.0.0", "::", "node0"]
)
def test_the_plan_knows_loopback_as_the_listeners_do(address: str) -> None:
    from accelerando.launchers.plan.environment import _on_loopback

    assert _on_loopback(address, 1) == is_loopback(address)
    assert not _on_loopback(address, 2)


def _plan(**values: object):
    settings = resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}])
    machine = MachineInfo(cpu_count=4, loopback_interface="lo")
    return build(settings, Command("train.py"), machine, port=lambda: 29555)


def test_one_machine_plans_bind_loopback_and_pin_gloo_and_nccl_to_it() -> None:
    plan = _plan(cpu=True, num_processes=2)
    assert plan.bind_address == "127.0.0.1"
    assert plan.env["GLOO_SOCKET_IFNAME"] == "lo" and plan.env["NCCL_SOCKET_IFNAME"] == "lo"
    c10d = _plan(cpu=True, num_processes=2, rdzv_backend="c10d")
    assert c10d.agent_args[c10d.agent_args.index("--local_addr") + 1] == "127.0.0.1"


def test_multi_machine_plans_bind_the_named_address_and_leave_interfaces_alone() -> None:
    plan = _plan(cpu=True, num_processes=4, num_machines=2, main_process_ip="10.0.0.1")
    assert plan.bind_address == "10.0.0.1"
    assert "GLOO_SOCKET_IFNAME" not in plan.env and "--local_addr" not in plan.agent_args
    wide = _plan(
        cpu=True, num_processes=4, num_machines=2, main_process_ip="10.0.0.1", bind_address="0.0.0.0"
    )
    assert wide.bind_address == "0.0.0.0"
