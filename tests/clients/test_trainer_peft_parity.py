"""transformers' Trainer and a peft LoRA model under Trainer on accelerando give the reference's losses and weights.

The same scenario script as the trl parity tests (``clients_support.SCRIPT``), run on the reference and
through ``install_as_accelerate()`` in fresh processes (``reference_pair.run_pair``): tiny Llama from a
config, data made here, an uneven last batch. Each test prints the issue's figures: max relative loss
difference, max weight difference and the wall-time ratio accelerando / reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import SCRIPT
from reference_pair import compare_weights, max_relative, run_pair

pytest.importorskip("accelerate")

UNEVEN = ("--samples", "10", "--batch", "4", "--epochs", "1", "--save_every", "100", "--weights")


def _check(tmp_path: Path, processes: int, *extra: str) -> None:
    pair = run_pair(SCRIPT, tmp_path, "--client", "trainer", *UNEVEN, *extra, processes=processes)
    assert pair.ours["global_step"] == pair.reference["global_step"]
    loss_rel = max_relative(pair.ours["losses_a"], pair.reference["losses_a"])
    weight_diff = compare_weights(pair.ours_weights, pair.reference_weights)
    print(
        f"Trainer{' + LoRA' if extra else ''} x{processes}: max rel loss diff {loss_rel:.2e}, max weight diff "
        f"{weight_diff:.2e}, wall {pair.ours_seconds:.1f} s / {pair.reference_seconds:.1f} s = {pair.time_ratio:.3f}"
    )
    assert loss_rel <= 1e-5
    assert weight_diff <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_trainer_matches_the_reference(tmp_path: Path, processes: int) -> None:
    _check(tmp_path, processes)


@pytest.mark.slow
def test_peft_lora_under_trainer_matches_the_reference(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    _check(tmp_path, 1, "--lora")
