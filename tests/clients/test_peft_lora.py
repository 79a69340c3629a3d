"""A peft LoRA model trained by transformers.Trainer on accelerando (standing in for accelerate)."""

from __future__ import annotations

import pytest
from clients_support import Scenario, check_common, xfail_if_trainer_cannot_import

pytest.importorskip("peft")


@pytest.mark.slow
def test_lora_trainer_trains_saves_adapter_and_resumes(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    (result,) = scenario("--lora", "--resume", "--grad_accum", "2")
    check_common(result, 6)
    # Only the adapter trains (rank 4 on q/v of 2 layers), and the checkpoint holds only the adapter.
    assert 0 < result["trainable_a"] < 2000
    files = set(result["checkpoints"]["checkpoint-3"])
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    assert result["global_step_b"] == 6 and result["losses_b"] == result["losses_a"]
    assert result["resume_bitwise"], result["resume_max_abs_diff"]
