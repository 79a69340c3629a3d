"""An unchanged accelerando script on a real local Ray cluster (2 CPUs, loopback), started by this module.

- ``accelerando launch --ray ADDRESS``: the same losses, bit for bit, as ``accelerando launch
  --num_processes 2``; a SIGKILLed process restarts every process (``--max_restarts``) and, with
  ``auto_resume``, ends with every loss and the final weights of the uninterrupted run; a failing process
  gives the launch its exit code and a one-line summary naming it.
- Ray Train: the same script run by a ``TorchTrainer``'s ``train_func`` uses Ray's process group (no
  second one), reports each ``save_state`` as a Ray checkpoint, and after a killed worker Ray's
  ``FailureConfig(max_failures=1)`` + ``auto_resume`` end with the same losses.

Slow (a Ray cluster and five 2-process trainings, about 6 minutes on 2 cores):
``python -m pytest -q -m slow tests/engines/test_ray_cluster.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="launcher signals are Linux's"),
]

# argv: project folder, output folder, fault ("none" | "kill" | "exit"), fault step.
# 2 epochs of 8 steps per process, a checkpoint every 4 steps, dropout (global RNG), a shuffled sampler and
# momentum: what a resume must restore to go on bit-exactly. Each loss is appended to out/loss_<rank>.txt
# (float.hex: exact); the last line written for a step is the one that counts after a restart.
TRAIN = """\
import os, signal, sys, time
import torch
import torch.distributed as dist
from accelerando import Accelerator
from accelerando.core.runtime import current_process
from accelerando.utils import ProjectConfiguration, set_seed

project, out, fault, fault_step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
EPOCHS, EVERY = 2, 4
group_before = dist.group.WORLD if dist.is_initialized() else None
set_seed(0)
acc = Accelerator(project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True,
                                                      total_limit=2))
rank = acc.process_index
with open(os.path.join(out, f"env_{rank}.txt"), "a") as f:
    same = group_before is None or dist.group.WORLD is group_before
    f.write(f"{current_process().cluster.name} {acc.num_processes} {group_before is not None} {same}\\n")
if fault == "exit" and rank == 1:
    sys.exit(3)
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 16, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
dl = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, opt, dl = acc.prepare(model, opt, dl)
point = acc.resume_point
first_try = not os.path.exists(os.path.join(out, "fault.done"))
start_epoch = point.epoch if point else 0
step = start_epoch * len(dl) + (point.dataloaders[0][1] if point else 0)
if point is not None and acc.is_main_process:
    with open(os.path.join(out, "resumed"), "a") as f:
        f.write(f"{step}\\n")
trained_again = point is None
for epoch in range(start_epoch, EPOCHS):
    for xb, yb in dl:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        if not trained_again and acc.is_main_process:  # the first step trained after the restart
            with open(os.path.join(out, "training_again"), "w") as f:
                f.write(repr(time.time()))
            trained_again = True
        with open(os.path.join(out, f"loss_{rank}.txt"), "a") as f:
            f.write(f"{step} {loss.item().hex()}\\n")
        if step % EVERY == 0:
            acc.save_state()
        if fault == "kill" and first_try and step == fault_step and rank == 1:
            with open(os.path.join(out, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            open(os.path.join(out, "fault.done"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
if acc.is_main_process:
    torch.save(acc.unwrap_model(model).state_dict(), os.path.join(out, "final.pt"))
print(f"finished rank {rank} at step {step}", flush=True)
"""

STEPS = 16


def _cli() -> list[str]:
    exe = shutil.which("accelerando")
    return [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "RAY_ADDRESS"))
    }
    env.update(OMP_NUM_THREADS="1", ACCELERANDO_CONFIG_FILE=os.devnull)
    return env


def _run(tmp_path: Path, name: str, flags: list[str], fault: str = "none", step: int = 0, timeout: int = 600):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    project, out = tmp_path / name / "project", tmp_path / name / "out"
    out.mkdir(parents=True)
    argv = [*_cli(), "launch", "--cpu", "--num_processes", "2", "--auto_resume", *flags,
            str(script), str(project), str(out), fault, str(step)]  # fmt: skip
    result = subprocess.run(argv, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    return result, out


def losses(out: Path) -> dict[tuple[int, int], str]:
    """(rank, step) -> the loss's hex text; a step trained twice (before a kill and after) counts its last."""
    found = {}
    for rank in (0, 1):
        for line in (out / f"loss_{rank}.txt").read_text().splitlines():
            step, value = line.split()
            found[(rank, int(step))] = value
    return found


def _same_weights(a: Path, b: Path) -> None:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster with 2 CPUs on 127.0.0.1; its address (host:port of its GCS)."""
    import ray

    folder = tmp_path_factory.mktemp("ray")
    os.environ["OMP_NUM_THREADS"] = "1"
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             _temp_dir=str(folder / "tmp"))  # fmt: skip
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The losses and final weights of `accelerando launch --num_processes 2` (no Ray)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    result, out = _run(tmp_path, "local", [])
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(out)) == 2 * STEPS
    return out


def test_ray_launch_gives_the_losses_of_a_local_launch_bit_for_bit(tmp_path, cluster, reference) -> None:
    result, out = _run(tmp_path, "ray", ["--ray", cluster])
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(out) == losses(reference)
    _same_weights(out / "final.pt", reference / "final.pt")
    # each process ran as under torchrun (a process group of 2 made by accelerando), its output came back
    for rank in (0, 1):
        assert (out / f"env_{rank}.txt").read_text() == "torchrun 2 False True\n"
        assert f"finished rank {rank} at step {STEPS}" in result.stdout


def test_a_killed_ray_process_restarts_every_process_and_resumes_exactly(
    tmp_path, cluster, reference
) -> None:
    result, out = _run(tmp_path, "killed", ["--ray", cluster, "--max_restarts", "1"], "kill", 10)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "killed_at").exists()
    assert "accelerando launch: process 1 (on " in result.stderr
    assert "was killed by signal 9 (SIGKILL)" in result.stderr
    assert "restarting every process (1 of 1 restarts" in result.stderr
    assert (out / "resumed").read_text().split() == ["8"]  # the checkpoint of step 8, not step 0
    assert losses(out) == losses(reference)
    _same_weights(out / "final.pt", reference / "final.pt")


def test_a_failing_ray_process_gives_its_exit_code_and_a_summary(tmp_path, cluster) -> None:
    result, _out = _run(tmp_path, "exit", ["--ray", cluster], "exit", 0)
    assert result.returncode == 3, result.stderr[-3000:]
    summary = [line for line in result.stderr.splitlines() if "process(es) failed in all" in line]
    assert len(summary) == 1 and "process 1 (on " in summary[0], result.stderr[-3000:]
    assert "failed with exit code 3" in summary[0]


# The script, unchanged, as a Ray Train train_func (made from text: Ray ships it by value to its workers).
TRAIN_FUNC = """\
def train_func(config):
    import os, runpy, sys
    os.environ["ACCELERANDO_AUTO_RESUME"] = "true"  # the setting --auto_resume gives a launch
    sys.argv = [config["script"], config["project"], config["out"], "kill", "10"]
    runpy.run_path(config["script"], run_name="__main__")
"""


def test_the_script_inside_ray_train_uses_rays_group_reports_checkpoints_and_resumes(
    tmp_path, cluster, reference
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    script, project, out = tmp_path / "train.py", tmp_path / "project", tmp_path / "out"
    script.write_text(TRAIN)
    out.mkdir()
    namespace: dict = {"__name__": "accelerando_ray_train_test_func"}
    exec(TRAIN_FUNC, namespace)  # noqa: S102 - the test's own text
    trainer = TorchTrainer(
        namespace["train_func"],
        train_loop_config={"script": str(script), "project": str(project), "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name="run", storage_path=str(tmp_path / "storage"), failure_config=FailureConfig(max_failures=1)
        ),
    )
    result = trainer.fit()
    assert result.error is None
    assert (out / "killed_at").exists()
    # every try: Ray Train's environment, Ray's group of 2 adopted, not a second one
    for rank in (0, 1):
        lines = (out / f"env_{rank}.txt").read_text().splitlines()
        assert lines == ["ray_train 2 True True"] * 2, lines
    assert (out / "resumed").read_text().split() == ["8"]
    assert losses(out) == losses(reference)
    _same_weights(out / "final.pt", reference / "final.pt")
    # each save_state was reported as a Ray checkpoint, under its own name
    assert result.checkpoint is not None
    assert Path(result.checkpoint.path).name == "checkpoint_3"
    assert result.metrics["checkpoint"] == "checkpoint_3"
    stored = Path(result.checkpoint.path)
    assert (stored / "model.safetensors").is_file() and (stored / "checkpoint_manifest.json").is_file()
    assert sorted(p.name for p in stored.parent.glob("checkpoint_*") if p.is_dir()) == [
        f"checkpoint_{i}" for i in range(4)
    ]
