"""save_state / load_state through the Accelerator in one process: naming, rotation, damage handling,
hooks, custom objects, world-size changes and the seed's folder-only helpers."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import (
    CheckpointError,
    atomic,
    latest_checkpoint,
    list_checkpoints,
    load_accelerator_state,
    load_custom_state,
    resume_point,
    save_accelerator_state,
    save_custom_state,
)
from accelerando.checkpointing.atomic import MANIFEST_NAME
from accelerando.plugins.project import ProjectConfiguration
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.usefixtures("fresh_state")


class Counter:
    """A registered stateful object."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def _setup(tmp_path, total_limit: int | None = None, automatic: bool = True):
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=automatic, total_limit=total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _train_step(model, optimizer, scheduler) -> None:
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _fill(model, value: float) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)


def test_automatic_naming_rotation_and_resume(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, total_limit=2)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    for i in range(3):
        _train_step(model, optimizer, scheduler)
        _fill(model, float(i))
        counter.count = 10 + i
        path = accelerator.save_state()
        assert os.path.basename(path) == f"checkpoint_{i}"
    assert accelerator.save_iteration == 3
    root = os.path.join(str(tmp_path), "checkpoints")
    assert [n for n, _ in list_checkpoints(root)] == [1, 2]
    assert sorted(os.listdir(path)) == sorted(
        [
            MANIFEST_NAME,
            "custom_checkpoint_0.pkl",
            "model.safetensors",
            "optimizer.bin",
            "random_states_0.pkl",
            "scheduler.bin",
        ]
    )
    assert latest_checkpoint(str(tmp_path)) == path

    _fill(model, -1.0)
    counter.count = 0
    accelerator.project_configuration.iteration = 0
    accelerator.load_state()
    assert all(bool((p == 2.0).all()) for p in model.parameters())
    assert counter.count == 12 and accelerator.save_iteration == 3
    assert scheduler.get_last_lr() == [0.1 * 0.5**3]
    assert resume_point(accelerator).checkpoint == path

    accelerator.project_configuration.iteration = 2
    with pytest.raises(ValueError, match="already exists"):
        accelerator.save_state()


def _flip(path: str, offset_from_end: int = 3) -> None:
    with open(path, "r+b") as handle:
        handle.seek(-offset_from_end, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-offset_from_end, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "random_states_0.pkl", MANIFEST_NAME])
@pytest.mark.parametrize("damage", ["truncate", "delete", "flip"])
def test_damage_is_refused_or_skipped(tmp_path, monkeypatch, name: str, damage: str) -> None:
    from accelerando.checkpointing import files

    monkeypatch.setattr(files, "MAPPED_LOAD_MIN_BYTES", 1)  # the optimizer file is read through a map
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    _train_step(model, optimizer, scheduler)  # the optimizer has state to lose
    _fill(model, 1.0)
    accelerator.save_state()
    _fill(model, 2.0)
    newest = accelerator.save_state()
    target = os.path.join(newest, name)
    if damage == "truncate":
        os.truncate(target, os.path.getsize(target) // 2)
    elif damage == "delete":
        os.remove(target)
    else:
        _flip(target)
    _fill(model, 5.0)
    for values in optimizer.state.values():
        values["exp_avg"].fill_(7.0)
    before = [values["exp_avg"].clone() for values in optimizer.state.values()]
    pattern = "checkpoint_manifest|incomplete" if name == MANIFEST_NAME else name.replace(".", "\\.")
    with pytest.raises((CheckpointError, FileNotFoundError), match=pattern):
        accelerator.load_state(newest)
    assert all(bool((p == 5.0).all()) for p in model.parameters())  # nothing half-loaded
    after = [values["exp_avg"] for values in optimizer.state.values()]
    assert len(after) == 2 and all(bool((a == b).all()) for a, b in zip(after, before, strict=True))
    if damage == "flip" and name == MANIFEST_NAME:
        return  # a flipped byte inside JSON text may still parse; the files it lists are intact
    with pytest.warns(UserWarning, match="Skipping (damaged|incomplete) checkpoint"):
        accelerator.load_state()
    assert all(bool((p == 1.0).all()) for p in model.parameters())
    assert accelerator.save_iteration == 1


def test_load_state_without_checkpoints_or_folder(tmp_path) -> None:
    accelerator, *_ = _setup(tmp_path)
    with pytest.raises(FileNotFoundError, match="No complete checkpoint"):
        accelerator.load_state()
    assert latest_checkpoint(str(tmp_path)) is None
    reset_accelerator_state()
    accelerator, *_ = _setup(tmp_path, automatic=False)
    with pytest.raises(ValueError, match="output_dir"):
        accelerator.save_state()
    with pytest.raises(ValueError, match="input_dir"):
        accelerator.load_state()
    with pytest.raises(FileNotFoundError, match="not a folder"):
        accelerator.load_state(str(tmp_path / "missing"))


def test_explicit_folder_overwrite_and_unverified_legacy_folder(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, automatic=False)
    out = str(tmp_path / "ckpt")
    _fill(model, 1.0)
    accelerator.save_state(out)
    _fill(model, 2.0)
    accelerator.save_state(out)  # replaces the folder atomically
    atomic.wait_for_removals()  # the replaced folder is removed in the background
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    _fill(model, 0.0)
    accelerator.load_state(out, verify_checksums=False)
    assert all(bool((p == 2.0).all()) for p in model.parameters())
    os.remove(os.path.join(out, MANIFEST_NAME))
    _fill(model, 0.0)
    with pytest.raises(CheckpointError, match="checkpoint_manifest.json"):
        accelerator.load_state(out)
    accelerator.load_state(out, allow_unverified=True)  # e.g. written by another library
    assert all(bool((p == 2.0).all()) for p in model.parameters())


def test_hooks_change_what_is_saved(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, automatic=False)
    seen = {}

    def save_hook(models, weights, output_dir):
        torch.save(weights.pop(0), os.path.join(output_dir, "my_model.pt"))
        models.pop(0)

    def load_hook(models, input_dir):
        seen["input_dir"] = input_dir
        state = torch.load(os.path.join(input_dir, "my_model.pt"))
        accelerator.unwrap_model(models.pop(0)).load_state_dict(state)

    handle = accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    _fill(model, 3.0)
    out = accelerator.save_state(str(tmp_path / "ckpt"))
    handle.remove()
    files = set(os.listdir(out))
    assert "my_model.pt" in files and "model.safetensors" not in files
    with open(os.path.join(out, MANIFEST_NAME)) as f:
        assert "my_model.pt" in json.load(f)["files"]  # hook files are verified like ours
    _fill(model, 0.0)
    accelerator.load_state(out)
    assert seen["input_dir"] == out
    assert all(bool((p == 3.0).all()) for p in model.parameters())


def test_unfinished_accumulation_gradients_are_saved(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, automatic=False)
    from accelerando.utils import GradientAccumulationPlugin

    accelerator.gradient_state._configure(GradientAccumulationPlugin(num_steps=2))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(2, 4)).sum())
    grads = [p.grad.clone() for p in model.parameters()]
    out = accelerator.save_state(str(tmp_path / "ckpt"))
    assert "gradients_0.safetensors" in os.listdir(out)
    optimizer.zero_grad(set_to_none=True)
    accelerator.step = 0
    accelerator.load_state(out)
    assert accelerator.step == 1
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))


def test_world_size_change_warns_and_restores_the_step_counter(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, automatic=False)
    _fill(model, 4.0)
    out = accelerator.save_state(str(tmp_path / "ckpt"))
    manifest_path = os.path.join(out, MANIFEST_NAME)
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["world_size"] = 2
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    _fill(model, 0.0)
    accelerator.step = 7
    with pytest.warns(UserWarning, match="saved by 2 processes and is loaded by 1"):
        accelerator.load_state(out)
    assert all(bool((p == 4.0).all()) for p in model.parameters())
    assert accelerator.step == 0  # the saved step counter (the same on every process) is restored


def test_seed_form_helpers_act_on_the_active_accelerator(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path, automatic=False)
    _fill(model, 6.0)
    folder = str(tmp_path / "checkpoint-1000")
    save_accelerator_state(folder, safe_serialization=True)
    save_custom_state({"epoch": 5, "best_loss": 0.1234}, os.path.join(folder, "metadata.pkl"))
    _fill(model, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_accelerator_state(folder)
    assert all(bool((p == 6.0).all()) for p in model.parameters())
    assert load_custom_state(os.path.join(folder, "metadata.pkl")) == {"epoch": 5, "best_loss": 0.1234}


def test_failed_write_commits_nothing(tmp_path) -> None:
    accelerator, model, optimizer, scheduler = _setup(tmp_path)

    def broken_hook(models, weights, output_dir):
        raise OSError("disk full")

    handle = accelerator.register_save_state_pre_hook(broken_hook)
    with pytest.raises(OSError, match="disk full"):
        accelerator.save_state()
    root = os.path.join(str(tmp_path), "checkpoints")
    assert os.listdir(root) == []  # no checkpoint, no staging folder
    assert accelerator.save_iteration == 0
    handle.remove()
    assert os.path.basename(accelerator.save_state()) == "checkpoint_0"


def test_committed_checkpoints_are_reported_to_trackers_only_when_asked(tmp_path, monkeypatch) -> None:
    """By default save_state logs nothing; log_checkpoint_metrics reports at the script's step."""
    from accelerando.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()
            self.logged: list[tuple] = []

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values) -> None:
            pass

        def log(self, values, step=None, **kwargs) -> None:
            self.logged.append(("log", values, step))

        def log_checkpoint(self, step, path, size_bytes) -> None:
            self.logged.append(("checkpoint", step, path, size_bytes))

    def run(project: str) -> tuple[list[tuple], str]:
        recorder = Recorder()
        config = ProjectConfiguration(project_dir=str(tmp_path / project), automatic_checkpoint_naming=True)
        accelerator = Accelerator(cpu=True, project_config=config, log_with=recorder)
        accelerator.init_trackers("run")
        accelerator.prepare(torch.nn.Linear(2, 2))
        accelerator.step = 5  # micro-batches: never the step a checkpoint is reported at
        accelerator.log({"loss": 1.0}, step=3)
        return recorder.logged, accelerator.save_state()

    logged, _ = run("default")
    assert logged == [("log", {"loss": 1.0}, 3)]  # nothing but the script's own row
    monkeypatch.setenv("ACCELERANDO_LOG_CHECKPOINT_METRICS", "1")
    logged, path = run("opted_in")
    (entry,) = [e for e in logged if e[0] == "checkpoint"]
    assert entry[1:3] == (3, path)  # the step the script last logged at
    assert entry[3] == sum(
        os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n != MANIFEST_NAME
    )


def test_save_on_each_node_single_process(tmp_path) -> None:
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, save_on_each_node=True
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    _fill(model, 3.0)
    path = accelerator.save_state()
    _fill(model, 0.0)
    accelerator.load_state()
    assert os.path.basename(path) == "checkpoint_0"
    assert all(bool((p == 3.0).all()) for p in model.parameters())


def test_verify_checksums_setting_from_the_environment(tmp_path, monkeypatch) -> None:
    """ACCELERANDO_VERIFY_CHECKSUMS=0 makes sizes-only the default; the argument still wins."""
    monkeypatch.setenv("ACCELERANDO_VERIFY_CHECKSUMS", "0")
    accelerator, model, optimizer, scheduler = _setup(tmp_path)
    assert accelerator.settings.source("verify_checksums") == "env:ACCELERANDO_VERIFY_CHECKSUMS"
    _fill(model, 1.0)
    newest = accelerator.save_state()
    _flip(os.path.join(newest, "model.safetensors"))  # inside the tensor data: same size
    accelerator.load_state(newest)  # sizes only, as configured: the flip goes unseen
    with pytest.raises(CheckpointError, match="model\\.safetensors"):
        accelerator.load_state(newest, verify_checksums=True)
