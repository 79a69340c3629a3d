"""FSDP: activation_checkpointing_offload applied (1 process and 2 gloo processes, FSDP2),
and the device choice of RAM-efficient loading under a bare ``OffloadPolicy()``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) + x


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block(), nn.Linear(8, 1))


def _loss_and_grads(model: nn.Module) -> tuple[float, list[torch.Tensor]]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


# ------------------------------------------------------------------------------ one process
@pytest.mark.parametrize(("checkpoint", "offload"), [(False, True), (True, True), (True, False)])
def test_activation_wrappers_keep_names_outputs_and_gradients(checkpoint: bool, offload: bool) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, OffloadWrapper

    from accelerando.backends.strategies.fsdp.wrap import apply_activation_checkpointing

    plain = _net()
    wrapped = copy.deepcopy(plain)
    units = apply_activation_checkpointing(
        wrapped, [wrapped[0], wrapped[1]], checkpoint=checkpoint, offload=offload
    )
    outer = OffloadWrapper if offload else CheckpointWrapper
    assert all(isinstance(u, outer) for u in units) and units[0] is wrapped[0]
    if checkpoint and offload:
        assert isinstance(units[0]._checkpoint_wrapped_module, CheckpointWrapper)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    got = _loss_and_grads(wrapped)
    want = _loss_and_grads(plain)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_fsdp_plugin_accepts_activation_offload_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "true")
    assert FullyShardedDataParallelPlugin().activation_checkpointing_offload is True
    monkeypatch.delenv("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD")
    assert FullyShardedDataParallelPlugin().activation_checkpointing_offload is False


@pytest.mark.parametrize("offload", ["policy", "cpu", "true", "false"])
def test_ram_efficient_loading_device_follows_the_offload_policy(
    monkeypatch: pytest.MonkeyPatch, offload: str
) -> None:
    import torch.distributed.fsdp as fsdp

    from accelerando import FullyShardedDataParallelPlugin
    from accelerando.backends.strategies.fsdp import wrap

    given = {"policy": fsdp.OffloadPolicy(), "cpu": fsdp.CPUOffloadPolicy(), "true": True, "false": False}[
        offload
    ]
    on_cpu = offload in ("cpu", "true")
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, cpu_offload=given, cpu_ram_efficient_loading=True, auto_wrap_policy="NO_WRAP"
    )
    seen: dict[str, object] = {}
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kwargs: module)
    monkeypatch.setattr(
        wrap, "broadcast_full_state_dict", lambda m, sd, cpu_offload: seen.update(cpu=cpu_offload)
    )
    monkeypatch.setattr(wrap, "broadcast_buffers", lambda m: None)
    model = nn.Linear(2, 2)
    monkeypatch.setattr(model, "to_empty", lambda device: seen.update(device=str(device)) or model)
    fake_accelerator = torch.device("cuda", 0)  # only compared, never allocated on
    wrap.fsdp2_wrap(plugin, model, "FULL_SHARD", None, fake_accelerator, True)
    assert seen == {"device": "cpu" if on_cpu else "cuda:0", "cpu": on_cpu}


# ------------------------------------------------------------------------------ two processes
def _fsdp_worker() -> dict[str, list]:
    from accelerando import Accelerator, FullyShardedDataParallelPlugin

    out: dict[str, list] = {}
    for name, kwargs in {
        "plain": {},
        "offload": {"activation_checkpointing_offload": True},
        "both": {"activation_checkpointing": True, "activation_checkpointing_offload": True},
    }.items():
        reset_accelerator_state(partial=False)
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, transformer_cls_names_to_wrap=["Block"], **kwargs
        )
        acc = Accelerator(fsdp_plugin=plugin, cpu=True)
        model = acc.prepare(_net())
        # fully_shard renames a sharded module's class FSDP<class>
        wrappers = sorted(
            {type(m).__name__.removeprefix("FSDP") for m in model.modules() if "Wrapper" in type(m).__name__}
        )
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1 + acc.process_index))
        loss = model(x).pow(2).mean()
        acc.backward(loss)
        grads = [p.grad.full_tensor() for p in model.parameters()]
        out[name] = [wrappers, loss.item(), grads]
    return out


@pytest.mark.slow
def test_fsdp2_activation_offload_equals_the_plain_run_on_two_processes() -> None:
    for rank, result in enumerate(run_distributed(_fsdp_worker, 2, env={"ACCELERANDO_USE_CPU": "1"})):
        plain_wrappers, plain_loss, plain_grads = result["plain"]
        assert plain_wrappers == []
        assert result["offload"][0] == ["OffloadWrapper"]
        assert result["both"][0] == ["CheckpointWrapper", "OffloadWrapper"]
        for name in ("offload", "both"):
            _, loss, grads = result[name]
            assert loss == pytest.approx(plain_loss, rel=1e-6), (rank, name)
            for a, b in zip(grads, plain_grads, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
