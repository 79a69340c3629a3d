"""Explicit-form state helpers, custom state (both forms), RNG capture, ProjectConfiguration."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from accelerando.checkpointing import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from accelerando.checkpointing.rng import capture_rng_states, restore_rng_states
from accelerando.plugins.project import ProjectConfiguration


def _build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, start: int, stop: int) -> None:
    for step in range(start, stop):
        x = torch.randn(8, 4)
        noise = float(np.random.rand()) + random.random()
        loss = (model(x) - noise).pow(2).mean() / 2
        loss.backward()
        if (step + 1) % 2 == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()


def test_explicit_form_resumes_bit_exactly(tmp_path) -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    ref = _build(1)
    _train(*ref, 0, 8)

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    first = _build(1)
    _train(*first, 0, 4)
    model, opt, sched = first
    save_accelerator_state(tmp_path, [model.state_dict()], [opt], [sched], [], process_index=0, step=4)
    assert sorted(os.listdir(tmp_path)) == [
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "scheduler.bin",
    ]

    torch.manual_seed(123)  # a fresh process would be in another RNG state
    resumed = _build(99)
    out = load_accelerator_state(tmp_path, [resumed[0]], [resumed[1]], [resumed[2]], [], process_index=0)
    assert out == {"step": 4}
    _train(*resumed, 4, 8)
    for a, b in zip(ref[0].parameters(), resumed[0].parameters(), strict=True):
        assert torch.equal(a, b)
    sa, sb = ref[1].state_dict()["state"], resumed[1].state_dict()["state"]
    for key in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[key][name], sb[key][name])


def test_explicit_form_unsafe_serialization_and_several_models(tmp_path) -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(3, 1)
    save_accelerator_state(
        tmp_path,
        [a.state_dict(), b.state_dict()],
        [],
        [],
        [],
        process_index=0,
        step=0,
        safe_serialization=False,
    )
    assert {"pytorch_model.bin", "pytorch_model_1.bin"} <= set(os.listdir(tmp_path))
    a2, b2 = torch.nn.Linear(2, 2), torch.nn.Linear(3, 1)
    load_accelerator_state(tmp_path, [a2, b2], [], [], [], process_index=0)
    assert torch.equal(a2.weight, a.weight) and torch.equal(b2.weight, b.weight)


def test_explicit_form_missing_optimizer_file_is_named(tmp_path) -> None:
    model = torch.nn.Linear(2, 2)
    save_accelerator_state(tmp_path, [model.state_dict()], [], [], [], process_index=0, step=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FileNotFoundError, match="optimizer.bin"):
        load_accelerator_state(tmp_path, [model], [opt], [], [], process_index=0)


class Counter:
    """A stateful object with the state_dict protocol."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def test_custom_state_reference_form(tmp_path) -> None:
    counter = Counter()
    counter.count = 7
    path = save_custom_state(counter, tmp_path, 2)
    assert os.path.basename(path) == "custom_checkpoint_2.pkl"
    fresh = Counter()
    assert load_custom_state(fresh, tmp_path, 2) == {"count": 7}
    assert fresh.count == 7
    with pytest.raises(TypeError, match="load_custom_state\\(path\\)"):
        load_custom_state(object(), tmp_path, 2)


def test_custom_state_seed_form_plain_values(tmp_path) -> None:
    meta = {"epoch": 5, "best_loss": 0.1234, "learning_rates": [0.001, 0.0005]}
    target = tmp_path / "ckpt" / "metadata.pkl"
    save_custom_state(meta, target)
    assert load_custom_state(target) == meta
    assert save_custom_state(meta, tmp_path / "other.pkl", process_index=1) is None  # not this process
    with pytest.raises(FileNotFoundError, match="other.pkl"):
        load_custom_state(tmp_path / "other.pkl")


def test_rng_capture_restore_round_trip() -> None:
    payload = capture_rng_states()
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    torch.save(payload, "/dev/null")  # picklable
    restore_rng_states(payload)
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


def test_rng_payload_loads_weights_only(tmp_path) -> None:
    torch.save(capture_rng_states(), tmp_path / "r.pkl")
    payload = torch.load(tmp_path / "r.pkl", weights_only=True)
    expected = float(np.random.rand())
    restore_rng_states(payload)
    assert float(np.random.rand()) == expected


def test_project_configuration_defaults_and_validation(tmp_path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path))
    assert config.logging_dir == str(tmp_path)
    assert (config.automatic_checkpoint_naming, config.total_limit, config.iteration) == (False, None, 0)
    config.set_directories(tmp_path / "b")
    assert config.project_dir == str(tmp_path / "b") and config.logging_dir == str(tmp_path)
    assert ProjectConfiguration(logging_dir="logs").logging_dir == "logs"
    with pytest.raises(ValueError, match="total_limit"):
        ProjectConfiguration(total_limit=0)
    with pytest.raises(ValueError, match="iteration"):
        ProjectConfiguration(iteration=-1)


def test_explicit_form_saves_and_restores_a_grad_scaler(tmp_path) -> None:
    model = torch.nn.Linear(2, 2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(1))  # materialises the scale
    scaler.update(512.0)
    save_accelerator_state(tmp_path, [model.state_dict()], [], [], [], process_index=0, step=3, scaler=scaler)
    assert "scaler.pt" in os.listdir(tmp_path)
    fresh = torch.amp.GradScaler("cpu", init_scale=1.0)
    load_accelerator_state(tmp_path, [model], [], [], [], process_index=0, scaler=fresh)
    assert fresh.get_scale() == 512.0


def _mapped_paths() -> str:
    with open("/proc/self/maps") as handle:
        return handle.read()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
@pytest.mark.parametrize("warm", [True, False])
def test_big_optimizer_state_loads_through_a_map_into_existing_memory(
    tmp_path, monkeypatch, warm: bool
) -> None:
    """A big optimizer file is read through a memory map and copied into the optimizer's own tensors
    (or clones, when it has none yet): bitwise what load_state_dict gives, and no map outlives the load."""
    import gc

    from accelerando.checkpointing import files as F
    from accelerando.checkpointing.state_io import load_optimizer_state

    monkeypatch.setattr(F, "MAPPED_LOAD_MIN_BYTES", 1)  # small test tensors still take the mapped path
    model, optimizer, _ = _build(0)
    optimizer.param_groups[0]["lr"] = torch.tensor(0.05)  # a tensor inside param_groups is cloned too
    _train(model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 2), 0, 4)
    path = str(tmp_path / "optimizer.bin")
    torch.save(optimizer.state_dict(), path)
    expected = torch.load(path, weights_only=True)

    target = torch.optim.AdamW(model.parameters(), lr=0.05)
    if warm:
        _train(model, target, torch.optim.lr_scheduler.StepLR(target, 2), 0, 2)  # has state of its own
    before = {id(p): {k: v.data_ptr() for k, v in s.items()} for p, s in target.state.items()}
    loaded = F.torch_load(path, "cpu", mapped=True)
    assert path in _mapped_paths()  # it really is a memory map
    load_optimizer_state(target, loaded)
    del loaded
    gc.collect()
    assert path not in _mapped_paths()  # nothing the optimizer kept points into the file
    reference = torch.optim.AdamW(model.parameters(), lr=0.05)
    reference.load_state_dict(expected)
    for param in model.parameters():
        for key, value in reference.state[param].items():
            assert torch.equal(target.state[param][key], value)
            if warm:
                assert (
                    target.state[param][key].data_ptr() == before[id(param)][key]
                )  # reused, not reallocated
    assert torch.equal(target.param_groups[0]["lr"], reference.param_groups[0]["lr"])


def test_legacy_torch_save_files_load_when_mapping_is_asked(tmp_path, monkeypatch) -> None:
    from accelerando.checkpointing import files as F

    monkeypatch.setattr(F, "MAPPED_LOAD_MIN_BYTES", 1)
    path = str(tmp_path / "legacy.bin")
    torch.save({"x": torch.arange(5)}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(F.torch_load(path, mapped=True)["x"], torch.arange(5))


def test_mapped_load_falls_back_to_reading_where_files_cannot_be_mapped(tmp_path, monkeypatch) -> None:
    from accelerando.checkpointing import files as F

    monkeypatch.setattr(F, "MAPPED_LOAD_MIN_BYTES", 1)
    path = str(tmp_path / "state.bin")
    torch.save({"x": torch.arange(6)}, path)
    real_load = torch.load

    def no_mmap(*args, **kwargs):
        if kwargs.get("mmap"):
            raise OSError("this file system cannot map files")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", no_mmap)
    assert torch.equal(F.torch_load(path, mapped=True)["x"], torch.arange(6))


class _HistoryOptimizer(torch.optim.SGD):
    """An optimizer keeping nested state (a list of tensors per parameter), as custom ones do."""

    def step(self, closure=None):  # type: ignore[override]
        super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                history = self.state[param].setdefault("history", [])
                history.append(param.detach().clone())


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_nested_optimizer_state_is_cloned_out_of_the_map(tmp_path, monkeypatch) -> None:
    import gc

    from accelerando.checkpointing import files as F
    from accelerando.checkpointing.state_io import load_optimizer_state

    monkeypatch.setattr(F, "MAPPED_LOAD_MIN_BYTES", 1)
    model = torch.nn.Linear(3, 2)
    optimizer = _HistoryOptimizer(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
    path = str(tmp_path / "optimizer.bin")
    torch.save(optimizer.state_dict(), path)
    target = _HistoryOptimizer(model.parameters(), lr=0.1, momentum=0.9)
    loaded = F.torch_load(path, mapped=True)
    load_optimizer_state(target, loaded)
    del loaded
    gc.collect()
    assert path not in _mapped_paths()
    for param in model.parameters():
        want, got = optimizer.state[param], target.state[param]
        assert torch.equal(want["momentum_buffer"], got["momentum_buffer"])
        assert len(got["history"]) == 2 and all(
            torch.equal(a, b) for a, b in zip(want["history"], got["history"], strict=True)
        )
