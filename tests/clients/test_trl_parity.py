"""trl's SFT, reward and DPO trainers on accelerando give the reference's losses and weights.

Tiny Llama models from configs, data made here, nothing downloaded. Every run ends on an uneven
last batch (10 rows, 4 per device: 4+4+2 on one process, 8+2 over two), where trl gathers a 0-dim
token count (``gather_for_metrics(outputs.num_valid_tokens)``). Each test prints its figures: max
relative loss difference, max weight difference and the wall-time ratio accelerando / reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import SCRIPT
from reference_pair import compare_weights, max_relative, run_pair

pytest.importorskip("trl")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")

UNEVEN = ("--samples", "10", "--batch", "4", "--epochs", "1", "--save_every", "100", "--weights")


def _check(client: str, tmp_path: Path, processes: int) -> None:
    pair = run_pair(SCRIPT, tmp_path, "--client", client, *UNEVEN, processes=processes)
    steps = 3 if processes == 1 else 2
    assert pair.ours["global_step"] == pair.reference["global_step"] == steps
    loss_rel = max_relative(pair.ours["losses_a"], pair.reference["losses_a"])
    eval_rel = max_relative(
        {"eval": pair.ours["eval_a"]["eval_loss"]}, {"eval": pair.reference["eval_a"]["eval_loss"]}
    )
    weight_diff = compare_weights(pair.ours_weights, pair.reference_weights)
    print(
        f"trl {client} x{processes}: losses {pair.ours['losses_a']} | max rel loss diff {loss_rel:.2e}, "
        f"eval {eval_rel:.2e}, max weight diff {weight_diff:.2e}, wall {pair.ours_seconds:.1f} s / "
        f"{pair.reference_seconds:.1f} s = {pair.time_ratio:.3f}"
    )
    assert loss_rel <= 1e-5 and eval_rel <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_sft_uneven_last_batch_matches_the_reference(tmp_path: Path, processes: int) -> None:
    _check("sft", tmp_path, processes)


@pytest.mark.slow
def test_reward_trainer_matches_the_reference(tmp_path: Path) -> None:
    _check("reward", tmp_path, 1)


@pytest.mark.slow
def test_dpo_trainer_matches_the_reference(tmp_path: Path) -> None:
    _check("dpo", tmp_path, 1)
