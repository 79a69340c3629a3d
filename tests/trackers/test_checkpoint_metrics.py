"""save_state and the script's trackers: a TensorBoard event file and a W&B offline run, read back.

A training loop in the reference's ``complete_*_example`` style logs its loss at its own optimizer
step and saves mid-epoch and at every epoch's end. By default save_state logs nothing to the
trackers; with ``log_checkpoint_metrics`` the checkpoint size goes to ``accelerando/...`` at the
script's own step. Either way the script's history must come back complete and in order (W&B drops a
row logged at a lower step than the last one, which ``accelerator.step`` -- micro-batches, restarting
every epoch -- used to cause).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from accelerando import Accelerator
from accelerando.backends.trackers.base import CHECKPOINT_SIZE_KEY
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state", "isolated_env")

EPOCHS, BATCHES, SAVE_EVERY = 3, 8, 3  # saves at steps 3, 6 (mid-epoch), 8 (epoch end), 9, ...
STEPS = EPOCHS * BATCHES
# How the script logs: at each optimizer step, once per epoch at step=epoch (the reference's
# complete_nlp_example), or at each optimizer step without a step (the tracker counts).
PATTERNS = {"per_step": (STEPS, True), "per_epoch": (EPOCHS, True), "per_step_unnumbered": (STEPS, False)}


def _train(
    tmp_path: Path, log_with: str, init_kwargs: dict[str, dict[str, object]], pattern: str
) -> list[int]:
    """Train 3 epochs of 8 batches, logging as ``pattern`` says and saving mid-epoch and at each epoch end.

    Returns:
        For each save, the step the script's last log call gave (0 before the first one); unnumbered,
        the number of log calls made so far.
    """
    config = ProjectConfiguration(
        project_dir=str(tmp_path / "project"), automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(cpu=True, project_config=config, log_with=log_with)
    accelerator.init_trackers("run", init_kwargs=init_kwargs)
    data = torch.utils.data.TensorDataset(torch.randn(BATCHES * 4, 4), torch.randn(BATCHES * 4, 1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step, logged, saves = 0, 0, []
    for epoch in range(EPOCHS):
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if pattern != "per_epoch":
                logged = step if pattern == "per_step" else step + 1  # unnumbered: log calls so far
                accelerator.log({"loss": loss.item()}, step=step if pattern == "per_step" else None)
            step += 1
            if step % SAVE_EVERY == 0:
                accelerator.save_state()
                saves.append(logged)
        if pattern == "per_epoch":
            accelerator.log({"loss": loss.item(), "epoch": epoch}, step=epoch)
            logged = epoch
        accelerator.save_state()
        saves.append(logged)
    assert accelerator.step < step  # micro-batches of this epoch: what must never be the step
    accelerator.end_training()
    return saves


def _tensorboard(tmp_path: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "project" / "run"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "log_checkpoint_metrics"])
@pytest.mark.parametrize("pattern", ["per_step", "per_epoch"])
def test_tensorboard_keeps_every_row_of_the_script(
    tmp_path: Path, monkeypatch, opted_in: bool, pattern: str
) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    if opted_in:
        monkeypatch.setenv("ACCELERANDO_LOG_CHECKPOINT_METRICS", "1")
    saves = _train(tmp_path, "tensorboard", {}, pattern)
    scalars = _tensorboard(tmp_path)
    rows = PATTERNS[pattern][0]
    assert [step for step, _ in scalars["loss"]] == list(range(rows))  # complete and in order
    user_tags = ["epoch", "loss"] if pattern == "per_epoch" else ["loss"]
    if not opted_in:
        assert sorted(scalars) == user_tags  # nothing the script did not log
        return
    assert sorted(scalars) == sorted([CHECKPOINT_SIZE_KEY, *user_tags])
    checkpoints = scalars[CHECKPOINT_SIZE_KEY]
    assert [step for step, _ in checkpoints] == saves  # at the script's step, never going back
    assert saves == sorted(saves) and all(size > 0 for _, size in checkpoints)


def _wandb_history(tmp_path: Path) -> list[dict[str, object]]:
    from test_tracking_wandb import _read_until_exit  # the .wandb file reader next door
    from wandb.proto import wandb_internal_pb2

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        for record in _read_until_exit(run_file, wandb_internal_pb2.Record)
        if record.WhichOneof("record_type") == "history"
    ]


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "log_checkpoint_metrics"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_wandb_offline_keeps_every_row_of_the_script(
    tmp_path: Path, monkeypatch, opted_in: bool, pattern: str
) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    if opted_in:
        monkeypatch.setenv("ACCELERANDO_LOG_CHECKPOINT_METRICS", "1")
    saves = _train(tmp_path, "wandb", {"wandb": {"mode": "offline", "dir": str(tmp_path)}}, pattern)
    history = _wandb_history(tmp_path)
    rows, numbered = PATTERNS[pattern]
    assert [row["_step"] for row in history if "loss" in row] == list(range(rows))  # complete, in order
    assert [row["_step"] for row in history] == sorted(row["_step"] for row in history)
    marked = [row["_step"] for row in history if CHECKPOINT_SIZE_KEY in row]
    if not opted_in:
        assert marked == [] and len(history) == rows  # nothing the script did not log
    elif numbered:
        assert marked == sorted(set(saves)) and len(history) == rows  # joined the script's rows
    else:
        # Steps W&B counts itself: the size joins the row being written (the next one the script logs,
        # or after the last one a row of its own), so no row of the script's moves.
        assert len(marked) == len(set(saves))  # saves with no log call between them share a row
        assert len(history) == rows + 1


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "log_checkpoint_metrics"])
def test_dvclive_keeps_every_step_of_the_script(tmp_path: Path, monkeypatch, opted_in: bool) -> None:
    pytest.importorskip("dvclive", reason="dvclive is not installed (pip install dvclive)")
    monkeypatch.chdir(tmp_path)
    if opted_in:
        monkeypatch.setenv("ACCELERANDO_LOG_CHECKPOINT_METRICS", "1")
    saves = _train(tmp_path, "dvclive", {"dvclive": {"save_dvc_exp": False}}, "per_step")
    plots = {p.stem: p for p in tmp_path.rglob("dvclive/plots/metrics/**/*.tsv")}

    def steps(name: str) -> list[int]:
        rows = [line.split("\t") for line in plots[name].read_text().splitlines()[1:]]
        return [int(row[0]) for row in rows]

    assert steps("loss") == list(range(STEPS))  # complete and in order
    if not opted_in:
        assert sorted(plots) == ["loss"]
        return
    assert sorted(plots) == ["checkpoint_size_bytes", "loss"]
    assert steps("checkpoint_size_bytes") == saves  # at the script's step
