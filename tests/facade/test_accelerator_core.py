"""Single-process behaviour of the Accelerator training core, compared with plain PyTorch."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator, GradScalerKwargs
from accelerando.state import PartialState
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.usefixtures("fresh_state")


def make_problem(n: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = torch.randn(n, 1, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, x, y


def test_prepare_keeps_order_and_is_idempotent():
    model, x, y = make_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    dl = DataLoader(TensorDataset(x, y), batch_size=4)
    acc = Accelerator()
    p_sched, p_dl, p_model, p_opt = acc.prepare(sched, dl, model, opt)
    assert p_model is model
    assert p_opt.optimizer is opt
    assert p_sched.scheduler is sched and p_sched.optimizers == [p_opt]
    assert len(p_dl) == len(dl)
    again = acc.prepare(p_model, p_opt, p_sched, p_dl)
    assert again == (p_model, p_opt, p_sched, p_dl)
    assert acc.prepare(opt) is p_opt
    assert len(acc._models) == 1 and len(acc._optimizers) == 1


def test_training_equals_plain_pytorch_bitwise():
    model, x, y = make_problem()
    ref = copy.deepcopy(model)
    acc = Accelerator()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    dl = DataLoader(TensorDataset(x, y), batch_size=8)
    model, opt, pdl = acc.prepare(model, opt, dl)
    for xb, yb in pdl:
        loss = nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    for xb, yb in dl:
        loss = nn.functional.mse_loss(ref(xb), yb)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("steps", [2, 4])
def test_accumulation_equals_big_batch(steps):
    model, x, y = make_problem(n=32)
    ref = copy.deepcopy(model)
    micro = 4
    acc = Accelerator(gradient_accumulation_steps=steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=micro))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    norms, ref_norms, losses, ref_losses = [], [], [], []
    cycle_loss = 0.0
    for xb, yb in dl:
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(xb), yb)
            cycle_loss += loss.item() / steps
            acc.backward(loss)
            if acc.sync_gradients:
                norms.append(acc.clip_grad_norm_(model.parameters(), 1e9).item())
                losses.append(cycle_loss)
                cycle_loss = 0.0
            opt.step()
            opt.zero_grad()
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=micro * steps):
        loss = nn.functional.mse_loss(ref(xb), yb)
        loss.backward()
        ref_losses.append(loss.item())
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9).item())
        ref_opt.step()
        ref_opt.zero_grad()
    assert len(norms) == len(ref_norms) == 32 // (micro * steps)
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_accumulation_syncs_on_last_batch_and_counts_steps():
    model, x, y = make_problem(n=20)
    acc = Accelerator(gradient_accumulation_steps=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=4))
    syncs = []
    for xb, yb in dl:  # 5 batches: sync at 3 and at the end of the dataloader (5)
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            syncs.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
    assert syncs == [False, False, True, False, True]


def test_scheduler_follows_real_optimizer_steps():
    model, x, y = make_problem(n=16)
    acc = Accelerator(gradient_accumulation_steps=2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model, opt, sched, dl = acc.prepare(model, opt, sched, DataLoader(TensorDataset(x, y), batch_size=4))
    for xb, yb in dl:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step()
            sched.step()
            opt.zero_grad()
    # 4 micro-batches = 2 real steps on 1 process.
    assert sched.scheduler.last_epoch == 2
    assert sched.get_last_lr() == [pytest.approx(1.0 / 3)]


def test_bf16_autocast_runs_on_cpu_and_keeps_fp32_state():
    model, x, y = make_problem()
    acc = Accelerator(mixed_precision="bf16")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    out = model(x)
    assert out.dtype == torch.float32  # outputs converted back
    with acc.autocast():
        inner = acc.unwrap_model(model, keep_fp32_wrapper=False)(x)
    assert inner.dtype == torch.bfloat16
    acc.backward(nn.functional.mse_loss(out, y))
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step")


def test_fp16_on_cpu_scales_loss_and_reports_skipped_step():
    model, x, y = make_problem()
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    assert acc.scaler is not None and acc.scaler.get_scale() == 1024.0
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(nn.functional.mse_loss(model(x), y))
    next(iter(model.parameters())).grad[0, 0] = float("inf")  # injected overflow
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert acc.scaler.get_scale() == 512.0
    assert sched.get_last_lr() == [0.1]  # the schedule did not move on a skipped step
    opt.zero_grad()
    acc.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    assert not acc.optimizer_step_was_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_static_loss_scale_stays_fixed():
    model, x, y = make_problem()
    acc = Accelerator(
        mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0, static_scale=True)]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    for inject in (True, False, False):
        acc.backward(nn.functional.mse_loss(model(x), y))
        if inject:
            next(iter(model.parameters())).grad[0, 0] = float("nan")
        opt.step()
        opt.zero_grad()
        assert acc.optimizer_step_was_skipped is inject
        assert acc.scaler.get_scale() == 256.0


def test_fp8_on_cpu_runs_torchao_or_names_the_gpu_backends_fix():
    from accelerando.utils import TERecipeKwargs
    from accelerando.utils.dataclasses import FP8BackendType

    accelerator = Accelerator(mixed_precision="fp8")  # torchao, emulated on CPU
    assert accelerator.fp8_backend == FP8BackendType.AO
    model = accelerator.prepare(torch.nn.Linear(16, 16))
    assert model is not None
    with pytest.raises(RuntimeError, match="the backend that runs here is 'ao'"):
        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
        accelerator.prepare(torch.nn.Linear(16, 16))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(mixed_precision="fp12")
    with pytest.raises(TypeError, match="KwargsHandler"):
        Accelerator(kwargs_handlers=[{"find_unused_parameters": True}])
    with pytest.raises(ValueError, match="twice|two"):
        Accelerator(kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()])
    acc = Accelerator()
    with pytest.raises(ValueError, match="Item at index 1, `object`"):
        acc.register_for_checkpointing(torch.nn.Linear(1, 1), object())


def test_code_argument_beats_launcher_environment(monkeypatch, caplog):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    acc = Accelerator(mixed_precision="bf16")
    assert acc.mixed_precision == "bf16"
    assert acc.settings.source("mixed_precision") == "code"
    assert acc.gradient_accumulation_steps == 4
    assert acc.settings.source("gradient_accumulation_steps") == "env:ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def test_save_model_shards_with_index_and_ties(tmp_path):
    from safetensors.torch import load_file

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.body = nn.Linear(32, 32)
            self.head = nn.Linear(32, 100, bias=False)
            self.head.weight = self.emb.weight

    model = Tied()
    acc = Accelerator()
    model = acc.prepare(model)
    acc.save_model(model, tmp_path / "single")
    assert os.listdir(tmp_path / "single") == ["model.safetensors"]
    acc.save_model(model, tmp_path / "sharded", max_shard_size="10KB")
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.json" in files and len(files) > 2
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    merged = {}
    for name in set(index["weight_map"].values()):
        merged.update(load_file(tmp_path / "sharded" / name))
    fresh = Tied()
    missing, unexpected = fresh.load_state_dict(merged, strict=False)
    assert unexpected == [] and set(missing) <= {"head.weight", "emb.weight"}
    for key, value in merged.items():
        torch.testing.assert_close(value, model.state_dict()[key])


def test_unwrap_model_and_compiled_model():
    model, x, _ = make_problem()
    acc = Accelerator(dynamo_backend="eager")
    prepared = acc.prepare(model)
    assert prepared is not model
    assert acc.unwrap_model(prepared, keep_torch_compile=False) is model
    torch.testing.assert_close(prepared(x), model(x))


def test_partial_state_helpers():
    state = PartialState()
    assert state.num_processes == 1 and state.is_main_process and state.is_last_process
    with state.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    calls = []
    state.on_main_process(lambda: calls.append("main"))()
    state.on_process(lambda: calls.append("p1"), process_index=1)()
    # as the reference: outside a distributed run every process filter runs its function
    assert calls == ["main", "p1"]


def test_trigger_and_free_memory():
    acc = Accelerator()
    assert acc.check_trigger() is False
    acc.set_trigger()
    assert acc.check_trigger() is True
    assert acc.check_trigger() is False
    model, *_ = make_problem()
    model = acc.prepare(model)
    (model,) = acc.free_memory(model)
    assert model is None and acc._models == []


def test_memory_monitor_switch_samples_each_optimizer_step(tmp_path):
    model, x, y = make_problem()
    acc = Accelerator(project_dir=str(tmp_path))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    monitor = acc.enable_memory_monitor(window=5, plot=False)
    for _ in range(3):
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    acc.end_training()
    record = json.loads((tmp_path / "memory" / "memory_rank0.json").read_text())
    assert len(record["records"]) == 3 and record["records"][0]["cpu_rss"] > 0
    assert monitor is not None and opt._after_step is None


def test_get_state_dict_reads_offloaded_weights(tmp_path):
    from accelerando import cpu_offload, disk_offload

    for offload in ("cpu", "disk"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        if offload == "cpu":
            cpu_offload(model, execution_device="cpu")
        else:
            disk_offload(model, str(tmp_path / "offload"), execution_device="cpu")
        assert any(p.device.type == "meta" for p in model.parameters())
        acc = Accelerator()
        state = acc.get_state_dict(model)
        assert set(state) == set(expected)
        for key, value in expected.items():
            assert torch.equal(state[key], value), (offload, key)
        reset_accelerator_state()
