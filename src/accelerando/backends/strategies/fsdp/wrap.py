"""Wrapping a model with FSDP2 (``fully_shard``) or FSDP1 (``FullyShardedDataParallel``).

FSDP2 preparation is one visible sequence, each step placed where it must be:
1. choose the wrap units (layer classes or sizes) on the plain model, before anything renames it;
2. RAM-efficient loading: keep rank 0's full weights aside and move every rank to ``meta``, so no
   process but rank 0 ever holds more than its shard;
3. activation checkpointing wraps each unit *before* sharding, so the recomputed forward runs inside
   the unit's all-gather (recomputation then re-gathers just that unit's parameters);
4. ``fully_shard`` each unit, then the root last (the root owns whatever no unit took);
5. materialise and broadcast rank 0's weights (RAM-efficient loading / ``sync_module_states``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from accelerando.backends.strategies.fsdp.state import (
    broadcast_buffers,
    broadcast_full_state_dict,
    broadcast_params,
)
from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

__all__ = [
    "activation_wrapper_fn",
    "apply_activation_checkpointing",
    "fsdp1_wrap",
    "fsdp2_wrap",
    "ignored_modules",
    "make_mesh",
    "reshard_after_forward_for",
    "wrap_units",
]

logger = logging.getLogger(__name__)


def wrap_units(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> list[torch.nn.Module]:
    """Submodules sharded as their own units (the root is not included), in forward order.

    Raises:
        ValueError: a configured layer class name matches nothing.
    """
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return [
            m
            for m in model.modules()
            if m is not model and policy(module=m, recurse=False, nonwrapped_numel=_numel(m))
        ]
    if policy == "TRANSFORMER_BASED_WRAP":
        classes = tuple(plugin.set_auto_wrap_policy(model))
        return [m for m in model.modules() if m is not model and isinstance(m, classes)] if classes else []
    if policy == "SIZE_BASED_WRAP":
        assert plugin.min_num_params is not None, "the plugin's __post_init__ sets it"
        return _size_units(model, plugin.min_num_params)
    return []


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _size_units(model: torch.nn.Module, min_num_params: int) -> list[torch.nn.Module]:
    """Bottom-up: a module becomes a unit once the parameters not yet in a unit reach the threshold."""
    units: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            remaining += visit(child)
        if module is not model and remaining >= max(min_num_params, 1):
            units.append(module)
            return 0
        return remaining

    visit(model)
    return units


def ignored_modules(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP must leave alone: given modules, or those whose name matches a regex."""
    spec = plugin.ignored_modules
    if spec is None:
        return []
    if isinstance(spec, str):
        pattern = re.compile(spec)
        return [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
    return list(spec)


def reshard_after_forward_for(strategy: str) -> bool:
    """FSDP2's ``reshard_after_forward`` for an FSDP1 sharding strategy name."""
    return strategy in ("FULL_SHARD", "HYBRID_SHARD")


def make_mesh(strategy: str, world_size: int, local_world_size: int, device_type: str) -> DeviceMesh:
    """The device mesh FSDP2 shards over for ``strategy``.

    NO_SHARD is a hybrid mesh whose shard axis has size 1 (every process keeps everything and
    gradients are all-reduced, as DDP). HYBRID_* shard within a machine and replicate across them.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if strategy == "NO_SHARD":
        return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("dp_replicate", "dp_shard"))
    if (
        strategy.startswith("HYBRID")
        and 1 < local_world_size < world_size
        and world_size % local_world_size == 0
    ):
        shape = (world_size // local_world_size, local_world_size)
        return init_device_mesh(device_type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp_shard",))


def activation_wrapper_fn(checkpoint: bool, offload: bool) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """The wrapper each unit gets: recompute (``checkpoint``), keep saved activations on CPU
    (``offload``, torch's ``offload_wrapper``: ``save_on_cpu`` around the unit), or both (the
    checkpointed unit's saved inputs go to CPU).
    """
    # torch 2.13: torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:196, :174 (private module;
    # FSDP's activation checkpointing and CPU offload wrappers, as the reference uses them)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
        offload_wrapper,
    )

    def wrap(module: torch.nn.Module) -> torch.nn.Module:
        if checkpoint:
            module = checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return offload_wrapper(module) if offload else module

    return wrap


def _innermost(module: torch.nn.Module) -> torch.nn.Module:
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None)
        if not isinstance(inner, torch.nn.Module):
            return module
        module = inner


def apply_activation_checkpointing(
    model: torch.nn.Module, units: list[torch.nn.Module], checkpoint: bool = True, offload: bool = False
) -> list[torch.nn.Module]:
    """Wrap each unit in an activation wrapper (see :func:`activation_wrapper_fn`); return the wrappers.

    The wrappers' state-dict hooks hide their extra name levels, so checkpoints keep the plain names.
    """
    # torch 2.13: torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:25 (private module)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        ActivationWrapper,
    )

    # torch 2.13: torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:239 (private module)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as apply_ac,
    )

    targets = {id(u) for u in units}
    apply_ac(
        model,
        checkpoint_wrapper_fn=activation_wrapper_fn(checkpoint, offload),
        check_fn=lambda m: id(m) in targets and not isinstance(m, ActivationWrapper),
    )
    outermost: dict[int, torch.nn.Module] = {}
    for m in model.modules():
        if isinstance(m, ActivationWrapper):
            outermost.setdefault(id(_innermost(m)), m)  # modules() visits outer wrappers first
    return [outermost.get(id(u), u) for u in units]


def _mp_policy(plugin: FullyShardedDataParallelPlugin) -> MixedPrecisionPolicy:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtypes = plugin.mixed_precision_dtypes()
    if not dtypes:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(
        param_dtype=dtypes.get("param_dtype"), reduce_dtype=dtypes.get("reduce_dtype")
    )


def _offload_policy(plugin: FullyShardedDataParallelPlugin, device: torch.device) -> OffloadPolicy:
    """The ``offload_policy`` for ``fully_shard``: the plugin's policy object, or one built from its flag."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    offload = plugin.cpu_offload
    if isinstance(offload, OffloadPolicy):
        return offload
    return CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()


def fsdp2_wrap(
    plugin: FullyShardedDataParallelPlugin,
    model: torch.nn.Module,
    strategy: str,
    mesh: DeviceMesh,
    device: torch.device,
    is_main: bool,
) -> torch.nn.Module:
    """Shard ``model`` in place with ``fully_shard`` (steps 1-5 of the module docstring); return it."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

    units = wrap_units(plugin, model)  # 1
    efficient = plugin.cpu_ram_efficient_loading
    full_sd: dict[str, torch.Tensor] = {}
    if efficient:  # 2
        buffers = {name: b.detach().clone() for name, b in model.named_buffers() if not b.is_meta}
        if is_main:
            full_sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        model.to("meta")
    elif plugin.sync_module_states:
        broadcast_params(model)
    if plugin.activation_checkpointing or plugin.activation_checkpointing_offload:  # 3
        units = apply_activation_checkpointing(
            model,
            units,
            checkpoint=bool(plugin.activation_checkpointing),
            offload=bool(plugin.activation_checkpointing_offload),
        )
    ignored = {p for m in ignored_modules(plugin, model) for p in m.parameters()}
    offload_policy = _offload_policy(plugin, device)
    # A bare OffloadPolicy() is truthy yet means "no offload": ask the policy, not the field.
    params_on_cpu = isinstance(offload_policy, CPUOffloadPolicy)
    reshard = reshard_after_forward_for(strategy)
    mp_policy = _mp_policy(plugin)
    ignored_params = ignored or None  # fully_shard's default
    for unit in [*units, model]:  # 4: the units, then the root
        fully_shard(
            unit,
            mesh=mesh,
            reshard_after_forward=reshard,
            mp_policy=mp_policy,
            offload_policy=offload_policy,
            ignored_params=ignored_params,
        )
    if plugin.forward_prefetch:
        for current, upcoming in zip(units, units[1:], strict=False):
            if isinstance(current, FSDPModule) and isinstance(upcoming, FSDPModule):  # every unit now is
                current.set_modules_to_forward_prefetch([upcoming])
    if efficient:  # 5
        model.to_empty(device="cpu" if params_on_cpu else device)
        broadcast_full_state_dict(model, full_sd, cpu_offload=params_on_cpu)
        for name, value in buffers.items():
            _set_buffer(model, name, value.to(device))
        broadcast_buffers(model)
        tie_weights = getattr(model, "tie_weights", None)
        if callable(tie_weights):
            tie_weights()
    return model


def _set_buffer(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    with torch.no_grad():
        getattr(owner, leaf).copy_(value)


def fsdp1_wrap(
    plugin: FullyShardedDataParallelPlugin,
    model: torch.nn.Module,
    strategy: str,
    device: torch.device,
    is_main: bool,
) -> torch.nn.Module:
    """Wrap ``model`` in ``FullyShardedDataParallel`` (FSDP1) as the plugin says; return the wrapper."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = wrap_units(plugin, model)
    unit_ids = {id(u) for u in units}

    def policy(module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else id(module) in unit_ids

    dtypes = plugin.mixed_precision_dtypes()
    offload = plugin.cpu_offload
    param_init_fn = plugin.param_init_fn
    if plugin.cpu_ram_efficient_loading and not is_main and param_init_fn is None:
        # Non-zero ranks hold meta weights: give them storage, sync_module_states fills it from rank 0.
        param_init_fn = functools.partial(_materialise, device=device)
    wrapped = FSDP(
        model,
        sharding_strategy=ShardingStrategy[strategy],
        cpu_offload=offload if isinstance(offload, CPUOffload) else CPUOffload(offload_params=bool(offload)),
        auto_wrap_policy=policy if units else None,
        backward_prefetch=BackwardPrefetch[plugin.backward_prefetch]
        if plugin.backward_prefetch not in (None, "NO_PREFETCH")
        else None,
        mixed_precision=MixedPrecision(
            param_dtype=dtypes.get("param_dtype"),
            reduce_dtype=dtypes.get("reduce_dtype"),
            buffer_dtype=dtypes.get("buffer_dtype"),
        )
        if dtypes
        else None,
        ignored_modules=ignored_modules(plugin, model) or None,
        param_init_fn=param_init_fn,
        device_id=device,
        sync_module_states=bool(plugin.sync_module_states),
        forward_prefetch=bool(plugin.forward_prefetch),
        limit_all_gathers=plugin.limit_all_gathers,
        use_orig_params=bool(plugin.use_orig_params),
    )
    if (plugin.activation_checkpointing or plugin.activation_checkpointing_offload) and units:
        # torch 2.13: torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:239 (private module)
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing as apply_ac,
        )

        unit_types = tuple({type(u) for u in units})
        apply_ac(
            wrapped,
            checkpoint_wrapper_fn=activation_wrapper_fn(
                bool(plugin.activation_checkpointing), bool(plugin.activation_checkpointing_offload)
            ),
            check_fn=lambda m: isinstance(m, unit_types),
        )
    return wrapped


def _materialise(module: torch.nn.Module, device: torch.device) -> None:
    module.to_empty(device=device, recurse=False)
