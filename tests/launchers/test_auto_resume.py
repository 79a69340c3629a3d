"""Faults of a real 2-process training run: a killed worker (elastic restart + auto_resume), a preemption
signal (checkpoint, exit 143, resume on the next launch), a hung collective (the watchdog names the rank).

Each faulty run's final weights are compared bitwise with an uninterrupted run of the same script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="launcher signals are Linux's")

# argv: project folder, output folder, fault ("none" | "kill" | "sigterm"), fault step.
# 2 epochs of 16 steps per process, a checkpoint every 4 steps, dropout (global RNG), a shuffled sampler,
# momentum and a step scheduler: everything a resume must restore to continue bit-exactly.
TRAIN = """\
import os, signal, sys, time
import torch
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration, set_seed

project, out, fault, fault_step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
EPOCHS, EVERY = 2, 4
set_seed(0)
acc = Accelerator(project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True,
                                                      total_limit=2))
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 16, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
dl = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
point = acc.resume_point
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and not os.path.exists(
    os.path.join(out, "fault.done"))
start_epoch = point.epoch if point else 0
step = start_epoch * len(dl) + (point.dataloaders[0][1] if point else 0)
if point is not None and acc.is_main_process:
    with open(os.path.join(out, "resumed"), "a") as f:
        f.write(f"{step}\\n")
resumed_logged = point is None
for epoch in range(start_epoch, EPOCHS):
    for xb, yb in dl:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        step += 1
        if not resumed_logged and acc.is_main_process:  # the first step trained after the restart
            with open(os.path.join(out, "training_again"), "w") as f:
                f.write(repr(time.time()))
            resumed_logged = True
        if step % EVERY == 0:
            acc.save_state()
        if fault == "kill" and first_attempt and step == fault_step and acc.process_index == 1:
            with open(os.path.join(out, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            open(os.path.join(out, "fault.done"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "sigterm" and first_attempt and step == fault_step and acc.is_main_process:
            open(os.path.join(out, "fault.done"), "w").close()
            os.kill(os.getppid(), signal.SIGTERM)  # the launcher (its elastic agent is our parent)
        if fault == "sigterm" and first_attempt and step >= fault_step:
            time.sleep(0.2)  # the signal travels launcher -> agent -> processes meanwhile
if acc.is_main_process:
    torch.save({k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()},
               os.path.join(out, "final.pt"))
    with open(os.path.join(out, "steps"), "w") as f:
        f.write(str(step))
"""

# Rank 1 sleeps in a function of its own while rank 0 waits for it in an all-reduce.
HUNG_COLLECTIVE = """\
import os, time
import torch
import torch.distributed as dist

def late_rank():
    time.sleep(600)

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    late_rank()
dist.all_reduce(torch.ones(1))
"""


# A restarted try on the store the launcher's agent kept from the previous try (torchelastic reuses it).
ATTEMPT_PREFIX = """\
import json, os, sys
import torch
from torch.distributed import TCPStore
from accelerando.core import process_group

agent = TCPStore("127.0.0.1", 0, 1, is_master=True, multi_tenant=True)  # the agent's store
os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # what the agent tells its processes
process_group.start(device=torch.device("cpu"), default_backend="gloo", main_address="127.0.0.1",
                    main_port=agent.port, rank=0, world_size=1, attempt=int(sys.argv[1]))
print(json.dumps(agent.list_keys()))  # what the group wrote: gloo's addresses among them
"""


def test_the_elastic_restart_count_is_read_by_the_cluster_environment():
    from accelerando.core.environments.torchrun import TorchElasticEnvironment

    job = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert TorchElasticEnvironment(job).restart_count == 0
    assert TorchElasticEnvironment({**job, "TORCHELASTIC_RESTART_COUNT": "3"}).restart_count == 3
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT"):
        _ = TorchElasticEnvironment({**job, "TORCHELASTIC_RESTART_COUNT": "x"}).restart_count


def test_each_restart_keeps_its_process_group_keys_apart_on_the_agents_store(tmp_path, env):
    script = tmp_path / "attempt.py"
    script.write_text(ATTEMPT_PREFIX)
    result = subprocess.run([sys.executable, str(script), "2"], env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    keys = json.loads(result.stdout.splitlines()[-1])
    assert keys, "the process group wrote nothing on the agent's store"
    assert all(key.startswith("accelerando/attempt_2/") for key in keys), keys


def test_resume_at_starts_the_next_iteration_at_the_position():
    import torch

    from accelerando.data_loader import prepare_data_loader

    data = torch.utils.data.TensorDataset(torch.arange(12.0))
    loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=2), put_on_device=False)
    loader.resume_at(4)
    assert [batch[0].tolist() for batch in loader] == [[8.0, 9.0], [10.0, 11.0]]
    assert [batch[0].tolist() for batch in loader][0] == [0.0, 1.0]  # the next epoch starts at 0
    with pytest.raises(ValueError, match="0 or more"):
        loader.resume_at(-1)


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    return clean


def cli() -> list[str]:
    exe = shutil.which("accelerando")
    return [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]


def _launch(tmp_path, env, name: str, fault: str, step: int, *flags: str, timeout: int = 240):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    project, out = tmp_path / name / "project", tmp_path / name / "out"
    out.mkdir(parents=True, exist_ok=True)
    argv = [*cli(), "launch", "--cpu", "--num_processes", "2", "--auto_resume", *flags,
            str(script), str(project), str(out), fault, str(step)]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return result, out


def _same_weights(a, b) -> None:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key
        assert left[key].dtype == right[key].dtype


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    environ["OMP_NUM_THREADS"] = "1"
    result, out = _launch(tmp_path, environ, "plain", "none", 0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "steps").read_text() == "32"
    assert not (out / "resumed").exists()
    return out / "final.pt"


@pytest.mark.slow
def test_a_killed_worker_restarts_from_the_last_checkpoint_and_ends_bit_exact(tmp_path, env, uninterrupted):
    result, out = _launch(tmp_path, env, "killed", "kill", 10, "--max_restarts", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "killed_at").exists()
    assert (out / "resumed").read_text().split() == ["8"]  # the checkpoint of step 8, not step 0
    assert (out / "steps").read_text() == "32"
    _same_weights(out / "final.pt", uninterrupted)
    took = float((out / "training_again").read_text()) - float((out / "killed_at").read_text())
    print(f"\nfrom the kill to training again: {took:.2f} s")


@pytest.mark.slow
def test_sigterm_checkpoints_exits_143_and_the_next_launch_resumes_bit_exact(tmp_path, env, uninterrupted):
    result, out = _launch(tmp_path, env, "preempted", "sigterm", 6)
    assert result.returncode == 143, result.stderr[-3000:]
    assert "SIGTERM received; checkpoint" in result.stderr
    assert not (out / "final.pt").exists()
    # the checkpoint was taken where the processes agreed to stop, and it is the newest one
    from accelerando.checkpointing import latest_checkpoint

    written = re.search(r"SIGTERM received; checkpoint (\S+) written", result.stderr).group(1)
    assert os.path.samefile(written, latest_checkpoint(tmp_path / "preempted" / "project"))
    result, out = _launch(tmp_path, env, "preempted", "sigterm", 6)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = int((out / "resumed").read_text().split()[0])
    assert 7 <= resumed < 32, resumed  # the step where every process agreed to stop
    _same_weights(out / "final.pt", uninterrupted)


@pytest.mark.slow
def test_a_hung_collective_names_the_rank_that_did_not_arrive(tmp_path, env):
    script = tmp_path / "hung.py"
    script.write_text(HUNG_COLLECTIVE)
    argv = [*cli(), "launch", "--cpu", "--num_processes", "2", "--hang_timeout", "3", str(script)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 124, result.stderr[-3000:]
    assert "process(es) 1 did not arrive." in result.stderr
    assert f'File "{script}", line 6 in late_rank' in result.stderr
