"""CUDA-only checks of the items no CPU machine can show (issues #4, #7, #8, #18); skipped without a GPU.

The FP8 checks of #18 each need more: torchao (native FP8 matmuls) and Transformer Engine a GPU of
compute capability 8.9 or newer, MS-AMP its ``msamp`` package; a missing one is a skip naming it.

Run them in one go on a machine with a GPU: ``bash scripts/device_check.sh``.
"""

from __future__ import annotations

import math
import os
import pickle

import pytest
import torch

from suite_support import reset_accelerator_state

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GIB = 1 << 30


class _Counting(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((256, 256), float(index))}


def test_prefetch_copies_the_next_batch_on_a_side_stream_before_the_current_one_is_used(monkeypatch):
    """#4 item 6: with non_blocking=True the copy of batch i+1 is issued (pinned source, side stream)
    before batch i reaches the loop, and the batches arrive intact."""
    from accelerando.data_loader import shard
    from accelerando.data_loader.prepare import prepare_data_loader

    events: list[tuple] = []
    real_resolve = shard.resolve_send_to_device

    def recording_resolve():
        send = real_resolve()

        def recording_send(batch, device, non_blocking=False):
            side = torch.cuda.current_stream(device) != torch.cuda.default_stream(device)
            events.append(("copy", int(batch["x"][0, 0, 0]), side, batch["x"].is_pinned(), non_blocking))
            return send(batch, device, non_blocking=non_blocking)

        return recording_send

    monkeypatch.setattr(shard, "resolve_send_to_device", recording_resolve)
    base = torch.utils.data.DataLoader(_Counting(), batch_size=4)
    loader = prepare_data_loader(
        base,
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("cuda"),
        non_blocking=True,
    )
    seen = []
    for batch in loader:
        assert batch["x"].is_cuda
        first = int(batch["x"][0, 0, 0])
        events.append(("use", first))
        seen.append(batch["x"].sum(dim=(1, 2)).cpu())  # computed on the default stream after ready()
    copies = [e for e in events if e[0] == "copy"]
    assert all(side and pinned and non_blocking for _, _, side, pinned, non_blocking in copies), copies
    order = [(kind, index) for kind, index, *_ in events]
    expected = [("copy", 0), ("copy", 4)]
    for i in range(0, 24, 4):
        expected.append(("use", i))
        if i + 8 < 24:
            expected.append(("copy", i + 8))
    assert order == expected
    sums = torch.cat(seen)
    assert sums.tolist() == [float(i) * 256 * 256 for i in range(24)]


def test_memory_monitor_reads_cuda_counters_and_nvml_sensors(tmp_path):
    """#7 item 3: device allocated / reserved / peak follow a 1 GiB allocation; NVML sensors are read."""
    from accelerando.backends.monitoring import MemoryMonitor
    from accelerando.common.imports import is_pynvml_available

    torch.cuda.init()
    monitor = MemoryMonitor(window=3, output_dir=tmp_path, nvml_every=1, plot=False).start()
    before = monitor.step()
    block = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    during = monitor.step()
    assert during["device_allocated"] - before["device_allocated"] >= GIB
    assert during["device_peak"] >= during["device_allocated"] >= GIB
    assert during["device_reserved"] >= during["device_allocated"]
    assert during["device_allocated"] == torch.cuda.memory_allocated()
    del block
    torch.cuda.empty_cache()
    after = monitor.step()
    assert during["device_allocated"] - after["device_allocated"] >= GIB
    if is_pynvml_available():
        assert 0 < during["gpu_temperature_c"] < 120
        assert during["gpu_power_w"] > 0
        assert 0 <= during["gpu_utilization_pct"] <= 100
    result = monitor.stop()
    assert result["peak_device_allocated"] >= GIB and os.path.exists(result["json_path"])


def test_allocator_snapshot_opens_as_a_memory_viz_pickle(tmp_path):
    """#7 item 3: one profiled CUDA step names the big allocators and writes an allocator snapshot."""
    from accelerando.backends.monitoring.profiling import profile_memory_step

    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
    ).cuda()
    inputs = torch.randn(512, 4096, device="cuda")

    def step():
        model(inputs).sum().backward()

    path = tmp_path / "snapshot.pickle"
    report = profile_memory_step(step, model=model, snapshot_path=path)
    assert report.snapshot_path == str(path)
    with open(path, "rb") as handle:
        snapshot = pickle.load(handle)
    assert snapshot["segments"] and "device_traces" in snapshot
    assert report.modules and report.ops


def test_find_executable_batch_size_steps_down_on_real_cuda_oom():
    """#7 item 5: real torch.OutOfMemoryError from the CUDA allocator; the reference's contract: sizes
    step down by tenths from the start and the first size that fits ends the search (one success)."""
    from accelerando.utils.memory import find_executable_batch_size, release_memory

    free, _ = torch.cuda.mem_get_info()
    chunk = max(GIB, free // 40)  # about 40 chunks fit

    def allocate(batch_size: int) -> int:
        block = torch.empty(batch_size * chunk, dtype=torch.uint8, device="cuda")
        del block
        return batch_size

    finder = find_executable_batch_size(allocate, starting_batch_size=256)
    found = finder()
    assert found == finder.batch_size
    sizes = [size for size, _ in finder.tries]
    assert sizes[0] == 256 and all(b == int(a * 0.9) for a, b in zip(sizes, sizes[1:], strict=False))
    assert [ok for _, ok in finder.tries] == [False] * (len(sizes) - 1) + [True]
    release_memory()
    allocate(found)  # fits
    release_memory()
    with pytest.raises(torch.OutOfMemoryError):
        allocate(sizes[-2])  # the size tried before did not
    release_memory()


def test_fp16_autocast_and_loss_scaling_on_cuda_match_fp32_and_skip_an_inf_step():
    """#2 / #8: fp16 on CUDA goes through autocast and the GradScaler; an injected inf skips the step."""
    from accelerando import Accelerator

    def run(precision: str, inject_inf_at: int | None = None):
        reset_accelerator_state(partial=False)
        accelerator = Accelerator(mixed_precision=precision)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        data = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1))
        skipped = []
        for step, batch in enumerate(data):
            loss = model(batch.cuda()).float().pow(2).mean()
            if step == inject_inf_at:
                loss = loss * float("inf")
            accelerator.backward(loss)
            optimizer.step()
            skipped.append(optimizer.step_was_skipped)
            optimizer.zero_grad()
        return [p.detach().float().cpu() for p in model.parameters()], skipped

    reference, _ = run("no")
    half, skipped = run("fp16")
    assert not any(skipped)
    for a, b in zip(reference, half, strict=True):
        assert torch.allclose(a, b, atol=2e-3, rtol=2e-2)
    _, skipped = run("fp16", inject_inf_at=3)
    assert skipped[3] and sum(skipped) == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP needs 2 processes, and NCCL one GPU each")
def test_fsdp_fp16_on_two_gpus_matches_fp32():
    """#8 item 6: FSDP2 with fp16 mixed precision on 2 GPUs (NCCL) trains like fp32 within fp16 noise."""
    from accelerando.test_utils import run_distributed

    results = run_distributed(_fsdp_fp16_worker, 2)
    for rank in range(2):
        fp32, fp16 = results[rank]["no"], results[rank]["fp16"]
        assert all(math.isfinite(x) for x in fp16)
        assert all(abs(a - b) <= 2e-2 * max(1.0, abs(a)) for a, b in zip(fp32, fp16, strict=True)), results


def _fsdp_fp16_worker() -> dict:
    from accelerando import Accelerator, FullyShardedDataParallelPlugin

    out = {}
    for precision in ("no", "fp16"):
        reset_accelerator_state(partial=False)
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1
        )
        accelerator = Accelerator(mixed_precision=precision, fsdp_plugin=plugin)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        losses = []
        for step in range(5):
            batch = torch.randn(
                16, 256, generator=torch.Generator().manual_seed(step + accelerator.process_index)
            )
            loss = model(batch.to(accelerator.device)).float().pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        out[precision] = losses
    return out


# --- issue #18: FP8 on GPUs (torchao natively, Transformer Engine, MS-AMP) ---------------------------


def _fp8_gpu() -> bool:
    from accelerando.common.environment import check_cuda_fp8_capability

    return check_cuda_fp8_capability()


def _fp8_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.GELU(),
        torch.nn.Linear(128, 128),
        torch.nn.GELU(),
        torch.nn.Linear(128, 64),
    )


def _fp8_train(model, optimizer, backward, device, steps: int = 5) -> list[float]:
    losses = []
    for step in range(steps):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step)).to(device)
        loss = model(x).float().pow(2).mean()
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a GPU with FP8 support (compute capability 8.9+)")
def test_torchao_fp8_runs_natively_and_equals_torchao_by_hand(fresh_state):
    """#18 item 2: on an FP8 GPU torchao runs without emulation, and the Accelerator equals torchao by hand."""
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from accelerando import Accelerator
    from accelerando.backends.precision.fp8.torchao import default_module_filter
    from accelerando.plugins.kwargs import AORecipeKwargs

    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert accelerator._precision.emulated is False
    model = _fp8_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator._precision.config.emulate is False
    got = _fp8_train(model, optimizer, accelerator.backward, accelerator.device)

    hand = _fp8_mlp()
    config = Float8LinearConfig(pad_inner_dim=True, enable_fsdp_float8_all_gather=False)
    hand = convert_to_float8_training(
        hand, module_filter_fn=default_module_filter(hand), config=config
    ).cuda()
    optimizer = torch.optim.AdamW(hand.parameters(), lr=1e-3)
    assert got == _fp8_train(hand, optimizer, lambda loss: loss.backward(), "cuda")


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a GPU with FP8 support (compute capability 8.9+)")
def test_transformer_engine_fp8_or_clear_error(fresh_state):
    """#18 item 3: fp8_backend te swaps layers for TE ones and trains; without the package, the error names 'ao'."""
    from accelerando import Accelerator
    from accelerando.backends.precision.fp8.transformer_engine import has_transformer_engine_layers
    from accelerando.common.imports import is_transformer_engine_available
    from accelerando.plugins.kwargs import TERecipeKwargs

    if not is_transformer_engine_available():
        with pytest.raises(RuntimeError, match="'ao'"):
            Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()]).prepare(_fp8_mlp())
        return
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    model = _fp8_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert has_transformer_engine_layers(accelerator.unwrap_model(model))
    losses = _fp8_train(model, optimizer, accelerator.backward, accelerator.device)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


class _HandTE(torch.nn.Module):
    """The FP8 MLP written directly with Transformer Engine: te.Linear layers, forward in fp8_autocast."""

    def __init__(self, source: torch.nn.Module, recipe) -> None:
        import transformer_engine.pytorch as te

        super().__init__()
        layers = []
        for module in source:
            if isinstance(module, torch.nn.Linear):
                layer = te.Linear(module.in_features, module.out_features, params_dtype=torch.float32)
                with torch.no_grad():
                    layer.weight.copy_(module.weight)
                    layer.bias.copy_(module.bias)
                module = layer
            layers.append(module)
        self.layers = torch.nn.Sequential(*layers)
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import transformer_engine.pytorch as te

        with te.fp8_autocast(enabled=True, fp8_recipe=self.recipe):
            return self.layers(x)


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a GPU with FP8 support (compute capability 8.9+)")
def test_transformer_engine_fp8_equals_te_by_hand(fresh_state):
    """#18: TE convert_model + FP8 autocast through the Accelerator trains as Transformer Engine by hand
    (te.Linear with the same weights, DelayedScaling with the TERecipeKwargs defaults)."""
    pytest.importorskip("transformer_engine.pytorch")
    from transformer_engine.common.recipe import DelayedScaling, Format

    from accelerando import Accelerator
    from accelerando.plugins.kwargs import TERecipeKwargs

    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    model = _fp8_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    got = _fp8_train(model, optimizer, accelerator.backward, accelerator.device)

    recipe = DelayedScaling(
        fp8_format=Format.HYBRID, amax_history_len=1024, amax_compute_algo="most_recent", margin=0
    )
    hand = _HandTE(_fp8_mlp(), recipe).cuda()
    optimizer = torch.optim.AdamW(hand.parameters(), lr=1e-3)
    want = _fp8_train(hand, optimizer, lambda loss: loss.backward(), "cuda")
    assert all(math.isfinite(x) for x in got) and got[-1] < got[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)


def _has_msamp() -> bool:
    from accelerando.common.imports import is_msamp_available

    return is_msamp_available()


@pytest.mark.skipif(not _has_msamp(), reason="needs MS-AMP (github.com/Azure/MS-AMP), built for this CUDA")
@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_msamp_fp8_equals_msamp_by_hand(fresh_state, opt_level):
    """#18: fp8_backend msamp runs msamp.initialize(model, optimizer, opt_level) at prepare and trains
    as MS-AMP by hand; two models in one prepare call are refused."""
    import msamp

    from accelerando import Accelerator
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs

    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level=opt_level)])
    model = _fp8_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    got = _fp8_train(model, optimizer, accelerator.backward, accelerator.device)

    hand = _fp8_mlp().cuda()
    hand_optimizer = torch.optim.AdamW(hand.parameters(), lr=1e-3)
    hand, hand_optimizer = msamp.initialize(hand, hand_optimizer, opt_level=opt_level)
    want = _fp8_train(hand, hand_optimizer, lambda loss: loss.backward(), "cuda")
    assert all(math.isfinite(x) for x in got) and got[-1] < got[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    two = (_fp8_mlp(), _fp8_mlp())
    with pytest.raises(ValueError, match="2 model"):
        accelerator.prepare(*two, torch.optim.AdamW(two[0].parameters()))
