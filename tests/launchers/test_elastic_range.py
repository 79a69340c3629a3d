"""``--num_machines MIN:MAX``: an elastic machine range through the c10d rendezvous.

The plan's rules (parsing, checks, the agent's options, the processes' environment, the job files) are
checked without starting anything. The real runs use one machine: each "machine" is one
`accelerando launch --num_machines 1:2` invocation with one CPU process, meeting on the loopback
address with short rendezvous timeouts (``last_call_timeout``, ``join_timeout``, a fast keep-alive so
that a killed machine is dropped within seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelerando.commands import launch
from accelerando.core.settings import Sourced, resolve, resolve_runtime_settings
from accelerando.core.settings.fields import machine_range
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.plan import Command, build, check_settings, machine_counts
from accelerando.test_utils.distributed import get_free_port

CPU_BOX = MachineInfo(gpu_count=0, cpu_count=8, python="py")
TRAIN = Command("train.py")
# join: the whole rendezvous; last_call: the wait for more machines once MIN joined; keep-alive 1 s x 3:
# a machine whose agent stopped beating is dropped after 3 s.
RDZV_CONF = (
    "join_timeout=120,last_call_timeout=5,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"
)


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def settings_of(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}], warn_sources=())


def plan_for(**values):
    return build(settings_of(**values), TRAIN, CPU_BOX, port=lambda: 12345)


def option(agent: list[str], name: str) -> str:
    return agent[agent.index(name) + 1]


# --- parsing and the plan --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "resolved", "counts"),
    [
        ("1:2", "1:2", (1, 2)),
        (" 2 : 4 ", "2 : 4", (2, 4)),
        ("3", 3, (3, 3)),
        (2, 2, (2, 2)),
        ("2:2", "2:2", (2, 2)),
    ],
)
def test_num_machines_takes_a_count_or_a_range_from_every_layer(raw, resolved, counts):
    settings = settings_of(num_machines=raw)
    assert settings.num_machines == resolved
    assert machine_counts(settings) == counts == machine_range(resolved)
    from_env = resolve_runtime_settings(environ={"ACCELERANDO_NUM_MACHINES": "1:3"})
    assert machine_counts(from_env) == (1, 3)


def test_a_range_in_a_config_file_is_read(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text('num_machines: "1:2"\nmain_process_ip: 10.0.0.1\nuse_cpu: true\n')
    parser = launch.build_parser()
    args = launch.parse(parser, ["--config_file", str(config), "t.py"])
    settings, plan = launch._plan_for(args)
    assert settings.source("num_machines") == f"config:{config}"
    assert (plan.min_machines, plan.num_machines) == (1, 2)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"num_machines": "1.5:2"}, r"'1.5:2'.*integer >= 1 or 'MIN:MAX'"),
        ({"num_machines": "a:2"}, r"'a:2'.*integer >= 1 or 'MIN:MAX'"),
        ({"num_machines": "1:2:3"}, r"'1:2:3'"),
    ],
)
def test_a_value_that_is_not_a_count_or_a_range_is_refused_when_resolved(values, expected):
    with pytest.raises(ValueError, match=expected):
        settings_of(**values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"num_machines": "3:2", "main_process_ip": "h"}, r"MIN 3 is above MAX 2.*--num_machines 2:3"),
        ({"num_machines": "0:2", "main_process_ip": "h"}, r"MIN is 0.*at least 1 machine.*1:2"),
        (
            {"num_machines": "1:2", "main_process_ip": "h", "rdzv_backend": "static"},
            r"1:2 lets the machine count change.*'static'.*--rdzv_backend c10d",
        ),
        (
            {"num_machines": "1:2", "main_process_ip": "h", "num_processes": 3},
            r"num_processes \(from cli:--num_processes\)=3.*MAX=2.*multiple of 2",
        ),
        (
            {"num_machines": "1:2", "main_process_ip": "h", "machine_rank": 2},
            r"machine_rank.*below num_machines=2",
        ),
        ({"num_machines": "1:2"}, r"needs the address of machine 0.*--main_process_ip"),
        (
            {"num_machines": "1:2", "main_process_ip": "h", "use_deepspeed": True},
            r"1:2: DeepSpeed's pdsh runner.*--deepspeed_multinode_launcher standard",
        ),
    ],
)
def test_impossible_ranges_are_refused_naming_the_numbers_and_the_fix(values, expected):
    with pytest.raises(ValueError, match=expected):
        check_settings(settings_of(**values), CPU_BOX)


def test_a_range_with_mpirun_is_refused(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    with pytest.raises(ValueError, match=r"1:2: mpirun.*fixed set of hosts"):
        check_settings(
            settings_of(num_machines="1:2", main_process_ip="h", mpirun_hostfile=str(hostfile)), CPU_BOX
        )


def test_a_range_runs_the_elastic_agent_with_min_max_nodes_on_c10d():
    plan = plan_for(num_machines="1:2", main_process_ip="10.0.0.1", num_processes=4, cpu=True)
    agent = plan.agent_args
    assert plan.mode == "elastic" and plan.elastic_range
    assert (plan.min_machines, plan.num_machines, plan.num_processes, plan.nproc_per_node) == (1, 2, 4, 2)
    assert option(agent, "--nnodes") == "1:2"
    assert option(agent, "--nproc_per_node") == "2"
    assert option(agent, "--rdzv_backend") == "c10d"
    assert option(agent, "--rdzv_endpoint") == "10.0.0.1:29500"
    assert option(agent, "--rdzv_id") == "accelerando-29500"  # the same on every machine
    assert "--master_addr" not in agent
    # the launch's rendezvous timings (settings rdzv_last_call_timeout 5, rdzv_peer_timeout 15 = 5 s x 3)
    assert (
        option(agent, "--rdzv_conf") == "last_call_timeout=5,keep_alive_interval=5,keep_alive_max_attempt=3"
    )
    assert "--node_rank" not in agent  # the rendezvous ranks the machines in the order they join
    assert any("elastic range 1:2" in note and "rdzv_backend not given" in note for note in plan.notes)
    # torch's own parser reads the agent's options as given
    from torch.distributed.run import config_from_args, parse_args

    config, _cmd, _args = config_from_args(parse_args(agent))
    assert (config.min_nodes, config.max_nodes, config.rdzv_backend) == (1, 2, "c10d")


def test_a_machine_other_than_0_never_hosts_the_rendezvous_store():
    timing = "keep_alive_interval=5,keep_alive_max_attempt=3"
    plan = plan_for(num_machines="1:2", machine_rank=1, main_process_ip="h", rdzv_conf="last_call_timeout=2")
    assert option(plan.agent_args, "--rdzv_conf") == f"last_call_timeout=2,is_host=false,{timing}"
    kept = plan_for(num_machines="1:2", machine_rank=1, main_process_ip="h", rdzv_conf="is_host=true")
    assert option(kept.agent_args, "--rdzv_conf") == f"is_host=true,last_call_timeout=5,{timing}"
    first = plan_for(num_machines="1:2", machine_rank=0, main_process_ip="h").agent_args
    assert "is_host" not in option(first, "--rdzv_conf")


def test_a_fixed_count_is_planned_exactly_as_before():
    for value in (2, "2", "2:2"):
        plan = plan_for(num_machines=value, main_process_ip="h", num_processes=4, cpu=True)
        agent = plan.agent_args
        assert not plan.elastic_range and plan.min_machines is None
        assert option(agent, "--nnodes") == "2" and option(agent, "--master_addr") == "h"
        assert "--rdzv_id" not in agent and "--rdzv_backend" not in agent
        assert plan.env["ACCELERANDO_NUM_PROCESSES"] == "4" and plan.env["ACCELERANDO_NUM_MACHINES"] == "2"
        assert "Topology: 4 process(es) on 2 machine(s)" in plan.describe()


def test_the_processes_read_their_count_from_the_agent_not_the_launcher():
    plan = plan_for(num_machines="1:2", main_process_ip="h", num_processes=2, cpu=True)
    assert "ACCELERANDO_NUM_PROCESSES" not in plan.env and "ACCELERATE_NUM_PROCESSES" not in plan.env
    assert plan.env["ACCELERANDO_NUM_MACHINES"] == "1:2"
    inside = resolve_runtime_settings(environ=dict(plan.env))  # what each process resolves
    assert machine_counts(inside) == (1, 2)


def test_dry_run_shows_the_range(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    argv = ["--dry-run", "--cpu", "--num_machines", "1:2",
            "--main_process_ip", "127.0.0.1", "--num_processes", "2", "t.py"]  # fmt: skip
    assert launch.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 to 2 process(es) on 1 to 2 machine(s) (elastic range 1:2" in out
    assert "--nnodes 1:2" in out and "--rdzv_backend c10d" in out


def test_bad_ranges_exit_2_with_the_message(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    argv = ["--num_machines", "4:2", "t.py"]
    assert launch.main(argv) == 2
    assert "MIN 4 is above MAX 2" in capsys.readouterr().err


# --- job files ---------------------------------------------------------------------------------------


def test_kubernetes_elastic_policy_takes_the_range():
    import yaml

    from accelerando.launchers.emit import emit_job

    settings = settings_of(num_machines="2:4", num_processes=8, emit="kubernetes", emit_image="img", cpu=True)
    manifest = yaml.safe_load(emit_job(settings, TRAIN))
    policy = manifest["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["rdzvBackend"]) == (2, 4, "c10d")
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4
    args = worker["template"]["spec"]["containers"][0]["args"]
    assert option(args, "--num_machines") == "2:4" and option(args, "--num_processes") == "8"


def test_sbatch_asks_for_min_to_max_nodes_and_lets_a_lost_node_go():
    from accelerando.launchers.emit import emit_job

    text = emit_job(settings_of(num_machines="2:4", num_processes=8, emit="slurm", cpu=True), TRAIN)
    assert "#SBATCH --nodes=2-4" in text
    assert '--num_machines "2:$SLURM_NNODES"' in text and "--rdzv_backend c10d" in text
    assert "--kill-on-bad-exit=0" in text
    fixed = emit_job(settings_of(num_machines=2, num_processes=4, emit="slurm", cpu=True), TRAIN)
    assert "#SBATCH --nodes=2\n" in fixed and "--kill-on-bad-exit=1" in fixed


# --- real launches on the loopback ------------------------------------------------------------------

PROBE = """\
import json, os, sys
import torch
from accelerando import Accelerator
acc = Accelerator(cpu=True)
total = torch.tensor([acc.process_index + 1.0])
if acc.num_processes > 1:
    torch.distributed.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as handle:
    json.dump({"world": acc.num_processes, "sum": total.item(), "world_env": os.environ["WORLD_SIZE"],
               "machines": os.environ.get("ACCELERANDO_NUM_MACHINES"),
               "processes": os.environ.get("ACCELERANDO_NUM_PROCESSES")}, handle)
"""

# argv: project folder, output folder, steps in all. A checkpoint every 4 steps; the step counter is
# saved with it. Machine 1's process stops after the checkpoint of step 8 and says so (the test kills
# its machine) while machine 0 waits in the next step's all-reduce, which then fails; machine 0's agent
# restarts it alone, and auto_resume loads the checkpoint of step 8.
TRAIN_SCRIPT = """\
import json, os, sys, time
import torch
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration, set_seed

project, out, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
EVERY, STOP_AT = 4, 8


class Counter:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


set_seed(0)
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=project,
                                                                automatic_checkpoint_naming=True, total_limit=3))
counter = Counter()
acc.register_for_checkpointing(counter)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = acc.prepare(model, opt)
machine = int(os.environ["ACCELERANDO_MACHINE_RANK"])
try_number = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.path.join(out, f"start-m{machine}-try{try_number}.json"), "w") as handle:
    json.dump({"world": acc.num_processes, "world_env": int(os.environ["WORLD_SIZE"]), "step": counter.step,
               "resumed": acc.resume_point is not None}, handle)
while counter.step < total:
    g = torch.Generator().manual_seed(counter.step * 100 + acc.process_index)
    x = torch.randn(8, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    counter.step += 1
    if counter.step % EVERY == 0:
        acc.save_state()
    if counter.step == STOP_AT and try_number == 0:
        acc.wait_for_everyone()  # the checkpoint of STOP_AT is complete on both machines
        if machine == 1:
            open(os.path.join(out, "machine1-ready-to-die"), "w").close()
            time.sleep(600)
if acc.is_main_process:
    with open(os.path.join(out, "done.json"), "w") as handle:
        json.dump({"steps": counter.step, "world": acc.num_processes, "try": try_number}, handle)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "PET_"))}
    env.update(ACCELERANDO_CONFIG_FILE=os.devnull, OMP_NUM_THREADS="1",
               XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))  # fmt: skip
    return env


def _machine(tmp_path: Path, port: int, rank: int | None, *args: str, flags: tuple[str, ...] = ()):
    """One `accelerando launch --num_machines 1:2` in a session of its own (so its whole group can be killed).

    Its output goes to ``machine<rank>.log`` (a file: a pipe would stay open while any process it
    started lives).
    """
    ranked = ("--machine_rank", str(rank)) if rank is not None else ()
    argv = [sys.executable, "-m", "accelerando.commands.launch", "-q", "--cpu", "--num_machines", "1:2", *ranked,
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--rdzv_conf", RDZV_CONF,
            *flags, *args]  # fmt: skip
    with open(tmp_path / f"machine{rank or 0}.log", "w") as log:
        machine = subprocess.Popen(argv, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    machine.log = tmp_path / f"machine{rank or 0}.log"  # type: ignore[attr-defined]
    return machine


def _finish(machines: list[subprocess.Popen], timeout: float = 400) -> list[str]:
    """Wait for the launches (killing what is left after ``timeout``); their outputs."""
    deadline = time.monotonic() + timeout
    try:
        for machine in machines:
            try:
                machine.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for machine in machines:
            if machine.poll() is None:
                os.killpg(machine.pid, signal.SIGKILL)
                machine.wait()
    return [machine.log.read_text()[-4000:] for machine in machines]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_one_machine_of_a_1_to_2_range_trains_alone_after_the_last_call(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    machine = _machine(tmp_path, get_free_port(), None, str(tmp_path / "probe.py"), str(tmp_path))
    (output,) = _finish([machine])
    assert machine.returncode == 0, output
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report == {"world": 1, "sum": 1.0, "world_env": "1", "machines": "1:2", "processes": None}
    assert not (tmp_path / "rank1.json").exists()


@pytest.mark.slow
def test_two_machines_of_a_1_to_2_range_form_one_group_of_two(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    port = get_free_port()
    # Machine 1 first: it waits for machine 0's store (is_host=false), so both join the same round.
    machines = [_machine(tmp_path, port, 1, str(tmp_path / "probe.py"), str(tmp_path))]
    machines.insert(0, _machine(tmp_path, port, 0, str(tmp_path / "probe.py"), str(tmp_path)))
    outputs = _finish(machines)
    assert [m.returncode for m in machines] == [0, 0], outputs
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["world"], r["world_env"], r["sum"], r["machines"]) for r in reports] == [
        (2, "2", 3.0, "1:2")
    ] * 2


@pytest.mark.slow
def test_a_killed_machine_leaves_the_other_to_resume_alone_from_the_last_checkpoint(tmp_path: Path) -> None:
    script, project, out = tmp_path / "train.py", tmp_path / "project", tmp_path / "out"
    script.write_text(TRAIN_SCRIPT)
    out.mkdir()
    port = get_free_port()
    flags = ("--max_restarts", "1", "--auto_resume")
    args = (str(script), str(project), str(out), "16")
    machine1 = _machine(tmp_path, port, 1, *args, flags=flags)
    machine0 = _machine(tmp_path, port, 0, *args, flags=flags)
    deadline = time.monotonic() + 400
    while not (out / "machine1-ready-to-die").exists():
        if machine0.poll() is not None or machine1.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"machine 1 never reached step 8: {_finish([machine0, machine1], 1)}")
        time.sleep(0.2)
    os.killpg(machine1.pid, signal.SIGKILL)  # the launcher, its agent and its process
    machine1.wait()
    output, _ = _finish([machine0, machine1])
    assert machine0.returncode == 0, output
    first = [json.loads((out / f"start-m{m}-try0.json").read_text()) for m in (0, 1)]
    assert [(s["world"], s["step"], s["resumed"]) for s in first] == [(2, 0, False)] * 2
    again = json.loads((out / "start-m0-try1.json").read_text())
    # Alone now, from the checkpoint of step 8 (the last both machines wrote), not from step 0.
    assert (again["world"], again["world_env"], again["step"], again["resumed"]) == (1, 1, 8, True)
    assert not (out / "start-m1-try1.json").exists()
    assert json.loads((out / "done.json").read_text()) == {"steps": 16, "world": 1, "try": 1}
