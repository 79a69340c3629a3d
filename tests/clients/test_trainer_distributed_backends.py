"""transformers.Trainer with DeepSpeed (ZeRO-2, ZeRO-3 on CPU) and with FSDP, on accelerando, 2 processes.

Each test is one ``accelerando launch --num_processes 2`` running trainer_scenario.py: train, save,
evaluate, resume from the first checkpoint; the resumed weights must equal the uninterrupted ones
within 1e-6 (DeepSpeed and FSDP keep fp32 master weights and reduce in a fixed order, so bitwise is
expected but only the tolerance is asserted).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clients_support import Scenario, check_common, xfail_if_trainer_cannot_import

pytest.importorskip("transformers")


def _deepspeed_config(tmp_path: Path, stage: int) -> str:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
        # torch's AdamW (torch_adam): DeepSpeed's FusedAdam/CPUAdam ops would be compiled on first use.
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"},
        },
        "bf16": {"enabled": "auto"},
    }
    path = tmp_path / f"ds_zero{stage}.json"
    path.write_text(json.dumps(config))
    return str(path)


def _check(results: list[dict], steps: int) -> None:
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world"] == 2
        check_common(result, steps)
        assert result["accelerator_module_b"].startswith("accelerando")
        assert result["global_step_b"] == steps
        # Full weights may be gathered on the main process only (None elsewhere); it must have them.
        if rank == 0 or result["resume_max_abs_diff"] is not None:
            assert result["resume_max_abs_diff"] <= 1e-6, result["resume_max_abs_diff"]
        assert result["eval_a"]["eval_loss"] == pytest.approx(result["eval_b"]["eval_loss"], abs=1e-6)
    assert results[0]["losses_a"] == results[1]["losses_a"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.usefixtures("deepspeed_cpu_op")
def test_trainer_deepspeed_zero_on_cpu(scenario: Scenario, tmp_path: Path, stage: int) -> None:
    xfail_if_trainer_cannot_import()
    pytest.importorskip("deepspeed")
    config = _deepspeed_config(tmp_path, stage)
    results = scenario("--deepspeed", config, "--resume", "--grad_accum", "2", processes=2)
    _check(results, steps=6)
    for result in results:
        assert "DEEPSPEED" in result["distributed_type"]
        assert any(name.startswith("global_step") for name in result["checkpoints"]["checkpoint-3"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trainer_fsdp(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    results = scenario("--fsdp", "full_shard auto_wrap", "--resume", processes=2)
    _check(results, steps=6)
    for result in results:
        assert "FSDP" in result["distributed_type"]
