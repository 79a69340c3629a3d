"""Layouts estimated by formula from a simulated one (each says so in its ``method``).

- ``zero1`` from the ``ddp`` simulation: the optimizer state is divided by the data-parallel ranks;
  the gradients are still all-reduced whole, and the updated parameters all-gathered (DeepSpeed's
  stage 1). DeepSpeed's engine cannot run on the fake process group, so it is not simulated.
- ``pp_dp`` from the ``ddp`` simulation: parameters, gradients, optimizer state and temporaries are
  divided by the ``pp`` stages; a 1F1B schedule of ``pp`` micro-batches keeps up to ``pp`` micro-batches
  of activations for ``L / pp`` layers on the first stage, as many as the whole model keeps for one
  micro-batch: the activations the ``fsdp2`` simulation saw at its peak (the start of backward). Point-to-point bytes: one hidden-state tensor
  (``micro_batch * s * h`` elements) forward and one gradient backward per micro-batch per stage
  boundary. ``torch.distributed.pipelining`` is not run on the fake process group.
- ``+offload`` from its simulated sharded layout: the sharded parameters and gradients and the whole
  optimizer state move to CPU memory (FSDP2 ``CPUOffloadPolicy``); the device keeps gathered layers,
  activations and temporaries. Host transfers: the sharded parameters in, the sharded gradients out,
  once per step.
"""

from __future__ import annotations

from dataclasses import replace

from accelerando.backends.planning.spec import Candidate, MemoryBreakdown, TrainingShape

__all__ = ["offload_from", "pp_dp_from_ddp", "zero1_from_ddp"]


def zero1_from_ddp(
    memory: MemoryBreakdown, collectives: dict[str, int], candidate: Candidate, trainable_bytes: int
) -> tuple[MemoryBreakdown, dict[str, int], str]:
    """ZeRO-1 on ``candidate.data_parallel`` ranks from the DDP simulation."""
    ranks = candidate.data_parallel
    derived = replace(memory, optimizer=-(-memory.optimizer // ranks))
    comms = {**collectives, "all_gather (dp)": trainable_bytes}
    return derived, comms, "formula from the ddp simulation (optimizer state / data-parallel ranks)"


def pp_dp_from_ddp(
    memory: MemoryBreakdown,
    collectives: dict[str, int],
    candidate: Candidate,
    shape: TrainingShape,
    hidden_size: int | None,
    activations: int | None = None,
) -> tuple[MemoryBreakdown, dict[str, int], str]:
    """``pp`` pipeline stages, each data parallel (DDP), from the DDP simulation.

    ``activations``: what the forward keeps for one micro-batch of the whole model (the ``fsdp2``
    simulation's, whose peak is at the start of backward); the DDP peak may fall in the optimizer step,
    where none are live. Default: the DDP peak's.
    """
    pp = candidate.pp
    derived = MemoryBreakdown(
        parameters=memory.parameters // pp,
        gradients=memory.gradients // pp,
        optimizer=memory.optimizer // pp,
        activations=max(memory.activations, activations or 0),
        temporaries=memory.temporaries // pp,
    )
    comms = {key: size // pp for key, size in collectives.items()}
    element = 2 if shape.mixed_precision == "bf16" else 4
    if hidden_size:
        comms["send_recv (pp)"] = 2 * pp * shape.micro_batch * shape.seq_length * hidden_size * element
    method = "formula from the ddp simulation (state / pp; 1F1B keeps one micro-batch's activations)"
    return derived, comms, method


def offload_from(
    memory: MemoryBreakdown, collectives: dict[str, int], sharded_bytes: int, base: str
) -> tuple[MemoryBreakdown, dict[str, int], str]:
    """CPU offload of the sharded state of a simulated FSDP2 layout (``sharded_bytes``: its parameter shards)."""
    derived = replace(
        memory,
        parameters=max(memory.parameters - sharded_bytes, 0),
        gradients=max(memory.gradients - sharded_bytes, 0),
        optimizer=0,
    )
    comms = {**collectives, "host transfers": 2 * sharded_bytes}
    return derived, comms, f"formula from the {base} simulation (sharded state moved to CPU memory)"
