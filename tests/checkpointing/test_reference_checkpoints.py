"""Checkpoints written by the reference library's ``save_state`` (no manifest) load and continue.

The reference ``accelerate`` package runs in a subprocess (``reference_train.py``): it trains, saves
after the last batch of the first epoch, keeps training and records its final weights. accelerando
builds the same objects, resumes from that checkpoint (found by automatic naming) and must end with
the same weights. Hostile files in the reference layout are refused without running code.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings

import pytest
import torch

from suite_support import reset_accelerator_state

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_train  # noqa: E402

needs_reference = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="the reference accelerate package is not installed"
)


def _reference_run(project: str, save_at: tuple[int, int], safe: bool) -> dict[str, torch.Tensor]:
    env = dict(os.environ, SAFE="1" if safe else "0")
    script = os.path.join(HERE, "reference_train.py")
    subprocess.run(
        [sys.executable, script, project, str(save_at[0]), str(save_at[1])], check=True, env=env, timeout=300
    )
    return torch.load(os.path.join(project, "final.pt"), weights_only=True)


def _resume_here(project: str, save_at: tuple[int, int]) -> tuple[dict[str, torch.Tensor], list[str]]:
    import accelerando
    import accelerando.utils as utils

    reset_accelerator_state()
    model, optimizer, scheduler, loader = reference_train.build(accelerando, utils)
    config = utils.ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = accelerando.Accelerator(cpu=True, project_config=config)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state()  # automatic naming: the reference's newest checkpoint_N
    messages = [str(w.message) for w in caught if "reference library" in str(w.message)]
    done = save_at[0] * len(loader) + save_at[1] + 1
    start_epoch, skip = divmod(done, len(loader))
    for _epoch in range(start_epoch, reference_train.EPOCHS):
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        for batch in batches:
            reference_train.step(accelerator, model, optimizer, scheduler, batch)
    assert accelerator.project_configuration.iteration == 1  # the next save is checkpoint_1
    return accelerator.unwrap_model(model).state_dict(), messages


@needs_reference
@pytest.mark.slow
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_reference_checkpoint_resumes_exactly(tmp_path, safe: bool) -> None:
    project = str(tmp_path / "run")
    save_at = (0, 3)  # after the last batch (10 samples, batches of 3) of the first epoch
    expected = _reference_run(project, save_at, safe)
    names = sorted(os.listdir(os.path.join(project, "checkpoints", "checkpoint_0")))
    model_file = "model.safetensors" if safe else "pytorch_model.bin"
    assert names == sorted([model_file, "optimizer.bin", "random_states_0.pkl", "scheduler.bin"])
    resumed, messages = _resume_here(project, save_at)
    difference = max(float((resumed[k] - expected[k]).abs().max()) for k in expected)
    assert difference <= 1e-6, difference
    assert len(messages) == 1 and "unverified" in messages[0]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/accelerando_pwned_h6",))


def _fake_reference_folder(folder) -> None:
    folder.mkdir()
    torch.save({"step": 0}, folder / "scheduler.bin")


def test_hostile_reference_rng_file_is_refused(tmp_path) -> None:
    from accelerando import Accelerator
    from accelerando.checkpointing import UnsafeCheckpointError

    reset_accelerator_state()
    folder = tmp_path / "ckpt"
    _fake_reference_folder(folder)
    torch.save(
        {"torch_manual_seed": _Boom()},
        folder / "random_states_0.pkl",
    )
    accelerator = Accelerator(cpu=True)
    with (
        pytest.warns(UserWarning, match="unverified"),
        pytest.raises(UnsafeCheckpointError, match="posix.system|os.system"),
    ):
        accelerator.load_state(str(folder))
    assert not os.path.exists("/tmp/accelerando_pwned_h6")


def test_damaged_reference_files_are_named(tmp_path) -> None:
    from accelerando import Accelerator
    from accelerando.checkpointing import CheckpointError

    reset_accelerator_state()
    folder = tmp_path / "ckpt"
    _fake_reference_folder(folder)
    (folder / "random_states_0.pkl").write_bytes(b"not a zip archive")
    accelerator = Accelerator(cpu=True)
    with pytest.raises(CheckpointError, match="random_states_0.pkl"):
        accelerator.load_state(str(folder))
    (folder / "random_states_0.pkl").unlink()
    torch.save({"torch_manual_seed": torch.get_rng_state()}, folder / "random_states_0.pkl")
    (folder / "model.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        accelerator.load_state(str(folder))


def test_folder_without_manifest_or_reference_layout_is_still_refused(tmp_path) -> None:
    from accelerando import Accelerator
    from accelerando.checkpointing import CheckpointError

    reset_accelerator_state()
    folder = tmp_path / "ckpt"
    _fake_reference_folder(folder)
    with pytest.raises(CheckpointError, match="checkpoint_manifest.json"):
        Accelerator(cpu=True).load_state(str(folder))
