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
- ``zero3`` (DeepSpeed ZeRO-3) from the ``fsdp2`` simulation: the activations and temporaries of the
  step are FSDP2's (the same model, sharded the same way), the state is what DeepSpeed's stage-3
  optimizer allocates (:func:`zero3_from_fsdp2`), with DeepSpeed's documented defaults
  (:data:`ZERO3_DEFAULTS`). DeepSpeed's engine cannot run on the fake process group.
- ``+offload`` from its simulated sharded layout: the sharded parameters and gradients and the whole
  optimizer state move to CPU memory (FSDP2 ``CPUOffloadPolicy``); the device keeps gathered layers,
  activations and temporaries. Host transfers: the sharded parameters in, the sharded gradients out,
  once per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from accelerando.backends.planning.spec import Candidate, MemoryBreakdown, TrainingShape

__all__ = [
    "ZERO3_DEFAULTS",
    "Zero3Settings",
    "offload_from",
    "pp_dp_from_ddp",
    "zero1_from_ddp",
    "zero3_from_fsdp2",
]


@dataclass(frozen=True)
class Zero3Settings:
    """The DeepSpeed ZeRO-3 settings its memory depends on (``zero_optimization`` keys, in elements).

    Attributes:
        reduce_bucket_size: ``reduce_bucket_size``: the gradient bucket, allocated whole at engine start
            (one per parameter dtype) and reduce-scattered when full or at the end of backward.
        prefetch_bucket_size: ``stage3_prefetch_bucket_size``: parameters fetched ahead of use.
        param_persistence_threshold: ``stage3_param_persistence_threshold``: parameters this small are
            kept whole on every rank.
        max_live_parameters: ``stage3_max_live_parameters``: gathered parameters kept at most.
        max_reuse_distance: ``stage3_max_reuse_distance``: a gathered parameter used again within this
            many fetched elements is not released in between (so the last layers of the forward stay
            gathered into the backward, and a model smaller than this is gathered once per step).
    """

    reduce_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000

    @classmethod
    def from_config(cls, zero_optimization: Mapping[str, object]) -> Zero3Settings:
        """The settings a DeepSpeed ``zero_optimization`` section gives (its keys; defaults for the rest)."""
        keys = {
            "reduce_bucket_size": "reduce_bucket_size",
            "stage3_prefetch_bucket_size": "prefetch_bucket_size",
            "stage3_param_persistence_threshold": "param_persistence_threshold",
            "stage3_max_live_parameters": "max_live_parameters",
            "stage3_max_reuse_distance": "max_reuse_distance",
        }
        return cls(
            **{
                field: int(str(zero_optimization[key]))
                for key, field in keys.items()
                if key in zero_optimization
            }
        )


#: DeepSpeed's defaults (``deepspeed.runtime.zero.config.DeepSpeedZeroConfig``), what a
#: ``DeepSpeedPlugin(zero_stage=3)`` without a config file runs with.
ZERO3_DEFAULTS = Zero3Settings()


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


def zero3_from_fsdp2(
    memory: MemoryBreakdown,
    collectives: dict[str, int],
    sizes: dict[str, int],
    shape: TrainingShape,
    settings: Zero3Settings = ZERO3_DEFAULTS,
) -> tuple[MemoryBreakdown, dict[str, int], str]:
    """DeepSpeed ZeRO-3 (stage 3 of its engine) on the ranks of an ``fsdp2`` simulation.

    Args:
        memory: the ``fsdp2`` simulation's peak (its activations and temporaries are kept).
        collectives: the ``fsdp2`` simulation's collective bytes (replaced).
        sizes: :func:`~accelerando.backends.planning.simulate.zero3_sizes` of the model at these ranks.
        shape: precision (DeepSpeed converts the model to bf16 under bf16 mixed precision) and optimizer.
        settings: the ``zero_optimization`` settings.

    What one rank holds (element size ``e``: 2 under bf16, else 4):

    - parameters: the persistent ones whole, its flat partition of every parameter (``partition``
      elements), the buffers, and the gathered parameters live at the peak (the start of backward):
      those the forward gathered last and the backward reuses within ``max_reuse_distance`` elements,
      at most ``max_live_parameters``, plus one prefetch bucket when that window is not the whole model;
    - gradients: the reduce bucket (``reduce_bucket_size`` x e, allocated whole at engine start) and
      the flat gradient partition (``partition`` x e, in the gradient-accumulation dtype, the model's);
    - optimizer: the fp32 master partition (``partition`` x 4) and AdamW's two fp32 states on it
      (plus its 4-byte step).

    Collectives per steady-state step: the gradients reduce-scattered once (all padded elements x e),
    the non-persistent parameters all-gathered in forward and again in backward, less those kept
    gathered across the turn (the window above), the persistent ones
    all-gathered once after the optimizer step, and one 8-byte all-reduce (the gradient norm). A
    single rank still "reduce-scatters" its gradients (to itself) and gathers nothing; its parameters'
    data are their partitions.
    """
    size = 2 if shape.mixed_precision == "bf16" else 4
    partition, gathered_aligned = sizes["partition"], sizes["gathered_aligned"]
    aligned = sizes["persistent_aligned"] + gathered_aligned
    whole = 0  # on one rank a parameter's data is its partition: nothing is gathered or kept twice
    if sizes["ranks"] > 1:
        kept = min(gathered_aligned, settings.max_reuse_distance, settings.max_live_parameters)
        live = (
            kept if kept == gathered_aligned else min(gathered_aligned, kept + settings.prefetch_bucket_size)
        )
        whole = (sizes["persistent"] + live) * size
    states = 2 * partition * 4 + 4 if shape.optimizer == "adamw" else 0
    derived = replace(
        memory,
        parameters=whole + partition * size + sizes["buffer_bytes"],
        gradients=settings.reduce_bucket_size * size + partition * size,
        optimizer=partition * 4 + states,
    )
    comms = {"all_reduce (dp)": 8, "reduce_scatter (dp)": aligned * size}
    if sizes["ranks"] > 1:
        kept = min(gathered_aligned, settings.max_reuse_distance, settings.max_live_parameters)
        comms["all_gather (dp)"] = (sizes["persistent_aligned"] + 2 * gathered_aligned - kept) * size
    del collectives  # FSDP2's traffic is not DeepSpeed's
    method = "formula from the fsdp2 simulation (DeepSpeed ZeRO-3 engine: its buffers, default settings)"
    return derived, comms, method
