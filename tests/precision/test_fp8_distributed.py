"""torchao FP8 (emulated) in two gloo processes: DDP and FSDP2 through the Accelerator equal the same
model converted and wrapped by hand, FSDP2 all-gathering the weights in float8."""

from __future__ import annotations

import pytest
import torch

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state, run_distributed_preloaded

pytest.importorskip("torchao")

STEPS = 10


def _fresh(**kwargs):
    from accelerando import Accelerator

    reset_accelerator_state(partial=False)
    return Accelerator(**kwargs)


def _fsdp2_by_hand(model: torch.nn.Module, mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp2_resume_and_save(steps: int, root: str, plugin_kwargs: dict, data) -> dict:
    """FSDP2 + float8 all-gather: save_state half-way, load into a fresh run, continue; save_model."""
    from _fp8_common import make_model, train

    from accelerando import FullyShardedDataParallelPlugin
    from accelerando.plugins.kwargs import AORecipeKwargs

    def build(seed: int):
        acc = _fresh(
            mixed_precision="fp8",
            fsdp_plugin=FullyShardedDataParallelPlugin(**plugin_kwargs),
            kwargs_handlers=[AORecipeKwargs()],
        )
        model = make_model(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return (acc, *acc.prepare(model, opt))

    acc, model, opt = build(0)
    rank, world = acc.process_index, acc.num_processes
    first = train(model, opt, data, 0, steps // 2, acc.backward, rank, world)
    acc.save_state(f"{root}/ckpt")
    acc, model, opt = build(123)
    acc.load_state(f"{root}/ckpt")
    rest = train(model, opt, data, steps // 2, steps - steps // 2, acc.backward, rank, world)
    acc.save_model(model, f"{root}/model")
    acc.wait_for_everyone()
    saved = None
    if acc.is_main_process:
        from safetensors.torch import load_file

        weights = load_file(f"{root}/model/model.safetensors")
        plain = make_model()
        plain.load_state_dict(weights)  # the keys and shapes of the unconverted model
        saved = sorted({str(t.dtype) for t in weights.values()})
    return {"resumed": first + rest, "saved_dtypes": saved}


def _worker(steps: int, root: str | None = None) -> dict:
    from _fp8_common import batches, by_hand, make_model, train
    from torch.distributed.device_mesh import init_device_mesh
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    from accelerando import FullyShardedDataParallelPlugin
    from accelerando.plugins.kwargs import AORecipeKwargs

    torch.set_num_threads(1)
    out: dict = {}
    data = batches(steps, world=2)

    acc = _fresh(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    rank, world = acc.process_index, acc.num_processes
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    out["ddp"] = train(model, opt, data, 0, steps, acc.backward, rank, world)
    out["ddp_type"] = str(acc.distributed_type)

    hand = torch.nn.parallel.DistributedDataParallel(by_hand(make_model()))
    opt = torch.optim.AdamW(hand.parameters(), lr=1e-2)
    out["ddp_hand"] = train(hand, opt, data, 0, steps, None, rank, world)

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, transformer_cls_names_to_wrap=["Block"])
    acc = _fresh(mixed_precision="fp8", fsdp_plugin=plugin, kwargs_handlers=[AORecipeKwargs()])
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    out["fsdp2"] = train(model, opt, data, 0, steps, acc.backward, rank, world)
    out["fsdp2_all_gather"] = acc._precision.config.enable_fsdp_float8_all_gather
    out["fsdp2_weight"] = type(model.blocks[0].q.weight.to_local()).__name__

    hand = _fsdp2_by_hand(by_hand(make_model(), all_gather=True), init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(hand.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        losses += train(hand, opt, data, i, 1, None, rank, world)
        precompute_float8_dynamic_scale_for_fsdp(hand)
    out["fsdp2_hand"] = losses
    if root is not None:
        plugin_kwargs = {"fsdp_version": 2, "transformer_cls_names_to_wrap": ["Block"]}
        out.update(_fsdp2_resume_and_save(steps, root, plugin_kwargs, data))
    return out


def _check(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        if "resumed" in res:
            assert res["resumed"] == res["fsdp2"], f"rank {rank}: save_state/load_state/continue"
            assert res["saved_dtypes"] == (["torch.float32"] if rank == 0 else None)
        assert res["ddp_type"] == "MULTI_CPU"
        assert res["ddp"] == res["ddp_hand"], f"rank {rank}"  # bitwise
        assert res["fsdp2_all_gather"] is True and res["fsdp2_weight"] == "WeightWithDynamicFloat8CastTensor"
        assert res["fsdp2"] == res["fsdp2_hand"], f"rank {rank}"  # bitwise
        assert res["fsdp2"] == pytest.approx(res["ddp"], rel=1e-2)  # sharded reductions, float8 all-gather
    assert results[0]["ddp"] != results[1]["ddp"]  # each rank its own batches


def test_ddp_and_fsdp2_equal_torchao_by_hand():
    _check(run_distributed_preloaded(_worker, 2, 3, timeout=600))


@pytest.mark.slow
def test_ddp_and_fsdp2_equal_torchao_by_hand_10_steps_and_fsdp2_resume(tmp_path):
    _check(run_distributed(_worker, 2, STEPS, str(tmp_path), timeout=900))
