"""Time from a worker kill to training again: ``accelerando launch --max_restarts 1 --auto_resume``.

Two CPU processes (gloo) train a small MLP, saving a checkpoint every 4 steps; after step 10 rank 1
kills itself (SIGKILL). The launcher's elastic agent notices, stops the survivor, starts both
processes again, and ``auto_resume`` loads the step-8 checkpoint in ``prepare``. Each phase is
stamped with wall-clock time by the processes themselves and printed relative to the kill:

- survivor's error: the survivor's collective fails (its peer's connection is gone);
- survivor's exit hooks: the survivor's last exit hook ran (its process group is torn down);
- restarted: the first line of the training script runs again (interpreter and launcher shim up);
- imported: torch and accelerando imported;
- prepared: ``Accelerator()`` + ``prepare()`` done (process group, checkpoint loaded, loader positioned);
- training again: the first optimizer step after the restart has finished.

Usage: ``python benchmarks/bench_restart.py [--repeats N]`` (Linux; a few minutes on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = """\
import atexit, os, sys, time
out = sys.argv[2]
try_number, rank = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), os.environ.get("RANK", "0")

def stamp(name):
    with open(os.path.join(out, f"{name}.{try_number}.{rank}"), "w") as f:
        f.write(repr(time.time()))

stamp("restarted")
atexit.register(stamp, "exit_hooks")  # registered first: runs after the process group's own hook
previous_hook = sys.excepthook
def hook(*exc):
    stamp("error")
    previous_hook(*exc)
sys.excepthook = hook
import torch
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration, set_seed
stamp("imported")
set_seed(0)
acc = Accelerator(project_config=ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True,
                                                      total_limit=2))
x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8,
                                 shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, opt, dl = acc.prepare(model, opt, dl)
stamp("prepared")
step = acc.resume_point.dataloaders[0][1] if acc.resume_point else 0
for xb, yb in dl:
    with acc.accumulate(model):
        acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        opt.zero_grad()
    step += 1
    if try_number != "0" and not os.path.exists(os.path.join(out, f"training_again.{try_number}.{rank}")):
        stamp("training_again")
    if step % 4 == 0:
        acc.save_state()
    if try_number == "0" and step == 10 and acc.process_index == 1:
        stamp("killed")
        os.kill(os.getpid(), 9)
"""

PHASES = [
    ("survivor's error", "error.0.0"),
    ("survivor's exit hooks", "exit_hooks.0.0"),
    ("restarted", "restarted.1.0"),
    ("imported", "imported.1.0"),
    ("prepared", "prepared.1.0"),
    ("training again", "training_again.1.0"),
]


def one_run(folder: Path) -> dict[str, float]:
    """Run the killed launch once in ``folder``; return each phase's seconds after the kill."""
    script, out = folder / "train.py", folder / "out"
    script.write_text(TRAIN)
    out.mkdir()
    exe = shutil.which("accelerando")
    cli = [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env["OMP_NUM_THREADS"] = "1"
    argv = [*cli, "launch", "--cpu", "--num_processes", "2", "--max_restarts", "1", "--auto_resume",
            str(script), str(folder / "project"), str(out)]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"the launch failed ({result.returncode}):\n{result.stderr[-3000:]}")
    killed = float((out / "killed.0.1").read_text())
    return {name: float((out / file).read_text()) - killed for name, file in PHASES if (out / file).exists()}


def main() -> None:
    """Run the benchmark and print the median seconds after the kill of each phase."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    repeats = parser.parse_args().repeats
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as folder:
            runs.append(one_run(Path(folder)))
    print(f"seconds after the kill (median of {repeats}; load average {os.getloadavg()[0]:.1f}):")
    for name, _ in PHASES:
        values = [run[name] for run in runs if name in run]
        if values:
            print(f"  {name:<24}{statistics.median(values):7.2f}")


if __name__ == "__main__":
    main()
