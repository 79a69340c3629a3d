"""The step-time model: FLOPs / device throughput + collective bytes / link bandwidth.

Deliberately simple, and written down so a user can redo it by hand:

- FLOPs of one training step on one device: ``(6 * P + 12 * L * h * s) * T / (tp * pp)``, where ``P``
  is the parameter count, ``L`` / ``h`` the layers and hidden size, ``s`` the sequence length and ``T``
  the tokens one data-parallel rank processes per step (``micro_batch * s``; times ``pp`` micro-batches
  for a pipeline). ``6 P`` per token is the forward (2) and backward (4) matrix products, ``12 L h s``
  the attention scores (Narayanan et al., 2021). Activation checkpointing recomputes the forward:
  ``x 4/3``. A pipeline of ``pp`` stages fed ``m = pp`` micro-batches idles ``(pp - 1) / m`` of the time
  (the 1F1B bubble): ``x (m + pp - 1) / m``.
- Communication: each collective costs ``bytes * f / bandwidth`` with the ring factor ``f`` =
  ``(n - 1) / n`` for all-gather and reduce-scatter, ``2 (n - 1) / n`` for all-reduce, 1 for broadcast
  and point-to-point, ``n`` the group size. The bandwidth is the intra-node one when the group fits in
  one machine, the inter-node one otherwise. No overlap with compute is assumed (an upper bound:
  FSDP and DDP overlap much of it in practice), and CPU offload adds its host transfers at the
  PCIe bandwidth (25 GB/s).
"""

from __future__ import annotations

from accelerando.backends.planning.spec import Candidate, ClusterSpec, TrainingShape

__all__ = ["PCIE_BANDWIDTH", "communication_seconds", "compute_seconds", "step_flops"]

#: Host <-> device bytes/s assumed for CPU offload (PCIe 4.0 x16, achieved).
PCIE_BANDWIDTH = 25e9


def step_flops(
    num_parameters: int,
    shape: TrainingShape,
    candidate: Candidate,
    num_layers: int | None,
    hidden_size: int | None,
) -> float:
    """FLOPs one device computes per step (see the module docstring)."""
    micro_batches = candidate.pp if candidate.pp > 1 else 1
    tokens = shape.tokens * micro_batches
    attention = 12 * (num_layers or 0) * (hidden_size or 0) * shape.seq_length
    flops = (6 * num_parameters + attention) * tokens / (candidate.tp * candidate.pp)
    if shape.activation_checkpointing:
        flops *= 4 / 3
    if candidate.pp > 1:
        flops *= (micro_batches + candidate.pp - 1) / micro_batches
    return flops


def compute_seconds(flops: float, cluster: ClusterSpec) -> float:
    """Seconds of compute at the cluster's sustained device throughput."""
    return flops / cluster.device_flops


def _group(key: str, candidate: Candidate) -> tuple[int, int]:
    """(group size, devices the group's ranks span) of a collective key for ``candidate``."""
    if key.endswith("(tp)"):
        return candidate.tp, candidate.tp
    if key.endswith("(pp)"):
        return 2, candidate.tp * 2
    if candidate.zero_stage >= 2 and candidate.dp_replicate > 1 and key.startswith("all_reduce"):
        # HSDP: the sharded gradients are all-reduced across the replicas (one rank per machine apart).
        return candidate.dp_replicate, candidate.world_size
    size = candidate.dp_shard if candidate.zero_stage >= 2 else candidate.data_parallel
    return size, size * candidate.tp


def _factor(key: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if key.startswith(("all_gather", "reduce_scatter")):
        return (n - 1) / n
    if key.startswith("all_reduce"):
        return 2 * (n - 1) / n
    return 1.0


def communication_seconds(
    collective_bytes: dict[str, int], candidate: Candidate, cluster: ClusterSpec
) -> float:
    """Seconds the step's collectives take on the cluster's links (see the module docstring)."""
    total = 0.0
    for key, size in collective_bytes.items():
        if key.startswith("host"):
            total += size / PCIE_BANDWIDTH
            continue
        n, span = _group(key, candidate)
        bandwidth = (
            cluster.intra_node_bandwidth if span <= cluster.gpus_per_machine else cluster.inter_node_bandwidth
        )
        total += size * _factor(key, n) / bandwidth
    return total
