"""Check DDP communication hooks set through ``DistributedDataParallelKwargs(comm_hook=...)``.

For every hook (none, fp16 and bf16 compression, PowerSGD and batched PowerSGD, the PowerSGD ones
also wrapped in fp16 / bf16 compression) a small model is trained a few steps with
``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])`` and, from the same weights and
data, with ``torch.nn.parallel.DistributedDataParallel`` carrying the same hook registered by hand.
The parameters must agree after every step. In one process there is no DDP to hook: the prepared
model must train exactly as the plain one.

Run with ``accelerando launch`` / ``torchrun`` (any number of processes, CPU with gloo or GPUs). A
failed check raises ``AssertionError`` (exit status 1).
"""

from __future__ import annotations

import torch

from accelerando import Accelerator, PartialState
from accelerando.core.enums_on_demand import DDPCommunicationHookType
from accelerando.plugins.kwargs import DistributedDataParallelKwargs

__all__ = ["CASES", "check_comm_hook", "main"]

_STEPS = 3
# torch's bf16 hooks refuse other backends at registration (TypeError): not a gap of ours.
_BF16_REASON = "torch's bf16 compression hook needs CUDA 11+ with NCCL 2.10+ or XPU with XCCL, not gloo"
_POWER_SGD_STATE = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}

# (hook, wrapper, PowerSGD state options)
CASES: tuple[tuple[DDPCommunicationHookType, DDPCommunicationHookType, dict], ...] = (
    (DDPCommunicationHookType.NO, DDPCommunicationHookType.NO, {}),
    (DDPCommunicationHookType.FP16, DDPCommunicationHookType.NO, {}),
    (DDPCommunicationHookType.BF16, DDPCommunicationHookType.NO, {}),
    (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.NO, _POWER_SGD_STATE),
    (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.FP16, _POWER_SGD_STATE),
    (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BF16, _POWER_SGD_STATE),
    (DDPCommunicationHookType.BATCHED_POWER_SGD, DDPCommunicationHookType.NO, _POWER_SGD_STATE),
    (DDPCommunicationHookType.BATCHED_POWER_SGD, DDPCommunicationHookType.FP16, _POWER_SGD_STATE),
)
_BATCHED_REASON = (
    f"torch {torch.__version__}'s batched_powerSGD_hook fails its own shape check (it hands "
    "_orthogonalize one matrix where a batch is expected): a torch bug, not ours"
)


def _batched_power_sgd_works() -> bool:
    """Whether this torch's batched PowerSGD can orthogonalise its one low-rank matrix."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    try:
        # torch 2.13: torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py:19 (private; probes the bug)
        powerSGD_hook._orthogonalize(torch.randn(4, 1))  # what batched_powerSGD_hook passes it
    except AssertionError:
        return False
    return True


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1)).to(device)


def _batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(4, 8, generator=generator)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def _by_hand(handler: DistributedDataParallelKwargs, accelerator: Accelerator) -> torch.nn.Module:
    """The same model under plain DDP with the handler's hook registered by hand (no DDP in one process)."""
    model = _model(accelerator.device)
    if accelerator.num_processes == 1:
        return model
    device_ids = [accelerator.local_process_index] if accelerator.device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    handler.register_comm_hook(ddp)
    return ddp


def check_comm_hook(hook: DDPCommunicationHookType, wrapper: DDPCommunicationHookType, state: dict) -> None:
    """Train ``_STEPS`` steps prepared and by hand with ``hook``; the parameters agree after each step."""
    handler = DistributedDataParallelKwargs(
        comm_hook=hook,
        comm_wrapper=wrapper,  # pyright: ignore[reportArgumentType]  (CASES holds only NO/FP16/BF16 wrappers)
        comm_state_option=state,
    )
    accelerator = Accelerator(kwargs_handlers=[handler])
    prepared = accelerator.prepare(_model(accelerator.device))
    assert isinstance(prepared, torch.nn.Module)
    plain = _by_hand(handler, accelerator)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (prepared, plain)]
    for step in range(_STEPS):
        x, y = _batch(accelerator.process_index, step, accelerator.device)
        for model, optimizer in zip((prepared, plain), optimizers, strict=True):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if model is prepared:
                accelerator.backward(loss)
            else:
                loss.backward()
            optimizer.step()
        for a, b in zip(prepared.parameters(), plain.parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-6), f"{hook}/{wrapper} step {step}: {a} != {b}"


def main() -> None:
    """Run every hook case; the main process prints one line per case."""
    state = PartialState()
    for hook, wrapper, options in CASES:
        state.print(f"Test DDP comm hook: {hook.value}, comm wrapper: {wrapper.value}")
        uses_bf16 = DDPCommunicationHookType.BF16 in (hook, wrapper)
        if uses_bf16 and state.num_processes > 1 and state.device.type not in ("cuda", "xpu"):
            state.print(f"  skipped: {_BF16_REASON}")
            continue
        if hook is DDPCommunicationHookType.BATCHED_POWER_SGD and state.num_processes > 1:
            if not _batched_power_sgd_works():
                state.print(f"  skipped: {_BATCHED_REASON}")
                continue
        check_comm_hook(hook, wrapper, options)
    state.print("All DDP communication hook checks passed.")


if __name__ == "__main__":
    main()
