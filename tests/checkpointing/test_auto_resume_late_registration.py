"""auto_resume restores objects registered after the first ``prepare()`` (issue 27, item 5).

The resume happens inside the first ``prepare()``; the reference's usual order registers custom objects
with ``register_for_checkpointing`` after it. Those objects are restored when registered, from the same
checkpoint, or the registration refuses with one clear message; never silently left at their start.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# argv: project folder, steps to run, number of counters registered after prepare.
SCRIPT = """\
import sys
import torch
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration

project, steps, counters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

class Counter:
    def __init__(self):
        self.value = 0
    def state_dict(self):
        return {"value": self.value}
    def load_state_dict(self, state):
        self.value = int(state["value"])

acc = Accelerator(project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True))
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
made = [Counter() for _ in range(counters)]
acc.register_for_checkpointing(*made)  # after prepare: the reference's usual order
print("START", [c.value for c in made], flush=True)
for _ in range(steps):
    for i, c in enumerate(made):
        c.value += i + 1
acc.save_state()
print("END", [c.value for c in made], flush=True)
"""


def _run(tmp_path, steps: int, counters: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(ACCELERANDO_AUTO_RESUME="1", OMP_NUM_THREADS="1")
    argv = [sys.executable, str(script), str(tmp_path / "project"), str(steps), str(counters)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


def _line(result: subprocess.CompletedProcess[str], tag: str) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith(tag))


@pytest.mark.timeout(400)
def test_a_counter_registered_after_prepare_is_restored_by_auto_resume(tmp_path) -> None:
    first = _run(tmp_path, 5, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _line(first, "END") == "END [5, 10]"
    second = _run(tmp_path, 3, 2)  # a fresh process: auto_resume loads checkpoint_0 in prepare()
    assert second.returncode == 0, second.stderr[-3000:]
    assert _line(second, "START") == "START [5, 10]"  # restored, not restarted at 0
    assert _line(second, "END") == "END [8, 16]"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_late_object_the_checkpoint_lacks_is_refused_with_the_order_to_follow(tmp_path) -> None:
    first = _run(tmp_path, 2, 1)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _run(tmp_path, 2, 2)  # a second counter the checkpoint never saw
    assert second.returncode != 0
    last = second.stderr.strip().splitlines()[-1]
    assert "custom_checkpoint_1.pkl" in last and "same order" in last, last
