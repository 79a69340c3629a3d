"""Automatic parallel layout: choose tp / pp / dp_shard / dp_replicate from the model and the machine.

Beyond the reference (Accelerate has no automatic layout). :func:`choose_layout` is a pure function:
given the facts of a model (:class:`ModelFacts`: parameter count, layers, attention and key/value
heads, hidden size), the machine (:class:`MachineShape`: nodes, devices per node, memory per device)
and the training shape (micro-batch, sequence length, precision), it returns the :class:`Layout` with
the least model parallelism whose estimated memory fits one device, with the reasons for the choice.

Memory model, bytes on one device (``P`` parameters, ``L`` layers, hidden ``h``, ``a`` attention heads,
micro-batch ``b``, sequence ``s``)::

    state       = P * (w + g + o) / (tp * pp * dp_shard)
    gathered    = (P / L) * w / tp                        only with dp_shard > 1 (FSDP all-gathers a layer)
    activations = (L * kept + extra) / (tp * pp)        kept = s * b * h * (34 + 5 * a * s / h) * (e / 2)
    estimate    = state + gathered + activations          fits when estimate <= memory * (1 - headroom)

``w`` / ``g`` are the bytes of a weight / gradient element (2 with ``bf16``/``fp16`` mixed precision,
4 with ``"no"``), ``o`` the optimizer bytes per parameter (AdamW: two fp32 states = 8, plus fp32 master
weights = 4 under mixed precision; SGD: 0; none when not training), ``e`` the bytes of an activation
element (2 or 4). ``kept`` is the per-layer activation estimate of Korthikanti et al. (2022) for a
transformer layer, and ``extra`` = 0. With activation checkpointing a layer keeps only its input
(``kept = 2 * s * b * h * e / 2``) and one layer is recomputed at a time (``extra`` = a full layer's);
for inference nothing is kept and ``extra`` is one layer's. Tensor (and sequence) parallelism divides
the activations by ``tp``; a 1F1B pipeline of ``pp`` stages, each fed ``pp`` micro-batches of
``b / pp`` samples, by ``pp``. The estimate leaves out the logits, the CUDA context and fragmentation:
the headroom (10 % by default) is there for them.

Search order: fully replicated data parallelism; then FSDP sharding alone (the least ``dp_shard``
that fits); then model parallelism in increasing ``tp * pp``, tensor parallelism first (``tp`` divides
the devices of a node and the attention and key/value head counts), pipeline stages next (``pp``
divides the layer count and the devices left); the remaining devices shard (``dp_shard``) and
replicate (``dp_replicate``) the data-parallel copies. Tensor parallelism is never put on pure
replication (``ParallelismConfig`` refuses ``tp > 1`` with ``dp_replicate > 1`` and ``dp_shard == 1``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Layout",
    "MachineShape",
    "ModelFacts",
    "choose_layout",
    "estimate_memory",
    "model_facts_from_config",
    "model_facts_from_module",
    "parse_memory",
]

_GIB = 1024**3
_PRECISIONS = ("no", "fp32", "bf16", "fp16", "fp8")
_OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0}
_GATED_ACTIVATIONS = ("silu", "swiglu", "swish", "geglu", "gelu_pytorch_tanh_gated")


def _gib(value: float) -> str:
    return f"{value / _GIB:.1f} GiB"


@dataclass(frozen=True)
class ModelFacts:
    """What the layout needs to know about a model.

    Attributes:
        num_parameters: parameters of the whole model.
        num_layers: transformer blocks (``num_hidden_layers``); None when unknown (then ``pp`` stays 1).
        num_attention_heads: attention heads; None when unknown (then ``tp`` stays 1).
        num_key_value_heads: key/value heads (grouped-query attention); None = same as attention heads.
        hidden_size: width of the hidden states; None when unknown (activations are not estimated).
        name: a label for messages.

    Raises:
        ValueError: a count below 1.
    """

    num_parameters: int
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    hidden_size: int | None = None
    name: str = "model"

    def __post_init__(self) -> None:
        for attr in (
            "num_parameters",
            "num_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_size",
        ):
            value = getattr(self, attr)
            if value is None and attr != "num_parameters":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelFacts.{attr} must be an integer >= 1, got {value!r}")

    @property
    def kv_heads(self) -> int | None:
        """Key/value heads (the attention heads when the model does not say)."""
        return self.num_key_value_heads or self.num_attention_heads

    def describe(self) -> str:
        """One line: the facts the layout uses."""
        count = self.num_parameters
        size = (
            f"{count / 1e9:.3g}B" if count >= 1e9 else f"{count / 1e6:.3g}M" if count >= 1e6 else str(count)
        )
        parts = [f"{self.name}: {size} parameters"]
        if self.num_layers:
            parts.append(f"{self.num_layers} layers")
        if self.num_attention_heads:
            kv = f" ({self.kv_heads} key/value)" if self.kv_heads != self.num_attention_heads else ""
            parts.append(f"{self.num_attention_heads} attention heads{kv}")
        if self.hidden_size:
            parts.append(f"hidden size {self.hidden_size}")
        return ", ".join(parts)


@dataclass(frozen=True)
class MachineShape:
    """The devices a job runs on.

    Attributes:
        num_nodes: machines in the job.
        devices_per_node: devices (processes) on each machine.
        memory_per_device: bytes of memory of one device (for CPU processes: the RAM each may use).
        device_type: ``"cuda"``, ``"cpu"``, ... (shown in messages only).

    Raises:
        ValueError: a count or memory below 1.
    """

    num_nodes: int
    devices_per_node: int
    memory_per_device: int
    device_type: str = "cuda"

    def __post_init__(self) -> None:
        for attr in ("num_nodes", "devices_per_node", "memory_per_device"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MachineShape.{attr} must be an integer >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        """Devices in the whole job."""
        return self.num_nodes * self.devices_per_node

    def describe(self) -> str:
        """One line: nodes, devices and memory."""
        return (
            f"machine: {self.num_nodes} node(s) x {self.devices_per_node} {self.device_type} device(s), "
            f"{_gib(self.memory_per_device)} each"
        )


@dataclass(frozen=True)
class Layout:
    """The chosen layout.

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline stages.
        dp_shard: FSDP shards per data-parallel replica.
        dp_replicate: data-parallel replicas.
        memory_per_device: estimated bytes one device needs.
        memory_budget: bytes of one device the estimate had to fit in (memory less headroom).
        reason: why this layout, one sentence per line (logged, shown by ``launch --dry-run``).
    """

    tp: int
    pp: int
    dp_shard: int
    dp_replicate: int
    memory_per_device: int
    memory_budget: int
    reason: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        """Devices the layout uses: the product of the four degrees."""
        return self.tp * self.pp * self.dp_shard * self.dp_replicate

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """``(tp, pp, dp_shard, dp_replicate)``."""
        return (self.tp, self.pp, self.dp_shard, self.dp_replicate)

    def describe(self) -> str:
        """One line: the degrees and the memory estimate."""
        return (
            f"tp={self.tp} pp={self.pp} dp_shard={self.dp_shard} dp_replicate={self.dp_replicate} "
            f"(~{_gib(self.memory_per_device)} per device of {_gib(self.memory_budget)} usable)"
        )


# --------------------------------------------------------------------------------- model facts
_CONFIG_NAMES = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
}


def _config_dict(config: Any) -> dict[str, Any]:
    """A transformers config, a mapping, or a path to ``config.json`` (or its folder) as a dict."""
    if isinstance(config, Mapping):
        data = dict(config)
    elif isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(
                f"no model config at {str(config)!r}: give a transformers config.json file or the folder holding it"
            )
        data = json.loads(path.read_text())
    elif hasattr(config, "to_dict"):
        data = config.to_dict()
    else:
        data = dict(vars(config))
    # Multimodal configs nest the language model's facts.
    for nested in ("text_config", "llm_config", "language_config"):
        inner = data.get(nested)
        if isinstance(inner, Mapping) and not any(k in data for k in _CONFIG_NAMES["num_layers"]):
            data = {**data, **inner}
    return data


def _first(data: Mapping[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _estimate_parameters(data: Mapping[str, Any], layers: int, heads: int, kv: int, hidden: int) -> int:
    """Parameters of a decoder-style transformer from its config (attention, MLP, norms, embeddings)."""
    head_dim = data.get("head_dim") or hidden // heads
    attention = hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    inner = data.get("intermediate_size") or data.get("n_inner") or data.get("ffn_dim") or 4 * hidden
    act = str(data.get("hidden_act") or data.get("activation_function") or "").lower()
    mlp = (3 if act in _GATED_ACTIVATIONS else 2) * hidden * inner
    vocab = int(data.get("vocab_size") or 0)
    embeddings = vocab * hidden * (1 if data.get("tie_word_embeddings", True) else 2)
    return layers * (attention + mlp + 2 * hidden) + embeddings + hidden


def model_facts_from_config(config: Any, num_parameters: int | None = None) -> ModelFacts:
    """Model facts from a transformers config (object, dict, or ``config.json`` path), without weights.

    Args:
        config: a ``PretrainedConfig``, a mapping of its fields, or a path to ``config.json`` / its folder.
        num_parameters: the exact count when known; otherwise estimated from the config (attention,
            MLP (gated for SiLU activations), norms and embeddings).

    Raises:
        ValueError: the config lacks the layer, head or hidden-size counts and no parameter count is
            given, or the path holds no config.
    """
    data = _config_dict(config)
    facts = {key: _first(data, names) for key, names in _CONFIG_NAMES.items()}
    if num_parameters is None:
        layers, heads, hidden = facts["num_layers"], facts["num_attention_heads"], facts["hidden_size"]
        if not (layers and heads and hidden):
            raise ValueError(
                "cannot estimate the parameter count: the config has no num_hidden_layers / "
                "num_attention_heads / hidden_size; pass num_parameters=..."
            )
        num_parameters = _estimate_parameters(
            data, layers, heads, facts["num_key_value_heads"] or heads, hidden
        )
    name = str(data.get("_name_or_path") or data.get("model_type") or "model")
    return ModelFacts(num_parameters=int(num_parameters), name=name, **facts)


def model_facts_from_module(module: Any) -> ModelFacts:
    """Model facts from a ``torch.nn.Module``: its parameter count, plus its ``config``'s counts when present.

    Parameters on the meta device count too (no weights need to exist). Shared parameters count once.

    Raises:
        ValueError: the module has no parameters.
    """
    seen: set[int] = set()
    total = 0
    for param in module.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    if total == 0:
        raise ValueError(f"{type(module).__name__} has no parameters: nothing to lay out")
    config = getattr(module, "config", None)
    if config is not None:
        facts = model_facts_from_config(config, num_parameters=total)
        return ModelFacts(
            **{**facts.__dict__, "name": facts.name if facts.name != "model" else type(module).__name__}
        )
    return ModelFacts(num_parameters=total, name=type(module).__name__)


def parse_memory(value: int | float | str) -> int:
    """Bytes from ``80GB`` / ``80GiB`` / ``24g`` / ``512MB`` / a number of bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, ... and bare K/M/G/T) of 1024.

    Raises:
        ValueError: text that is not a size.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*", str(value), re.IGNORECASE)
    if not match or (match.group(3) and not match.group(2)):
        raise ValueError(f"{value!r} is not a memory size; write e.g. 80GB, 80GiB or 24G")
    number, unit, binary, byte = match.groups()
    power = "kmgt".find(unit.lower()) + 1
    base = 1024 if binary or not byte else 1000
    return int(float(number) * base**power)


# --------------------------------------------------------------------------------- the estimate
@dataclass(frozen=True)
class _Costs:
    state_bytes_per_param: float
    weight_bytes: int
    kept_per_layer: float  # activations each layer keeps for backward (whole micro-batch, no parallelism)
    transient: float  # one layer's working activations on top (recomputed layer, or inference)
    state_note: str
    activation_note: str


def _costs(
    facts: ModelFacts,
    *,
    batch_size: int,
    seq_length: int,
    mixed_precision: str,
    optimizer: str,
    training: bool,
    activation_checkpointing: bool,
) -> _Costs:
    if mixed_precision not in _PRECISIONS:
        raise ValueError(f"mixed_precision={mixed_precision!r}; use one of {list(_PRECISIONS)}")
    if optimizer.lower() not in _OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(_OPTIMIZERS)}")
    if batch_size < 1 or seq_length < 1:
        raise ValueError(f"batch_size ({batch_size}) and seq_length ({seq_length}) must be >= 1")
    mixed = mixed_precision not in ("no", "fp32")
    element = 2 if mixed else 4
    states = _OPTIMIZERS[optimizer.lower()]
    if training:
        master = 4 if mixed else 0
        per_param = element + element + 4 * states + master
        note = (
            f"{per_param} bytes/parameter ({element}-byte weights and gradients"
            + (", fp32 master weights" if master else "")
            + (f", {states} fp32 {optimizer} states" if states else "")
            + ")"
        )
    else:
        per_param = element
        note = f"{per_param} bytes/parameter (weights only: not training)"
    if not facts.hidden_size:
        return _Costs(per_param, element, 0.0, 0.0, note, "activations not estimated (no hidden size known)")
    sbh = seq_length * batch_size * facts.hidden_size
    scale = element / 2
    heads = facts.num_attention_heads or 1
    full = sbh * (34 + 5 * heads * seq_length / facts.hidden_size) * scale
    tokens = f"micro-batch {batch_size} x {seq_length} tokens"
    if not training:
        return _Costs(
            per_param, element, 0.0, full, note, f"activations: {_gib(full)} (one layer live) for {tokens}"
        )
    if activation_checkpointing:
        kept = 2.0 * sbh * scale
        act_note = (
            f"activations: {_gib(kept)} per layer (checkpointed) + {_gib(full)} recomputed for {tokens}"
        )
        return _Costs(per_param, element, kept, full, note, act_note)
    return _Costs(per_param, element, full, 0.0, note, f"activations: {_gib(full)} per layer for {tokens}")


def _estimate(facts: ModelFacts, costs: _Costs, tp: int, pp: int, dp_shard: int) -> float:
    layers = facts.num_layers or 1
    state = facts.num_parameters * costs.state_bytes_per_param / (tp * pp * dp_shard)
    gathered = facts.num_parameters / layers * costs.weight_bytes / tp if dp_shard > 1 else 0.0
    activations = (layers * costs.kept_per_layer + costs.transient) / (tp * pp)
    return state + gathered + activations


def estimate_memory(
    facts: ModelFacts,
    *,
    tp: int = 1,
    pp: int = 1,
    dp_shard: int = 1,
    batch_size: int = 1,
    seq_length: int = 2048,
    mixed_precision: str = "bf16",
    optimizer: str = "adamw",
    training: bool = True,
    activation_checkpointing: bool = False,
) -> int:
    """Estimated bytes one device needs for a layout (the formula of this module's docstring).

    Raises:
        ValueError: an unknown precision or optimizer, or a batch or sequence below 1.
    """
    costs = _costs(
        facts,
        batch_size=batch_size,
        seq_length=seq_length,
        mixed_precision=mixed_precision,
        optimizer=optimizer,
        training=training,
        activation_checkpointing=activation_checkpointing,
    )
    return int(_estimate(facts, costs, tp, pp, dp_shard))


# --------------------------------------------------------------------------------- the search
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_choices(facts: ModelFacts, machine: MachineShape, reason: list[str]) -> list[int]:
    """Tensor-parallel degrees allowed: divide the node's devices and both head counts."""
    allowed = []
    for tp in _divisors(machine.devices_per_node):
        if tp > 1 and not facts.num_attention_heads:
            reason.append(f"tp={tp} excluded: the model's attention head count is unknown")
            break
        bad = [
            f"{count} {what}"
            for count, what in (
                (facts.num_attention_heads, "attention heads"),
                (facts.num_key_value_heads, "key/value heads"),
            )
            if count and count % tp and not (what[0] == "k" and count == facts.num_attention_heads)
        ]
        if bad:
            reason.append(f"tp={tp} excluded: does not divide {' and '.join(bad)}")
            continue
        allowed.append(tp)
    return allowed


def _pp_choices(facts: ModelFacts, devices_left: int) -> list[int]:
    """Pipeline stages allowed: divide the layer count and the devices left after tensor parallelism."""
    layers = facts.num_layers
    return [pp for pp in _divisors(devices_left) if pp == 1 or (layers and layers % pp == 0)]


def choose_layout(
    facts: ModelFacts,
    machine: MachineShape,
    *,
    batch_size: int = 1,
    seq_length: int = 2048,
    mixed_precision: str = "bf16",
    optimizer: str = "adamw",
    training: bool = True,
    activation_checkpointing: bool = False,
    headroom: float = 0.10,
    simulator: Callable[[int, int, int, int], int | None] | None = None,
) -> Layout:
    """Choose tp / pp / dp_shard / dp_replicate for a model on a machine: the least model parallelism that fits.

    Args:
        facts: the model (see :func:`model_facts_from_module`, :func:`model_facts_from_config`).
        machine: nodes, devices per node and memory per device.
        batch_size: micro-batch each data-parallel rank processes in one forward.
        seq_length: tokens per sample.
        mixed_precision: ``"no"`` (fp32 everywhere), ``"bf16"``, ``"fp16"`` or ``"fp8"`` (16-bit weights,
            gradients and activations, fp32 master weights).
        optimizer: ``"adamw"`` / ``"adam"`` (two fp32 states per parameter) or ``"sgd"`` (none).
        training: False counts the weights only (inference).
        activation_checkpointing: layers keep only their input for the backward pass.
        headroom: fraction of each device's memory left out of the budget (CUDA context, fragmentation,
            logits).
        simulator: ``(tp, pp, dp_shard, dp_replicate) -> peak bytes per device``, or None for a layout it
            cannot simulate; when given, its peak replaces the formula's estimate for the layouts it
            answers (``accelerando.backends.planning.auto.layout_simulator`` builds one that runs a training
            step on fake tensors), and each reason line says which of the two decided.

    Returns:
        The :class:`Layout`, whose ``reason`` lists the facts, the memory terms, the degrees excluded
        and why the chosen one was taken. The product of the degrees is the machine's device count.

    Raises:
        ValueError: no layout fits (the message names the smallest per-device memory needed, the
            layout giving it, the budget and the fixes), or a bad argument.
    """
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r} must be in [0, 1)")
    costs = _costs(
        facts,
        batch_size=batch_size,
        seq_length=seq_length,
        mixed_precision=mixed_precision,
        optimizer=optimizer,
        training=training,
        activation_checkpointing=activation_checkpointing,
    )
    budget = int(machine.memory_per_device * (1 - headroom))
    world = machine.world_size
    reason = [
        facts.describe(),
        f"{machine.describe()}; {_gib(budget)} usable ({headroom:.0%} headroom)",
        f"model state: {costs.state_note} = {_gib(facts.num_parameters * costs.state_bytes_per_param)}",
        costs.activation_note,
    ]
    tps = _tp_choices(facts, machine, reason)
    # Model-parallel pairs, least tp * pp first; for equal products tensor parallelism (inside a node) first.
    pairs = sorted(
        ((tp, pp) for tp in tps for pp in _pp_choices(facts, world // tp)),
        key=lambda pair: (pair[0] * pair[1], pair[1]),
    )
    if facts.num_layers is None:
        reason.append("pp > 1 excluded: the model's layer count is unknown")
    best: tuple[float, tuple[int, int, int]] | None = None
    for tp, pp in pairs:
        data = world // (tp * pp)
        for dp_shard in _divisors(data):
            if tp > 1 and dp_shard == 1 and data > 1:
                continue  # tensor parallelism over pure replication: refused by ParallelismConfig
            need = _estimate(facts, costs, tp, pp, dp_shard)
            simulated = simulator(tp, pp, dp_shard, data // dp_shard) if simulator is not None else None
            if simulated is not None:
                need = float(simulated)
            if best is None or need < best[0]:
                best = (need, (tp, pp, dp_shard))
            if need <= budget:
                how = _source_note(simulator is not None, simulated is not None)
                reason.append(_why(tp, pp, dp_shard, data // dp_shard, need, budget, facts, machine) + how)
                return Layout(tp, pp, dp_shard, data // dp_shard, int(need), budget, reason)
            if simulated is not None:
                reason.append(
                    f"tp={tp} pp={pp} dp_shard={dp_shard}: simulated peak {_gib(need)} per device > {_gib(budget)}"
                )
        smallest = _estimate(facts, costs, tp, pp, data) if data > 1 or tp == pp == 1 else None
        if smallest is not None:
            reason.append(
                f"tp={tp} pp={pp} does not fit: {_gib(smallest)} per device even with dp_shard={data} "
                f"> {_gib(budget)}"
            )
    assert best is not None  # (1, 1, 1) is always a candidate
    need, (tp, pp, dp_shard) = best
    raise ValueError(
        f"no parallel layout fits {facts.describe()} on {machine.num_nodes} node(s) x {machine.devices_per_node} "
        f"device(s) with {_gib(machine.memory_per_device)} each: the smallest estimate is {_gib(need)} per "
        f"device (tp={tp} pp={pp} dp_shard={dp_shard}, micro-batch {batch_size} x {seq_length} tokens, "
        f"{mixed_precision}) but {_gib(budget)} is usable. Fix: more devices or devices "
        "with more memory, CPU offload of the optimizer state "
        "(FSDP/DeepSpeed offload), a smaller micro-batch or sequence, or activation checkpointing"
    )


def _source_note(asked: bool, simulated: bool) -> str:
    """What decided the fit, when a simulator was given: its peak, or the formula (a layout it cannot run)."""
    if not asked:
        return ""
    return " [simulated peak]" if simulated else " [formula estimate: the simulator does not run this layout]"


def _why(
    tp: int,
    pp: int,
    dp_shard: int,
    dp_replicate: int,
    need: float,
    budget: int,
    facts: ModelFacts,
    machine: MachineShape,
) -> str:
    fit = f"{_gib(need)} per device <= {_gib(budget)}"
    if tp == pp == 1 and dp_shard == 1:
        what = "the whole model fits on one device: plain data parallelism, no sharding"
    elif tp == pp == 1:
        what = f"FSDP sharding over {dp_shard} devices is enough, no tensor or pipeline parallelism needed"
    else:
        parts = []
        if tp > 1:
            parts.append(f"tensor parallelism over {tp} devices inside a node")
        if pp > 1:
            span = (
                "across nodes"
                if machine.num_nodes > 1 and tp * pp > machine.devices_per_node
                else "in a node"
            )
            parts.append(f"{pp} pipeline stages {span} ({(facts.num_layers or pp) // pp} layers each)")
        what = "sharding alone does not fit, so " + " and ".join(parts)
        if dp_shard > 1:
            what += f", FSDP over {dp_shard}"
    rest = f"; {dp_replicate} data-parallel replicas use the rest" if dp_replicate > 1 else ""
    return f"chosen tp={tp} pp={pp} dp_shard={dp_shard} dp_replicate={dp_replicate}: {what} ({fit}){rest}"
