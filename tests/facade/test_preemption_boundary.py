"""A preemption checkpoint keeps the script's bookkeeping: the quickstart, preempted and resumed, ends
as the uninterrupted run does (step count, accuracy and weights, bitwise).

The quickstart (examples/quickstart.py, unchanged) runs in a real process under a small wrapper that
raises SIGTERM in the process itself at its k-th optimizer step (deterministic, inside the
``accumulate`` block) and saves the final weights when the script calls ``end_training``. The
checkpoint is taken at the next batch boundary, after the script's ``steps.value += 1``: taken at the
block's exit, it lost that step and the resumed run ended one optimizer step short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import latest_checkpoint, resume_point
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
EPOCHS, BATCHES = 3, 16  # --batch_size 256 over the quickstart's 4096 samples
STEPS = EPOCHS * BATCHES

WRAPPER = """\
import os, runpy, signal, sys
import torch
from accelerando import Accelerator

preempt_at, out, quickstart = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class AdamW(torch.optim.AdamW):  # the quickstart's optimizer, raising SIGTERM at its k-th step
    steps = 0

    def step(self, *args, **kwargs):
        result = super().step(*args, **kwargs)
        AdamW.steps += 1
        if AdamW.steps == preempt_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return result


def end_training(self, _original=Accelerator.end_training):
    model = self.unwrap_model(self._models[0])
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))
    _original(self)


torch.optim.AdamW = AdamW
Accelerator.end_training = end_training
sys.argv = [quickstart, *sys.argv[4:]]
runpy.run_path(quickstart, run_name="__main__")
"""


def _run(tmp_path: Path, name: str, preempt_at: int, *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", ACCELERANDO_PREEMPTION_CHECKPOINT="1")
    argv = [sys.executable, str(wrapper), str(preempt_at), str(out), str(QUICKSTART),
            "--epochs", str(EPOCHS), "--batch_size", "256", "--project_dir", str(out / "project"), *flags]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300), out


def _metrics(result: subprocess.CompletedProcess) -> dict[str, object]:
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("METRICS ")]
    return json.loads(line.removeprefix("METRICS "))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    result, out = _run(tmp_path_factory.mktemp("uninterrupted"), "plain", 0)
    metrics = _metrics(result)
    assert metrics["optimizer_steps"] == STEPS
    return metrics, out / "final.pt"


# Optimizer steps of epoch 1 (17..32): its first batch, two in the middle, its last batch. (The first
# step of the run is not a position: until a step has ended, SIGTERM keeps its usual meaning.)
POSITIONS = [BATCHES + 1, BATCHES + 8, 2 * BATCHES - 1, 2 * BATCHES]


@pytest.mark.slow  # 9 quickstart runs, ~4 s each
@pytest.mark.parametrize("preempt_at", POSITIONS)
def test_quickstart_preempted_and_resumed_ends_as_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: tuple[dict[str, object], Path], preempt_at: int
) -> None:
    expected, expected_weights = uninterrupted
    result, out = _run(tmp_path, "preempted", preempt_at)
    assert result.returncode == 143, result.stderr[-3000:]
    assert "SIGTERM received; checkpoint" in result.stderr
    assert not (out / "final.pt").exists()
    # The checkpoint holds the script's count of the step the signal came in (its loop body ran).
    (checkpoint,) = (out / "project" / "checkpoints").glob("checkpoint_*")
    saved = torch.load(checkpoint / "custom_checkpoint_0.pkl", weights_only=False)
    assert saved == {"value": preempt_at}

    resumed, out = _run(tmp_path, "preempted", 0, "--resume")
    assert f"skipping {preempt_at - BATCHES} batches" in resumed.stdout or preempt_at == 2 * BATCHES
    assert _metrics(resumed) == expected  # optimizer_steps, accuracy, eval_samples
    weights, reference = torch.load(out / "final.pt"), torch.load(expected_weights)
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[key], reference[key]) for key in weights)


# ------------------------------------------------------------------ in one process (default suite)
class Counter:
    """The script's step counter, registered for checkpointing."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = int(state["value"])


@pytest.fixture
def signals_restored(fresh_state: None, isolated_env: None) -> Iterator[None]:
    """The preemption watch installs handlers in this (pytest's) process: put the previous ones back."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _setup(
    project: Path, prepared_loader: bool
) -> tuple[Accelerator, torch.nn.Module, object, object, Counter]:
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True),
    )
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 2)), batch_size=4)
    model, optimizer = accelerator.prepare(model, optimizer)
    if prepared_loader:
        loader = accelerator.prepare(loader)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, loader, counter


def _train_until_preempted(project: Path, preempt_at: int, prepared_loader: bool) -> int:
    """Two epochs of 8 batches; SIGTERM inside the block of step ``preempt_at``; returns the exit code."""
    accelerator, model, optimizer, loader, counter = _setup(project, prepared_loader)
    with pytest.raises(SystemExit) as stopped:
        for _epoch in range(2):
            for (inputs,) in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(inputs).sum())
                    optimizer.step()
                    optimizer.zero_grad()
                    if counter.value + 1 == preempt_at:
                        os.kill(os.getpid(), signal.SIGTERM)
                counter.value += 1  # the loop body after the block: part of the checkpoint
    return int(stopped.value.code)


@pytest.mark.usefixtures("signals_restored")
@pytest.mark.parametrize(("preempt_at", "resume_at"), [(2, (0, 2)), (5, (0, 5)), (8, (1, 0)), (16, (2, 0))])
def test_the_checkpoint_waits_for_the_loader_to_be_asked_for_the_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preempt_at: int, resume_at: tuple[int, int]
) -> None:
    monkeypatch.setenv("ACCELERANDO_PREEMPTION_CHECKPOINT", "1")
    assert _train_until_preempted(tmp_path, preempt_at, prepared_loader=True) == 143
    accelerator, _, _, _, counter = _setup(tmp_path, prepared_loader=True)
    accelerator.load_state(latest_checkpoint(tmp_path))
    point = resume_point(accelerator)
    assert counter.value == preempt_at  # the script's count of the step it stopped after
    assert (point.epoch, point.batches_to_skip) == resume_at  # and no batch of the next step taken


@pytest.mark.usefixtures("signals_restored")
def test_without_a_prepared_loader_the_next_accumulate_entry_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERANDO_PREEMPTION_CHECKPOINT", "1")
    assert _train_until_preempted(tmp_path, 3, prepared_loader=False) == 143
    accelerator, _, _, _, counter = _setup(tmp_path, prepared_loader=False)
    accelerator.load_state(latest_checkpoint(tmp_path))
    assert counter.value == 3
