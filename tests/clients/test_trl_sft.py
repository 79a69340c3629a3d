"""trl's SFTTrainer for a few steps on accelerando (standing in for accelerate), tokenizer built locally."""

from __future__ import annotations

import pytest
from clients_support import Scenario, check_common, xfail_if_trainer_cannot_import

pytest.importorskip("trl")
pytest.importorskip("datasets")


@pytest.mark.slow
def test_sft_trainer_trains_evaluates_and_saves(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    (result,) = scenario("--client", "sft", "--steps", "4", "--save_every", "2")
    check_common(result, 4)
    assert {"checkpoint-2", "checkpoint-4"} <= set(result["checkpoints"])
    assert result["eval_a"]["eval_loss"] > 0
