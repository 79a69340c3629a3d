"""``Trainer.evaluate()`` on a dataset whose length the batch size does not divide: the real accelerate's loss.

transformers' evaluation loop repeats each batch's mean loss to the eval batch size and gathers it
with ``gather_for_metrics``; on the short last batch only ``GradientState().remainder`` of those
copies may stay, or the last batch weighs as much as a full one. 66 rows at 8 per device leave 2
rows for the last step, on one process and on two. Each side runs in a fresh interpreter (ours on
the stand-in, the reference with ``--accelerate reference``, no stand-in), on the same seeded model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_scenario, xfail_if_trainer_cannot_import

pytest.importorskip("transformers")

FLAGS = ("--eval_only", "--eval_samples", "66", "--eval_batch", "8")


def _eval_losses(tmp_path: Path, processes: int) -> tuple[list[float], list[float]]:
    xfail_if_trainer_cannot_import()
    pytest.importorskip("accelerate")
    ours = run_scenario(tmp_path / "ours", *FLAGS, processes=processes)
    reference = run_scenario(tmp_path / "reference", *FLAGS, "--accelerate", "reference", processes=processes)
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine["accelerator_module"].startswith("accelerando"), mine["accelerator_module"]
        assert theirs["accelerator_module"].startswith("accelerate."), theirs["accelerator_module"]
        assert mine["world"] == theirs["world"] == processes
    return [r["eval_a"]["eval_loss"] for r in ours], [r["eval_a"]["eval_loss"] for r in reference]


@pytest.mark.slow  # two fresh interpreters importing transformers (~25 s on 2 shared cores)
def test_trainer_eval_loss_with_a_short_last_batch_one_process(tmp_path: Path) -> None:
    ours, reference = _eval_losses(tmp_path, processes=1)
    assert abs(ours[0] - reference[0]) <= 1e-6, (ours, reference)


@pytest.mark.slow  # two 2-process launches
def test_trainer_eval_loss_with_a_short_last_batch_two_processes(tmp_path: Path) -> None:
    ours, reference = _eval_losses(tmp_path, processes=2)
    assert ours[0] == ours[1]
    assert abs(ours[0] - reference[0]) <= 1e-6, (ours, reference)
