"""Plan a job: estimate every candidate layout on a cluster and rank those that fit.

Order of work for :func:`plan`: list the candidates the cluster allows (:func:`candidates`); simulate
the ones that can run on a fake process group (``ddp``'s model step, ``zero2``, ``fsdp2``, ``hsdp``,
``fsdp2_tp``); derive the others by formula (:mod:`.derive`); price each with the step-time model
(:mod:`.cost`); rank those whose peak fits the budget by estimated throughput (tokens per second: the
layouts differ in how many micro-batches one step processes, so raw step times are not comparable).

A model deeper than :data:`EXTRAPOLATE_ABOVE` layers is simulated with 2 and 4 layers and every count
(memory by category, collective bytes, parameters) is extended linearly to the real depth; the method
column says so. Memory and traffic of these layouts are affine in the layer count (every layer is its
own FSDP unit, the same size), which the tests check against a full-depth simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from accelerando.backends.planning.cost import communication_seconds, compute_seconds, step_flops
from accelerando.backends.planning.derive import (
    offload_from,
    pp_dp_from_ddp,
    zero1_from_ddp,
    zero3_from_fsdp2,
)
from accelerando.backends.planning.models import ModelSource
from accelerando.backends.planning.simulate import StepCount, simulate
from accelerando.backends.planning.spec import (
    CATEGORIES,
    Candidate,
    ClusterSpec,
    LayoutEstimate,
    MemoryBreakdown,
    TrainingShape,
)
from accelerando.core.parallelism_layout import model_facts_from_config

__all__ = ["EXTRAPOLATE_ABOVE", "LAYOUT_NAMES", "Plan", "candidates", "plan", "simulate_scaled"]

#: Models with more layers than this are simulated at 2 and 4 layers and extrapolated.
EXTRAPOLATE_ABOVE = 4
#: Layout families, in the order they are listed.
LAYOUT_NAMES = ("ddp", "zero1", "zero2", "fsdp2", "zero3", "hsdp", "fsdp2_tp", "pp_dp", "fsdp2+offload")
_SIMULATED = ("ddp", "zero2", "fsdp2", "hsdp", "fsdp2_tp")


@dataclass(frozen=True)
class Plan:
    """The estimates of every candidate, best first, and the chosen one.

    Attributes:
        model: the model's label.
        shape: the training shape planned for.
        cluster: the cluster planned for.
        estimates: fitting layouts by throughput (best first), then those that do not fit, by peak.
        skipped: ``name: why`` for candidates that could not be estimated.
        reasons: why the first estimate was chosen, one line each.
    """

    model: str
    shape: TrainingShape
    cluster: ClusterSpec
    estimates: list[LayoutEstimate]
    skipped: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> LayoutEstimate | None:
        """The best layout that fits, or None when none does."""
        return self.estimates[0] if self.estimates and self.estimates[0].fits else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(
    cluster: ClusterSpec,
    num_layers: int | None,
    heads: tuple[int | None, int | None],
    only: Sequence[str] | None = None,
) -> list[Candidate]:
    """The layouts to estimate on ``cluster``.

    Tensor-parallel degrees divide the devices of one machine and both head counts; pipeline stages
    (2, 4, 8) divide the layer count and the world size; ``hsdp`` (shard inside a machine, replicate
    across) needs more than one machine. ``fsdp2`` and ``zero3`` shard the same state over the same ranks,
    with torch's FSDP2 and with DeepSpeed's ZeRO-3 engine (which holds other buffers). ``only`` keeps the
    named families.
    """
    world, per_node = cluster.world_size, cluster.gpus_per_machine
    found = [
        Candidate("ddp", dp_replicate=world),
        Candidate("zero1", dp_replicate=world, zero_stage=1),
        Candidate("zero2", dp_shard=world, zero_stage=2),
        Candidate("fsdp2", dp_shard=world, zero_stage=3),
        Candidate("zero3", dp_shard=world, zero_stage=3),
    ]
    if cluster.num_machines > 1:
        found.append(Candidate("hsdp", dp_shard=per_node, dp_replicate=cluster.num_machines, zero_stage=3))
    attention, kv = heads
    for tp in _divisors(per_node):
        if tp > 1 and attention and attention % tp == 0 and (kv or attention) % tp == 0 and world // tp > 0:
            found.append(Candidate(f"fsdp2_tp{tp}", tp=tp, dp_shard=world // tp, zero_stage=3))
    for pp in (2, 4, 8):
        if num_layers and num_layers % pp == 0 and world % pp == 0 and pp <= world:
            found.append(Candidate(f"pp{pp}_dp", pp=pp, dp_replicate=world // pp))
    found.append(Candidate("fsdp2+offload", dp_shard=world, zero_stage=3, offload=True))
    if only:
        found = [c for c in found if any(c.name.startswith(name.replace("pp_dp", "pp")) for name in only)]
    return found


def _scale(a: StepCount, b: StepCount, low: int, high: int, target: int) -> StepCount:
    """Extend two counts (at ``low`` and ``high`` layers) linearly to ``target`` layers."""

    def line(x: int, y: int) -> int:
        return max(int(round(y + (y - x) * (target - high) / (high - low))), 0)

    memory = MemoryBreakdown(**{k: line(getattr(a.memory, k), getattr(b.memory, k)) for k in CATEGORIES})
    keys = set(a.collective_bytes) | set(b.collective_bytes)
    comms = {k: line(a.collective_bytes.get(k, 0), b.collective_bytes.get(k, 0)) for k in sorted(keys)}
    sizes = {k: line(a.zero3_sizes.get(k, 0), b.zero3_sizes.get(k, 0)) for k in a.zero3_sizes}
    return StepCount(
        memory,
        comms,
        line(a.trainable_bytes, b.trainable_bytes),
        line(a.num_parameters, b.num_parameters),
        sizes,
    )


def simulate_scaled(source: ModelSource, candidate: Candidate, shape: TrainingShape) -> tuple[StepCount, str]:
    """Simulate ``candidate``, at 2 and 4 layers extrapolated when the model is deeper than 4 layers.

    Returns:
        The count and the method label.
    """
    layers = source.num_layers
    if layers is None or layers <= EXTRAPOLATE_ABOVE:
        return simulate(source, candidate, shape), "simulated"
    low = simulate(source.with_layers(2), candidate, shape)
    high = simulate(source.with_layers(4), candidate, shape)
    return _scale(low, high, 2, 4, layers), f"simulated at 2 and 4 layers, extrapolated to {layers}"


def _base_name(candidate: Candidate) -> str:
    if candidate.name in ("zero1",) or candidate.name.startswith("pp"):
        return "ddp"
    if candidate.name == "zero3":
        return "fsdp2"
    return candidate.name.split("+")[0]


def plan(
    source: ModelSource,
    shape: TrainingShape,
    cluster: ClusterSpec,
    only: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Estimate every candidate layout for ``source`` on ``cluster`` and rank them.

    Args:
        source: the model (see :func:`~accelerando.backends.planning.models.resolve_model`).
        shape: micro-batch, sequence, precision, optimizer, activation checkpointing.
        cluster: machines, devices, memory, bandwidths and throughput.
        only: layout families to keep (:data:`LAYOUT_NAMES`); all by default.
        progress: called with one line before each simulation.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: a process group is already initialised in this process.
    """
    facts = model_facts_from_config(source.config) if source.config else None
    heads = (facts.num_attention_heads, facts.kv_heads) if facts else (None, None)
    hidden = facts.hidden_size if facts else None
    todo = candidates(cluster, source.num_layers, heads, only)
    counts: dict[str, tuple[StepCount, str]] = {}
    skipped: list[str] = []
    for candidate in todo:
        base = _base_name(candidate)
        if base in counts or not (base in _SIMULATED or base.startswith("fsdp2_tp")):
            continue
        simulated = candidate if candidate.name == base else _simulated_twin(candidate, cluster)
        if progress is not None:
            progress(
                f"simulating {simulated.name} ({simulated.describe()}) at world size {cluster.world_size}"
            )
        try:
            counts[base] = simulate_scaled(source, simulated, shape)
        except ValueError as err:
            skipped.append(f"{base}: {err}")
    sharded = counts.get("fsdp2")
    kept = sharded[0].memory.activations if sharded else None
    estimates = [
        est
        for c in todo
        if (est := _estimate(c, counts.get(_base_name(c)), shape, cluster, source.num_layers, hidden, kept))
        is not None
    ]
    ranked = sorted(
        estimates, key=lambda e: (not e.fits, -_throughput(e, shape) if e.fits else e.memory.peak)
    )
    result = Plan(source.name, shape, cluster, ranked, skipped)
    result.reasons.extend(_reasons(result))
    return result


def _simulated_twin(candidate: Candidate, cluster: ClusterSpec) -> Candidate:
    if candidate.name == "zero1" or candidate.name.startswith("pp"):
        return Candidate("ddp", dp_replicate=cluster.world_size)
    return replace(candidate, name=_base_name(candidate), offload=False)


def _estimate(
    candidate: Candidate,
    count: tuple[StepCount, str] | None,
    shape: TrainingShape,
    cluster: ClusterSpec,
    num_layers: int | None,
    hidden: int | None,
    forward_activations: int | None = None,
) -> LayoutEstimate | None:
    if count is None:
        return None
    step, method = count
    memory, comms = step.memory, dict(step.collective_bytes)
    if candidate.name == "zero1":
        memory, comms, method = zero1_from_ddp(memory, comms, candidate, step.trainable_bytes)
    elif candidate.name.startswith("pp"):
        memory, comms, method = pp_dp_from_ddp(memory, comms, candidate, shape, hidden, forward_activations)
    elif candidate.name == "zero3":
        memory, comms, method = zero3_from_fsdp2(memory, comms, step.zero3_sizes, shape)
    elif candidate.offload:
        memory, comms, method = offload_from(memory, comms, step.trainable_bytes, _base_name(candidate))
    flops = step_flops(step.num_parameters, shape, candidate, num_layers, hidden)
    return LayoutEstimate(
        candidate=candidate,
        memory=memory,
        collective_bytes=comms,
        method=method,
        compute_seconds=compute_seconds(flops, cluster),
        communication_seconds=communication_seconds(comms, candidate, cluster),
        fits=memory.peak <= cluster.budget,
    )


def _throughput(estimate: LayoutEstimate, shape: TrainingShape) -> float:
    """Tokens per second of the whole job under the step-time model."""
    c = estimate.candidate
    tokens = shape.tokens * c.data_parallel * (c.pp if c.pp > 1 else 1)
    return tokens / max(estimate.step_seconds, 1e-12)


def _reasons(result: Plan) -> list[str]:
    gib = 1024**3
    budget = f"{result.cluster.budget / gib:.3g} GiB usable per device"
    chosen = result.chosen
    if chosen is None:
        smallest = min(result.estimates, key=lambda e: e.memory.peak) if result.estimates else None
        need = (
            f" (smallest: {smallest.candidate.name} at {smallest.memory.peak / gib:.1f} GiB)"
            if smallest
            else ""
        )
        return [
            f"no layout fits {budget}{need}; fix: more devices, activation checkpointing, a smaller micro-batch "
            "or sequence, or devices with more memory"
        ]
    rate = _throughput(chosen, result.shape)
    lines = [
        f"chosen {chosen.candidate.name} ({chosen.candidate.describe()}): peak "
        f"{chosen.memory.peak / gib:.3g} GiB <= {budget}, highest estimated throughput of the layouts that fit "
        f"({rate:,.0f} tokens/s, {chosen.method})"
    ]
    lines += [
        f"{e.candidate.name} does not fit: peak {e.memory.peak / gib:.3g} GiB > {budget}"
        for e in result.estimates
        if not e.fits
    ]
    return lines
