"""transformers.Trainer on accelerando standing in for accelerate: train, evaluate, save, resume.

Each test is one fresh interpreter (or one ``accelerando launch``) that runs the whole scenario and
reports; several checks per launch. "Resumed equals uninterrupted" is checked on the final weights:
bitwise where the run is deterministic on CPU (one process, two processes with gloo), else within 1e-6.
"""

from __future__ import annotations

import pytest
from clients_support import Scenario, check_common, xfail_if_trainer_cannot_import

pytest.importorskip("transformers")

CHECKPOINT_FILES = {
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "trainer_state.json",
}


def _check_train_eval_save_resume(result: dict, steps: int, save_every: int) -> None:
    check_common(result, steps)
    assert result["accelerator_module_b"].startswith("accelerando")
    assert set(result["checkpoints"]) == {f"checkpoint-{s}" for s in range(save_every, steps + 1, save_every)}
    for files in result["checkpoints"].values():
        assert CHECKPOINT_FILES <= set(files), files
        # one RNG file per process: rng_state.pth alone, rng_state_<rank>.pth with several
        rng = (
            {"rng_state.pth"}
            if result["world"] == 1
            else {f"rng_state_{r}.pth" for r in range(result["world"])}
        )
        assert rng <= set(files), files
    eval_loss = result["eval_a"]["eval_loss"]
    assert eval_loss == eval_loss and eval_loss > 0
    # Resumed from the first checkpoint == trained without interruption.
    assert result["global_step_b"] == steps
    assert result["losses_b"] == result["losses_a"]
    assert result["resume_bitwise"], result["resume_max_abs_diff"]
    assert result["eval_b"]["eval_loss"] == eval_loss


def test_trainer_one_process_train_eval_save_resume(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    (result,) = scenario("--steps", "4", "--save_every", "2", "--grad_accum", "2", "--resume")
    _check_train_eval_save_resume(result, steps=4, save_every=2)
    assert result["world"] == 1 and result["mixed_precision"] == "no"


@pytest.mark.slow
def test_trainer_one_process_bf16_gradient_accumulation_resume(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    (result,) = scenario("--bf16", "--grad_accum", "2", "--resume", "--model", "gpt2")
    _check_train_eval_save_resume(result, steps=6, save_every=3)
    assert result["mixed_precision"] == "bf16"
    assert result["head_output_dtypes"] == ["torch.bfloat16"]  # the forward ran under bf16 autocast


@pytest.mark.slow
def test_trainer_two_processes_gradient_accumulation_resume(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    results = scenario("--grad_accum", "2", "--resume", processes=2)
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world"] == 2
        assert "MULTI_CPU" in result["distributed_type"]
        _check_train_eval_save_resume(result, steps=6, save_every=3)
    assert results[0]["losses_a"] == results[1]["losses_a"]  # logged losses are averaged over ranks
    assert results[0]["eval_a"]["eval_loss"] == results[1]["eval_a"]["eval_loss"]


@pytest.mark.slow
def test_trainer_two_processes_bf16(scenario: Scenario) -> None:
    xfail_if_trainer_cannot_import()
    results = scenario("--bf16", "--resume", "--steps", "4", "--save_every", "2", processes=2)
    for result in results:
        _check_train_eval_save_resume(result, steps=4, save_every=2)
        assert result["mixed_precision"] == "bf16"
        assert result["head_output_dtypes"] == ["torch.bfloat16"]


@pytest.mark.slow
def test_trainer_matches_the_reference_accelerate(scenario: Scenario, tmp_path) -> None:
    """Same script, same seed: the losses and eval loss equal those of the real accelerate."""
    xfail_if_trainer_cannot_import()
    pytest.importorskip("accelerate")
    from clients_support import run_scenario

    flags = ("--steps", "4", "--save_every", "4", "--grad_accum", "2", "--no_eval")
    (ours,) = scenario(*flags)
    (reference,) = run_scenario(tmp_path / "reference", *flags, "--accelerate", "reference")
    assert reference["accelerator_module"].startswith("accelerate.")
    check_common(ours, 4)
    assert ours["losses_a"].keys() == reference["losses_a"].keys()
    for step, loss in ours["losses_a"].items():
        assert abs(loss - reference["losses_a"][step]) <= 1e-6, (step, loss, reference["losses_a"][step])


@pytest.mark.slow
def test_trainer_auto_find_batch_size_completes_the_loop_once(scenario: Scenario) -> None:
    """``auto_find_batch_size=True`` wraps the whole training loop in find_executable_batch_size: after
    out-of-memory errors at 8 and 7 samples it runs again at the reference's next sizes (int(size *
    0.9)) and stops at the first that fits; the loop runs to completion exactly once."""
    xfail_if_trainer_cannot_import()
    (result,) = scenario(
        "--auto_find_batch_size", "--batch", "8", "--oom_above", "6", "--steps", "3", "--no_eval"
    )
    check_common(result, steps=3)
    assert result["loop_begins"] == [8, 7, 6]  # started at each size tried
    assert result["loop_ends"] == [6]  # and completed once, with the size that fits
