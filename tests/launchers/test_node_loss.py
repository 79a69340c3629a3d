"""A job of a ``--num_machines 1:2`` range that loses a machine finishes on the one left (issue 44 item 5).

Two "machines" on this host: each a network namespace made here, joined by a veth pair whose two
addresses (10.77.0.1 and 10.77.0.2) are the only ones outside loopback; nothing else is reached.
Each machine runs ``accelerando launch --num_machines 1:2 --num_processes 2 --max_restarts 3
--rdzv_backend c10d --main_process_ip 10.77.0.1 ...`` (one process per machine) on a small DDP
training script that saves a checkpoint every few steps and resumes from the newest complete one
(the documented ``latest_checkpoint`` / ``load_state`` pattern). Mid-run machine B is lost, its
launcher's process group killed or its link cut (``ip link set ... down``); machine A must restart
alone, resume from the last complete checkpoint and finish with the weights of a one-machine run
resumed from that same checkpoint. The seconds from the loss to A's first training step afterwards
are printed (not asserted; the test's whole run is bounded).

The script is independent of how ``load_state`` restores random states and loader positions on
another world size: no dropout, no dataloader, each step's global batch indexed by the step
counter restored from the checkpoint and split across the processes, so one process computes the
mean gradient of the same 8 samples that two did.

Needs root and ``ip`` (iproute2) with network namespaces; skipped with the reason otherwise. The
pieces that make it work are checked first without processes: the rendezvous timings the launch
passes, the handler that asks for a new round when a machine is gone, and the network facts read on
each machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers import member_watch, network
from accelerando.launchers.plan import Command, build, check_settings
from accelerando.launchers.plan.argv import rendezvous_timeouts
from accelerando.launchers.preflight import socket_interfaces

ADDRESS_A, ADDRESS_B = "10.77.0.1", "10.77.0.2"
PORT = 29511  # inside namespace A: its own network stack, nothing else listens there
TOTAL_STEPS, EVERY, LOSE_AT = 60, 10, 25
# Our launch flags as a user writes them; a peer timeout of 6 s (2 s keep-alives x 3) keeps the test short.
FLAGS = ("--cpu", "--num_machines", "1:2", "--num_processes", "2", "--max_restarts", "3",
         "--rdzv_backend", "c10d", "--monitor_interval", "0.5", "--rdzv_last_call_timeout", "5",
         "--rdzv_peer_timeout", "6", "--main_process_ip", ADDRESS_A, "--main_process_port", str(PORT))  # fmt: skip
RUN_BOUND_S = 300  # the whole run of one case, killed past it
SETUP_BOUND_S = 20


# --- the pieces, without processes -----------------------------------------------------------------


@pytest.fixture
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def _settings(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}], warn_sources=())


def _agent_conf(**values) -> str:
    plan = build(_settings(**values), Command("t.py"), MachineInfo(cpu_count=8), port=lambda: 1)
    agent = list(plan.agent_args)
    return agent[agent.index("--rdzv_conf") + 1]


@pytest.mark.parametrize(
    ("peer", "interval", "attempts"), [(15, 5, 3), (6, 2, 3), (10, 3, 4), (2, 1, 2), (60, 5, 12)]
)
def test_the_peer_timeout_becomes_keep_alives_that_fill_it(clean_env, peer, interval, attempts):
    timings = rendezvous_timeouts(_settings(rdzv_peer_timeout=peer, rdzv_last_call_timeout=7))
    assert timings == {
        "last_call_timeout": 7,
        "keep_alive_interval": interval,
        "keep_alive_max_attempt": attempts,
    }
    assert interval * attempts >= peer


def test_the_launch_passes_its_timings_unless_rdzv_conf_sets_them(clean_env):
    base = {"num_machines": "1:2", "main_process_ip": "10.0.0.1", "cpu": True, "num_processes": 2}
    defaults = "last_call_timeout=5,keep_alive_interval=5,keep_alive_max_attempt=3"
    assert _agent_conf(**base) == defaults
    assert (
        _agent_conf(**base, rdzv_peer_timeout=6)
        == "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=3"
    )
    # one keep-alive key of the user's: the launch adds neither of the two
    assert (
        _agent_conf(**base, rdzv_conf="keep_alive_interval=1") == "keep_alive_interval=1,last_call_timeout=5"
    )
    # a fixed count on c10d gets them too (a lost machine is noticed the same way)
    fixed = {**base, "num_machines": 2, "rdzv_backend": "c10d"}
    assert _agent_conf(**fixed) == defaults


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"rdzv_last_call_timeout": 3, "rdzv_conf": "last_call_timeout=9"},
         r"rdzv_last_call_timeout \(from cli:--rdzv_last_call_timeout\)=3 and rdzv_conf .* key last_call_timeout"),
        ({"rdzv_peer_timeout": 8, "rdzv_conf": "join_timeout=60,keep_alive_max_attempt=2"},
         r"rdzv_peer_timeout .*=8 and rdzv_conf .* key keep_alive_max_attempt.*Fix: keep one"),
        ({"rdzv_peer_timeout": 1}, r"rdzv_peer_timeout"),  # below the table's minimum of 2
    ],
)  # fmt: skip
def test_a_timeout_set_twice_or_too_small_is_refused(clean_env, values, expected):
    with pytest.raises(ValueError, match=expected):
        check_settings(_settings(num_machines="1:2", main_process_ip="h", **values), MachineInfo(cpu_count=8))


class _FakeHolder:
    def __init__(self) -> None:
        self.state = type("State", (), {"round": 1, "participants": {"a": 0, "b": 1}, "closed": False})()


class _FakeHandler:
    """What watch_members touches of torch's DynamicRendezvousHandler."""

    def __init__(self) -> None:
        self._state_holder = _FakeHolder()
        self._shared_tcp_store_server: object | None = "old store"
        self._bootstrap_store_info: object | None = "old info"
        self.waiting = 0

    def next_rendezvous(self) -> str:
        return "info"

    def num_nodes_waiting(self) -> int:
        return self.waiting


def test_a_machine_gone_from_the_round_asks_the_agent_for_a_new_one():
    handler = _FakeHandler()
    watched = member_watch.watch_members(handler)  # type: ignore[arg-type]
    assert watched.num_nodes_waiting() == 0  # before the first round: torch's answer
    assert watched.next_rendezvous() == "info"
    assert (handler._shared_tcp_store_server, handler._bootstrap_store_info) == (None, None)  # a new store
    state = handler._state_holder.state
    assert watched.num_nodes_waiting() == 0  # both machines still beat
    handler.waiting = 2
    assert watched.num_nodes_waiting() == 2  # machines waiting to join: torch's answer
    handler.waiting = 0
    state.participants = {"a": 0}  # b missed its keep-alives: torch's sync dropped it
    assert watched.num_nodes_waiting() == 1
    state.closed = True  # the job is ending: never restart then
    assert watched.num_nodes_waiting() == 0
    state.closed, state.participants, state.round = False, {"a": 0, "b": 1}, 2  # a new round without us
    assert watched.num_nodes_waiting() == 1
    watched.next_rendezvous()  # the new round is recorded
    assert watched.num_nodes_waiting() == 0


def test_the_network_facts_of_this_machine():
    assert network.is_local_address("127.0.0.1")
    assert not network.is_local_address("192.0.2.1")  # TEST-NET-1: a bind that fails, nothing sent
    assert network.route_source("127.0.0.1", 29500) == "127.0.0.1"
    if sys.platform.startswith("linux") and os.path.isdir("/sys/class/net/lo"):
        assert network.interface_of("127.0.0.1") == "lo"
    assert network.interface_of("192.0.2.1") is None


def test_gloo_keeps_its_own_interface_unless_the_host_name_points_at_loopback(monkeypatch):
    monkeypatch.setattr(network, "_host_name_reaches_out", lambda: True)
    assert network.gloo_interface("127.0.0.1", 29500) is None
    monkeypatch.setattr(network, "_host_name_reaches_out", lambda: False)
    monkeypatch.setattr(network, "route_source", lambda host, port: "10.9.8.7")
    monkeypatch.setattr(network, "interface_of", lambda address: {"10.9.8.7": "eth7"}.get(address))
    assert network.gloo_interface("10.9.8.1", 29500) == "eth7"
    monkeypatch.setattr(network, "route_source", lambda host, port: "127.0.0.1")  # machine 0 is this one
    assert network.gloo_interface("127.0.0.1", 29500) is None


def test_socket_interfaces_only_for_several_machines_and_never_over_the_users(clean_env, monkeypatch):
    import accelerando.launchers.preflight as preflight

    monkeypatch.setattr(preflight, "gloo_interface", lambda host, port: f"if-{host}-{port}")
    box = MachineInfo(cpu_count=8)
    several = build(_settings(num_machines=2, machine_rank=0, main_process_ip="10.0.0.1", main_process_port=2950,
                              cpu=True, num_processes=2), Command("t.py"), box, port=lambda: 1)  # fmt: skip
    assert socket_interfaces(several, {}) == {"GLOO_SOCKET_IFNAME": "if-10.0.0.1-2950"}
    assert socket_interfaces(several, {"GLOO_SOCKET_IFNAME": "eth0"}) == {}
    one = build(_settings(cpu=True, num_processes=2), Command("t.py"), box, port=lambda: 1)
    assert socket_interfaces(one, {}) == {}


# --- two machines in network namespaces --------------------------------------------------------------

# argv: project folder, output folder, machine name, steps in all, save every. One line of JSON per
# event in out/log-<name>-r<rank>.txt (start: world, step resumed at, folder loaded; step: time).
TRAIN_SCRIPT = """\
import json, os, sys, time
import torch
from accelerando import Accelerator
from accelerando.checkpointing import latest_checkpoint
from accelerando.utils import ProjectConfiguration, set_seed

project, out, name, total, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
GLOBAL_BATCH = 8


class Progress:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = int(state["step"])


set_seed(0)
data = torch.Generator().manual_seed(1234)
X = torch.randn(512, 16, generator=data)
Y = X @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
acc = Accelerator(cpu=True, project_config=config)
progress = Progress()
acc.register_for_checkpointing(progress)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt = acc.prepare(model, opt)
loaded = None
if latest_checkpoint(project):
    acc.load_state()  # the newest complete checkpoint; incomplete and damaged ones are skipped
    loaded = acc.resume_point.checkpoint
world, rank = acc.num_processes, acc.process_index
log = open(os.path.join(out, f"log-{name}-r{rank}.txt"), "a", buffering=1)
log.write(json.dumps({"event": "start", "world": world, "step": progress.step, "loaded": loaded,
                      "t": time.time()}) + "\\n")
while progress.step < total:
    rows = (progress.step * GLOBAL_BATCH + torch.arange(GLOBAL_BATCH)) % X.shape[0]
    mine = rows[rank::world]  # this process's share of the step's global batch
    loss = torch.nn.functional.mse_loss(model(X[mine]), Y[mine])
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    progress.step += 1
    log.write(json.dumps({"event": "step", "step": progress.step, "world": world, "t": time.time()}) + "\\n")
    if progress.step % every == 0:
        acc.save_state()
    time.sleep(0.1)  # a run long enough to lose a machine in
if acc.is_main_process:
    weights = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    torch.save(weights, os.path.join(out, f"final-{name}.pt"))
log.write(json.dumps({"event": "done", "step": progress.step, "world": world, "t": time.time()}) + "\\n")
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


@dataclass
class Machines:
    """Two network namespaces joined by a veth pair, and the process groups started in them."""

    ns_a: str
    ns_b: str
    veth_a: str
    veth_b: str
    groups: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def kill_all(self) -> None:
        """SIGKILL every process group started here and any process left in the namespaces."""
        for proc in self.groups:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in (self.ns_a, self.ns_b):  # a process that left its group (none should) dies too
            listed = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in listed[:1000]:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


@pytest.fixture
def machines() -> Iterator[Machines]:
    """Namespaces A (10.77.0.1) and B (10.77.0.2), a veth pair between them, loopback up in each."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is missing")
    tag = f"{os.getpid() % 100000}"
    m = Machines(f"acc-nl{tag}-a", f"acc-nl{tag}-b", f"anl{tag}a", f"anl{tag}b")
    made = []
    try:
        for ns in (m.ns_a, m.ns_b):
            made.append(ns)
            result = _ip("netns", "add", ns, check=False)
            if result.returncode != 0:
                made.pop()
                pytest.skip(f"cannot make a network namespace here: {result.stderr.strip()}")
        try:
            _ip("link", "add", m.veth_a, "type", "veth", "peer", "name", m.veth_b)
            for ns, veth, address in ((m.ns_a, m.veth_a, ADDRESS_A), (m.ns_b, m.veth_b, ADDRESS_B)):
                _ip("link", "set", veth, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", veth)
                _ip("-n", ns, "link", "set", veth, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as err:
            pytest.skip(
                f"cannot join two network namespaces here ({' '.join(err.cmd)}): {err.stderr.strip()}"
            )
        yield m
    finally:
        m.kill_all()
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", m.veth_a, check=False)  # if it never moved into its namespace


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "PET_"))}
    env.update(ACCELERANDO_CONFIG_FILE=os.devnull, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))  # fmt: skip
    return env


def _launch(m: Machines, tmp_path: Path, ns: str, name: str, rank: int, project: Path, out: Path):
    """``accelerando launch`` on one machine (inside its namespace), in a process group of its own."""
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "accelerando", "launch", *FLAGS,
            "--machine_rank", str(rank), str(tmp_path / "train.py"),
            str(project), str(out), name, str(TOTAL_STEPS), str(EVERY)]  # fmt: skip
    with open(tmp_path / f"launch-{name}.log", "w") as log:  # a file: a pipe stays open while any child lives
        proc = subprocess.Popen(argv, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=tmp_path)  # fmt: skip
    m.groups.append(proc)
    return proc


def _events(out: Path, name: str) -> list[dict]:
    rows = []
    for path in sorted(out.glob(f"log-{name}-r*.txt")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _tail(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("launch-*.log")))


def _wait(condition, deadline: float, what: str, tmp_path: Path, *procs: subprocess.Popen[bytes]) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail naming ``what`` past ``deadline`` or on an exit."""
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{_tail(tmp_path)}")
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"a launch ended before {what}\n{_tail(tmp_path)}")
        time.sleep(0.1)


def _reference_run(tmp_path: Path, checkpoint: Path) -> dict[str, torch.Tensor]:
    """The script on one machine (one process, no network), resumed from a copy of ``checkpoint``."""
    project, out = tmp_path / "reference", tmp_path / "reference-out"
    out.mkdir()
    shutil.copytree(checkpoint, project / "checkpoints" / checkpoint.name)
    argv = [sys.executable, "-m", "accelerando", "launch", "--cpu", "--num_processes", "1",
            str(tmp_path / "train.py"), str(project), str(out), "R", str(TOTAL_STEPS), str(EVERY)]  # fmt: skip
    done = subprocess.run(argv, env=_env(tmp_path), capture_output=True, text=True, timeout=RUN_BOUND_S,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (start,) = [e for e in _events(out, "R") if e["event"] == "start"]
    assert start["world"] == 1 and start["loaded"] is not None
    return torch.load(out / "final-R.pt")


def _max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in a)


def _lose_machine_b(m: Machines, tmp_path: Path, how: str) -> None:
    project, out = tmp_path / "project", tmp_path / "out"
    out.mkdir()
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    machine_b = _launch(m, tmp_path, m.ns_b, "B", 1, project, out)
    machine_a = _launch(m, tmp_path, m.ns_a, "A", 0, project, out)
    deadline = time.monotonic() + RUN_BOUND_S

    def b_trained_with_a() -> bool:  # B's steps are steps of the group of two
        return sum(e["event"] == "step" and e["world"] == 2 for e in _events(out, "B")) >= LOSE_AT

    _wait(b_trained_with_a, deadline, f"step {LOSE_AT} of the two machines", tmp_path, machine_a, machine_b)
    lost_at = time.time()
    if how == "kill":
        os.killpg(machine_b.pid, signal.SIGKILL)  # B's launcher, its agent and its process
    else:
        _ip("-n", m.ns_a, "link", "set", m.veth_a, "down")  # the wire between them is cut
    try:
        machine_a.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"machine A did not finish alone within {RUN_BOUND_S} s\n{_tail(tmp_path)}")
    assert machine_a.returncode == 0, _tail(tmp_path)

    events = _events(out, "A")
    starts = [e for e in events if e["event"] == "start"]
    assert starts[0]["world"] == 2 and starts[0]["loaded"] is None
    again = [e for e in starts if e["t"] > lost_at]
    assert [e["world"] for e in again] == [1], starts  # one restart, alone
    resumed = again[0]
    # From a checkpoint the two machines completed before the loss, not from the start.
    assert resumed["step"] >= EVERY and resumed["step"] % EVERY == 0 and resumed["step"] <= LOSE_AT + EVERY
    assert resumed["loaded"] is not None
    first_step = next(e for e in events if e["event"] == "step" and e["t"] > lost_at and e["world"] == 1)
    assert events[-1] == {**events[-1], "event": "done", "step": TOTAL_STEPS, "world": 1}
    assert not (out / "final-B.pt").exists()

    survivor = torch.load(out / "final-A.pt")
    reference = _reference_run(tmp_path, tmp_path / resumed["loaded"])  # the folder A loaded
    difference = _max_relative_difference(survivor, reference)
    print(
        f"\nnode loss ({how}): machine B lost at A's step >= {LOSE_AT}; A resumed alone at step {resumed['step']} "
        f"from {Path(resumed['loaded']).name}; loss -> training again {first_step['t'] - lost_at:.1f} s; "
        f"final weights vs one machine resumed there: max relative difference {difference:.3g}"
    )
    assert difference <= 1e-6


@pytest.mark.slow
def test_the_machine_left_finishes_after_the_other_is_killed(machines: Machines, tmp_path: Path) -> None:
    _lose_machine_b(machines, tmp_path, "kill")


@pytest.mark.slow
def test_the_machine_left_finishes_after_the_link_is_cut(machines: Machines, tmp_path: Path) -> None:
    _lose_machine_b(machines, tmp_path, "link")
