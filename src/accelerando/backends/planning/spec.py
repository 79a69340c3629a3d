"""The plain records of a plan: the training shape, the cluster, a candidate layout and its estimate.

Nothing here imports torch; the simulator (:mod:`accelerando.backends.planning.simulate`) fills the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CATEGORIES",
    "Candidate",
    "ClusterSpec",
    "LayoutEstimate",
    "MemoryBreakdown",
    "TrainingShape",
]

_GIB = 1024**3
#: The memory categories of a breakdown, in report order.
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer", "activations", "temporaries")
_PRECISIONS = ("no", "bf16")
_OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class TrainingShape:
    """What one training step does on one data-parallel rank.

    Attributes:
        micro_batch: samples per data-parallel rank in one forward.
        seq_length: tokens per sample.
        mixed_precision: ``"no"`` (fp32) or ``"bf16"`` (bf16 compute and gathered parameters, fp32
            parameters, gradients reduced in fp32, fp32 optimizer state).
        optimizer: ``"adamw"`` (two fp32 states per parameter) or ``"sgd"`` (no state).
        activation_checkpointing: each transformer layer keeps only its input and is recomputed in backward.

    Raises:
        ValueError: a count below 1, or an unknown precision or optimizer.
    """

    micro_batch: int = 1
    seq_length: int = 2048
    mixed_precision: str = "bf16"
    optimizer: str = "adamw"
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.micro_batch < 1 or self.seq_length < 1:
            raise ValueError(
                f"micro_batch ({self.micro_batch}) and seq_length ({self.seq_length}) must be >= 1"
            )
        if self.mixed_precision not in _PRECISIONS:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} is not simulated; use one of {list(_PRECISIONS)}"
            )
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not simulated; use one of {list(_OPTIMIZERS)}")

    @property
    def tokens(self) -> int:
        """Tokens one data-parallel rank processes per step."""
        return self.micro_batch * self.seq_length


@dataclass(frozen=True)
class ClusterSpec:
    """The devices a job would run on, and the numbers the step-time model uses.

    Attributes:
        num_machines: machines (nodes).
        gpus_per_machine: devices per machine.
        device_memory: bytes of memory per device.
        intra_node_bandwidth: bytes/s one device moves over the links inside a node (NVLink-class
            default: 200 GB/s of achieved bus bandwidth).
        inter_node_bandwidth: bytes/s one device moves across nodes (default 25 GB/s: one 200 Gb/s
            NIC per device).
        device_flops: sustained dense bf16 FLOP/s of one device (default 400e12, about 40 % of an
            H100's peak).
        headroom: fraction of each device's memory kept out of the budget (CUDA context,
            allocator fragmentation, NCCL buffers).

    Raises:
        ValueError: a count, size or rate below or at 0, or a headroom outside [0, 1).
    """

    num_machines: int = 1
    gpus_per_machine: int = 8
    device_memory: int = 80 * _GIB
    intra_node_bandwidth: float = 200e9
    inter_node_bandwidth: float = 25e9
    device_flops: float = 400e12
    headroom: float = 0.10

    def __post_init__(self) -> None:
        for name in ("num_machines", "gpus_per_machine", "device_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClusterSpec.{name} must be an integer >= 1, got {value!r}")
        for name in ("intra_node_bandwidth", "inter_node_bandwidth", "device_flops"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ClusterSpec.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"ClusterSpec.headroom must be in [0, 1), got {self.headroom!r}")

    @property
    def world_size(self) -> int:
        """Devices in the job."""
        return self.num_machines * self.gpus_per_machine

    @property
    def budget(self) -> int:
        """Bytes of one device a layout may use (memory less headroom)."""
        return int(self.device_memory * (1 - self.headroom))


@dataclass(frozen=True)
class Candidate:
    """One layout to estimate.

    Attributes:
        name: the row label (``ddp``, ``zero1``, ``zero2``, ``fsdp2``, ``fsdp2_tp``, ``pp_dp``, with an
            ``+offload`` suffix when the sharded state lives in CPU memory).
        tp: tensor-parallel degree.
        pp: pipeline stages.
        dp_shard: FSDP / ZeRO shards.
        dp_replicate: data-parallel replicas.
        zero_stage: 0 (replicated state), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters).
        offload: sharded parameters, gradients and optimizer state held in CPU memory.
    """

    name: str
    tp: int = 1
    pp: int = 1
    dp_shard: int = 1
    dp_replicate: int = 1
    zero_stage: int = 0
    offload: bool = False

    @property
    def world_size(self) -> int:
        """Devices the layout uses."""
        return self.tp * self.pp * self.dp_shard * self.dp_replicate

    @property
    def data_parallel(self) -> int:
        """Data-parallel ranks (each reads its own micro-batch)."""
        return self.dp_shard * self.dp_replicate

    def describe(self) -> str:
        """The degrees, one short string."""
        return f"tp={self.tp} pp={self.pp} dp_shard={self.dp_shard} dp_replicate={self.dp_replicate}"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes live on one rank at its peak, by category.

    Attributes:
        parameters: parameters and buffers (sharded and gathered).
        gradients: parameter gradients (sharded and unsharded, DDP buckets).
        optimizer: optimizer state.
        activations: tensors kept by the forward pass for backward.
        temporaries: everything else live at the peak (gradients of activations, collective buffers).
        peak: the total at the peak (the sum of the five).
    """

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    temporaries: int = 0

    @property
    def peak(self) -> int:
        """The sum of the categories."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.temporaries

    def as_dict(self) -> dict[str, int]:
        """The categories and the peak as a dict (for JSON)."""
        return {**{name: getattr(self, name) for name in CATEGORIES}, "peak": self.peak}


@dataclass(frozen=True)
class LayoutEstimate:
    """What one candidate costs on one rank per step.

    Attributes:
        candidate: the layout.
        memory: peak memory on one device, by category.
        collective_bytes: bytes per collective kind per step on one rank (see :mod:`.tracking`).
        method: ``"simulated"`` or ``"formula: ..."`` saying what was derived from what.
        compute_seconds: FLOPs of the step / device throughput.
        communication_seconds: collective bytes / link bandwidth (not overlapped with compute).
        fits: peak <= the cluster's budget.
        notes: caveats for this row.
    """

    candidate: Candidate
    memory: MemoryBreakdown
    collective_bytes: dict[str, int]
    method: str
    compute_seconds: float = 0.0
    communication_seconds: float = 0.0
    fits: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def step_seconds(self) -> float:
        """Estimated seconds per step: compute plus communication (no overlap assumed)."""
        return self.compute_seconds + self.communication_seconds
