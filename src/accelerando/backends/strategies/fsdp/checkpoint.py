"""FSDP names at the reference's ``accelerate.utils.fsdp`` path.

The FSDP machinery lives in :mod:`accelerando.backends.strategies.fsdp` and is re-exported here. Defined here:
the two RAM-efficient-loading switches (they write environment variables, the interface
``transformers`` reads, and this module is where the design rules allow that) and the reference's
``fsdp_utils`` helpers over the strategy's state-dict functions (save/load of models and optimizers in
the plugin's ``state_dict_type``, name canonicalisation, optimizer re-pointing, wrap-policy and
activation-checkpointing helpers, tied-weight-preserving init). :mod:`accelerando.utils.fsdp_utils`
re-exports them at the reference's path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, TypeVar

import torch

from accelerando.backends.strategies.fsdp import state as S
from accelerando.backends.strategies.fsdp.auto import (
    ShardingChoice,
    choose_sharding_strategy,
    estimate_sharding_memory,
)
from accelerando.backends.strategies.fsdp.helpers import (
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    load_sharded_checkpoint,
    merge_fsdp_weights,
)
from accelerando.backends.strategies.fsdp.strategy import _clean
from accelerando.backends.strategies.fsdp.wrap import apply_activation_checkpointing, wrap_units
from accelerando.core.safe_files import check_archive
from accelerando.state import PartialState

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin

__all__ = [
    "ShardingChoice",
    "choose_sharding_strategy",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "estimate_sharding_memory",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "load_sharded_checkpoint",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]

_V = TypeVar("_V")


class GradScalerOptions(TypedDict, total=False):
    """The options of ``torch.amp.GradScaler`` that :func:`get_fsdp2_grad_scaler` passes on."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    enabled: bool


# The variables transformers' ``from_pretrained`` reads to decide whether only rank 0 materialises
# weights; both the reference's names and ours are set so either reader sees the switch.
_RAM_EFFICIENT_VARS = ("FSDP_CPU_RAM_EFFICIENT_LOADING", "ACCELERANDO_FSDP_CPU_RAM_EFFICIENT_LOADING")
_USE_FSDP_VARS = ("ACCELERATE_USE_FSDP", "ACCELERANDO_USE_FSDP")


def enable_fsdp_ram_efficient_loading() -> None:
    """Make transformers' ``from_pretrained`` load weights on rank 0 only (others get empty weights).

    Sets the FSDP RAM-efficient-loading environment switch (and the FSDP switch when unset) that
    ``transformers`` reads; the strategy then broadcasts rank 0's weights when it wraps the model.
    Writing the environment is the point of this function: it is the interface transformers reads.
    """
    for name in _USE_FSDP_VARS:
        os.environ.setdefault(name, "true")
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo :func:`enable_fsdp_ram_efficient_loading`: every rank loads full weights again."""
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "false"


# --- the reference's fsdp_utils helpers ------------------------------------------------------------

_MODEL_STEM = "pytorch_model_fsdp"
_OPTIMIZER_STEM = "optimizer"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _require_dcp(use_dcp: bool, what: str) -> None:
    if not use_dcp:
        raise ValueError(
            f"{what} with SHARDED_STATE_DICT is written with torch.distributed.checkpoint; use_dcp=False has "
            "no other sharded format here. Pass use_dcp=True, or set state_dict_type to FULL_STATE_DICT."
        )


def _inner_module(model: torch.nn.Module) -> torch.nn.Module:
    # FSDP1 wraps the module (``.module``); FSDP2 shards it in place.
    return getattr(model, "module", model) if type(model).__name__ == "FullyShardedDataParallel" else model


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(_inner_module(model), "peft_config")


def _adapter_state(model: torch.nn.Module, state_dict: dict[str, _V]) -> dict[str, _V]:
    """Keep only the active PEFT adapter's entries of a state dict, under the model's own names.

    PEFT stores each adapter's weights in containers keyed by the adapter's name
    (``...q_proj.lora_A.default.weight``), so an entry belongs to the adapter when one of its name's
    segments is that name. Keeping the model's names lets the same loader read the file back. A model
    without adapters keeps its whole state dict (transformers passes ``adapter_only=True`` always).
    """
    if not _is_peft(model):
        return state_dict
    adapter = getattr(_inner_module(model), "active_adapter", "default")
    if not isinstance(adapter, str):  # several active adapters: keep them all
        names = set(adapter)
    else:
        names = {adapter}
    return {key: value for key, value in state_dict.items() if names & set(key.split("."))}


def _local_state_dict(model: torch.nn.Module) -> contextlib.AbstractContextManager[object]:
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    if not isinstance(model, FullyShardedDataParallel):
        raise ValueError(
            "LOCAL_STATE_DICT needs an FSDP1 model (fsdp_version=1); for FSDP2 use SHARDED_STATE_DICT."
        )
    return FullyShardedDataParallel.state_dict_type(model, StateDictType.LOCAL_STATE_DICT)


def _weights_file(directory: str, stem: str, index: int, suffix: str = "") -> str:
    name = stem if index == 0 else f"{stem}_{index}"
    return os.path.join(directory, f"{name}{suffix}.bin")


def _sharded_location(input_dir: str, stem: str, index: int) -> tuple[str, int]:
    """(parent, index) of a sharded folder given either the checkpoint folder or the shard folder."""
    import re

    match = re.fullmatch(rf"{stem}_(\d+)", os.path.basename(os.path.normpath(input_dir)))
    if match:
        return os.path.dirname(os.path.normpath(input_dir)), int(match.group(1))
    return input_dir, index


def _plain_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    # AcceleratedOptimizer keeps the torch optimizer in ``.optimizer``.
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _read_weights(job: _Job, kind: str, suffix: str) -> dict[str, torch.Tensor]:
    path = _weights_file(job.folder, _MODEL_STEM, job.index, suffix)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No FSDP {kind} weights at {path}; check input_dir and model_index.")
    check_archive(path)  # before torch.load inflates anything: a zip bomb is refused
    return torch.load(path, map_location="cpu", weights_only=True)


@dataclass(frozen=True)
class _Job:
    """One call of the four public functions, as its handler sees it."""

    model: torch.nn.Module
    folder: str  # output_dir or input_dir
    index: int  # model_index or optimizer_index
    use_dcp: bool
    adapter_only: bool = False
    optimizer: torch.optim.Optimizer | None = None  # the plain torch optimizer, for the optimizer handlers

    def plain_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of an optimizer handler's job.

        Raises:
            ValueError: the job was made without one (a model handler's job).
        """
        if self.optimizer is None:
            raise ValueError("an FSDP optimizer handler needs the optimizer")
        return self.optimizer


# --- one handler per (state_dict_type, operation); every process calls it -------------------------


def _save_full_model(job: _Job) -> str:
    state = S.full_model_state_dict(job.model)  # a collective: every rank gathers
    path = _weights_file(job.folder, _MODEL_STEM, job.index)
    if _rank() == 0:
        torch.save(_adapter_state(job.model, state) if job.adapter_only else state, path)
    return path


def _save_local_model(job: _Job) -> str:
    with _local_state_dict(job.model):
        state = job.model.state_dict()
    path = _weights_file(job.folder, _MODEL_STEM, job.index, f"_rank{_rank()}")
    torch.save(_adapter_state(job.model, state) if job.adapter_only else state, path)
    return path


def _save_sharded_model(job: _Job) -> str:
    _require_dcp(job.use_dcp, "save_fsdp_model")
    if not (job.adapter_only and _is_peft(job.model)):
        return S.save_sharded_model(job.model, job.folder, job.index)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    folder = os.path.join(job.folder, f"{_MODEL_STEM}_{job.index}")
    save({"model": _adapter_state(job.model, get_model_state_dict(job.model))}, checkpoint_id=folder)
    return folder


def _load_full_model(job: _Job) -> object:
    state = _read_weights(job, "FULL_STATE_DICT", "")
    strict = not (job.adapter_only and _is_peft(job.model))
    return S.load_full_model_state_dict(job.model, state, strict=strict)


def _load_local_model(job: _Job) -> object:
    state = _read_weights(job, "LOCAL_STATE_DICT", f"_rank{_rank()}")
    strict = not (job.adapter_only and _is_peft(job.model))
    with _local_state_dict(job.model):
        return job.model.load_state_dict(state, strict=strict)


def _load_sharded_model(job: _Job) -> None:
    _require_dcp(job.use_dcp, "load_fsdp_model")
    parent, index = _sharded_location(job.folder, _MODEL_STEM, job.index)
    if not S.load_sharded_model(job.model, parent, index):
        raise FileNotFoundError(
            f"No sharded FSDP weights folder {os.path.join(parent, f'{_MODEL_STEM}_{index}')}; check input_dir."
        )


def _save_full_optimizer(job: _Job) -> str:
    state = S.full_optimizer_state_dict(job.model, job.plain_optimizer())  # a collective
    path = _weights_file(job.folder, _OPTIMIZER_STEM, job.index)
    if _rank() == 0:
        torch.save(state, path)
    return path


def _save_sharded_optimizer(job: _Job) -> str:
    _require_dcp(job.use_dcp, "save_fsdp_optimizer")
    return S.save_sharded_optimizer(job.model, job.plain_optimizer(), job.folder, job.index)


def _load_full_optimizer(job: _Job) -> None:
    path = _weights_file(job.folder, _OPTIMIZER_STEM, job.index)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No FSDP optimizer state at {path}; check input_dir and optimizer_index.")
    check_archive(path)  # before torch.load inflates anything: a zip bomb is refused
    state = torch.load(path, map_location="cpu", weights_only=True)
    S.load_full_optimizer_state_dict(job.model, job.plain_optimizer(), state)


def _load_sharded_optimizer(job: _Job) -> None:
    _require_dcp(job.use_dcp, "load_fsdp_optimizer")
    parent, index = _sharded_location(job.folder, _OPTIMIZER_STEM, job.index)
    if not S.load_sharded_optimizer(job.model, job.plain_optimizer(), parent, index):
        raise FileNotFoundError(
            f"No sharded optimizer folder {os.path.join(parent, f'{_OPTIMIZER_STEM}_{index}')}; check input_dir."
        )


@dataclass(frozen=True)
class _Handlers:
    save_model: Callable[[_Job], str]
    load_model: Callable[[_Job], object]
    save_optimizer: Callable[[_Job], str]
    load_optimizer: Callable[[_Job], None]


# state_dict_type -> what each of the four public functions does with it. An FSDP1 LOCAL_STATE_DICT
# has no optimizer form of its own: its optimizer state is written sharded.
_HANDLERS: dict[str, _Handlers] = {
    "FULL_STATE_DICT": _Handlers(
        _save_full_model, _load_full_model, _save_full_optimizer, _load_full_optimizer
    ),
    "SHARDED_STATE_DICT": _Handlers(
        _save_sharded_model, _load_sharded_model, _save_sharded_optimizer, _load_sharded_optimizer
    ),
    "LOCAL_STATE_DICT": _Handlers(
        _save_local_model, _load_local_model, _save_sharded_optimizer, _load_sharded_optimizer
    ),
}


def _handlers(fsdp_plugin: object) -> _Handlers:
    """The handlers for the plugin's state_dict_type (plugins may hold a string or torch's enum)."""
    value = getattr(fsdp_plugin, "state_dict_type", None) or "FULL_STATE_DICT"
    name = (getattr(value, "name", None) or str(value)).rpartition(".")[2].upper()
    if name not in _HANDLERS:
        raise ValueError(f"Unknown FSDP state_dict_type {value!r}; use one of {', '.join(_HANDLERS)}.")
    return _HANDLERS[name]


def save_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: object,
    model: torch.nn.Module,
    output_dir: str,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> str:
    """Save an FSDP model's weights in the plugin's ``state_dict_type``; every process must call it.

    - ``FULL_STATE_DICT``: the whole state dict is gathered on the main process, which writes
      ``pytorch_model_fsdp.bin`` (``pytorch_model_fsdp_<i>.bin`` for ``model_index`` i > 0).
    - ``SHARDED_STATE_DICT``: each process writes its shards into the folder
      ``pytorch_model_fsdp_<i>`` with ``torch.distributed.checkpoint``.
    - ``LOCAL_STATE_DICT`` (FSDP1 only): each process writes its flat shard to
      ``pytorch_model_fsdp[_<i>]_rank<r>.bin``.

    Args:
        fsdp_plugin: the FSDP plugin (its ``state_dict_type`` decides the format).
        accelerator: the Accelerator (unused beyond the process group; kept for the reference's call form).
        model: the FSDP-wrapped (FSDP1) or sharded (FSDP2) model.
        output_dir: the folder to write into (created).
        model_index: which of the prepared models this is.
        adapter_only: save only the PEFT adapter weights; a model without adapters is saved whole.
        use_dcp: sharded checkpoints go through ``torch.distributed.checkpoint`` (the only sharded format).

    Returns:
        The file or folder written (the same name on every process).

    Raises:
        ValueError: unknown ``state_dict_type``, ``use_dcp=False`` with sharded checkpoints, or
            LOCAL_STATE_DICT with an FSDP2 model.
    """
    del accelerator
    save = _handlers(fsdp_plugin).save_model
    os.makedirs(output_dir, exist_ok=True)
    return save(_Job(model, output_dir, model_index, use_dcp, adapter_only))


def load_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: object,
    model: torch.nn.Module,
    input_dir: str,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> object:
    """Load weights written by :func:`save_fsdp_model` into the FSDP model; every process must call it.

    Full checkpoints are read by every process (weights only, no code runs) and each keeps its shard;
    sharded ones may be given as the checkpoint folder or the ``pytorch_model_fsdp_<i>`` folder itself.

    Args:
        fsdp_plugin: the FSDP plugin (its ``state_dict_type`` says which format to read).
        accelerator: the Accelerator (kept for the reference's call form).
        model: the FSDP-wrapped or sharded model.
        input_dir: the folder holding the checkpoint.
        model_index: which of the prepared models this is.
        adapter_only: the checkpoint holds only PEFT adapter weights (other weights stay as they are);
            ignored for a model without adapters (its whole state is loaded, strictly).
        use_dcp: sharded checkpoints are read with ``torch.distributed.checkpoint``.

    Returns:
        The result of loading (missing and unexpected keys) for full and local checkpoints, None for
        sharded ones.

    Raises:
        FileNotFoundError: the checkpoint file or folder is not there.
        ValueError: as for :func:`save_fsdp_model`.
    """
    del accelerator
    return _handlers(fsdp_plugin).load_model(_Job(model, input_dir, model_index, use_dcp, adapter_only))


def save_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: object,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> str:
    """Save the optimizer state of an FSDP model; every process must call it.

    ``FULL_STATE_DICT``: the main process writes the whole state to ``optimizer.bin``
    (``optimizer_<i>.bin`` for index i > 0). Otherwise each process writes its shards into the folder
    ``optimizer_<i>`` with ``torch.distributed.checkpoint``.

    Args:
        fsdp_plugin: the FSDP plugin.
        accelerator: the Accelerator (kept for the reference's call form).
        optimizer: the (prepared) optimizer.
        model: the FSDP model it optimises.
        output_dir: the folder to write into (created).
        optimizer_index: which of the prepared optimizers this is.
        use_dcp: sharded states go through ``torch.distributed.checkpoint``.

    Returns:
        The file or folder written.

    Raises:
        ValueError: unknown ``state_dict_type`` or ``use_dcp=False`` with a sharded state.
    """
    del accelerator
    save = _handlers(fsdp_plugin).save_optimizer
    os.makedirs(output_dir, exist_ok=True)
    return save(_Job(model, output_dir, optimizer_index, use_dcp, optimizer=_plain_optimizer(optimizer)))


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: object,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load an optimizer state written by :func:`save_fsdp_optimizer`; every process must call it.

    Args:
        fsdp_plugin: the FSDP plugin.
        accelerator: the Accelerator (kept for the reference's call form).
        optimizer: the (prepared) optimizer.
        model: the FSDP model it optimises.
        input_dir: the checkpoint folder (or, for sharded states, the ``optimizer_<i>`` folder itself).
        optimizer_index: which of the prepared optimizers this is.
        adapter_only: accepted for the reference's call form; the state holds whatever was saved.
        use_dcp: sharded states are read with ``torch.distributed.checkpoint``.

    Raises:
        FileNotFoundError: the state file or folder is not there.
        ValueError: unknown ``state_dict_type`` or ``use_dcp=False`` with a sharded state.
    """
    del accelerator, adapter_only
    load = _handlers(fsdp_plugin).load_optimizer
    load(_Job(model, input_dir, optimizer_index, use_dcp, optimizer=_plain_optimizer(optimizer)))


def fsdp2_canonicalize_names(named_params: dict[str, _V]) -> dict[str, _V]:
    """Drop the wrapper levels (activation checkpointing, ``torch.compile``, FSDP1) from parameter names.

    ``"layers.0._checkpoint_wrapped_module.weight"`` becomes ``"layers.0.weight"``, so names before and
    after wrapping match.

    Args:
        named_params: name -> parameter (or anything).

    Returns:
        A new dict with cleaned names, same values and order.
    """
    return {_clean(name): value for name, value in named_params.items()}


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point an optimizer's parameter groups at new parameter objects (after sharding replaced them).

    Args:
        optimizer: the optimizer built on the unsharded parameters.
        mapping: old parameter's ``data_ptr()`` -> new (sharded) parameter.

    Raises:
        KeyError: a parameter of the optimizer has no entry in ``mapping`` (training would silently
            update a stale tensor otherwise).
    """
    for group in optimizer.param_groups:
        switched = []
        for param in group["params"]:
            key = param.data_ptr()
            if key not in mapping:
                raise KeyError(
                    f"An optimizer parameter of shape {tuple(param.shape)} has no sharded counterpart in the "
                    "mapping; build the mapping from every parameter the optimizer holds (data_ptr -> new one)."
                )
            switched.append(mapping[key])
        group["params"] = switched


def get_fsdp2_grad_scaler(**kwargs: Unpack[GradScalerOptions]) -> torch.amp.GradScaler:
    """A gradient scaler for fp16 training of an FSDP2 model on the current device.

    FSDP2's gradients are DTensors, which ``torch.amp.GradScaler`` handles directly.

    Args:
        **kwargs: ``GradScaler`` options (``init_scale``, ``growth_factor``, ...).

    Returns:
        The scaler.
    """
    # The reference's public helper takes no Accelerator: it reads the process state, not a strategy's.
    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module
) -> Callable[[torch.nn.Module], bool] | None:
    """The plugin's auto-wrap policy as a predicate ``fn(module) -> bool`` (True: shard it on its own).

    Args:
        fsdp2_plugin: the FSDP plugin (``auto_wrap_policy``, layer classes, ``min_num_params``).
        model: the model to wrap.

    Returns:
        The predicate, or None when nothing but the root is wrapped (``NO_WRAP`` or no policy).

    Raises:
        ValueError: a configured layer class name matches nothing in the model.
    """
    if fsdp2_plugin.auto_wrap_policy in (None, "NO_WRAP"):
        return None
    units = {id(unit) for unit in wrap_units(fsdp2_plugin, model)}

    def policy(module: torch.nn.Module) -> bool:
        return id(module) in units

    return policy


def fsdp2_apply_ac(accelerator: object, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap the model's auto-wrap units in activation checkpointing, as ``prepare`` does for FSDP2.

    The plugin's ``activation_checkpointing_offload`` also keeps the units' saved activations on CPU
    (with ``activation_checkpointing`` off, that offload is then the only wrapper, as in ``prepare``).

    Args:
        accelerator: an Accelerator with an FSDP plugin (its wrap policy chooses the units).
        model: the (not yet sharded) model.

    Returns:
        The same model, its units now checkpoint-wrapped (state-dict names unchanged).

    Raises:
        ValueError: the accelerator has no FSDP plugin.
    """
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if plugin is None:
        raise ValueError("fsdp2_apply_ac needs an Accelerator configured with an FSDP plugin.")
    offload = bool(getattr(plugin, "activation_checkpointing_offload", False))
    # Checkpointing is what this function is for; only a plugin asking for offload alone skips it.
    checkpoint = bool(plugin.activation_checkpointing) or not offload
    apply_activation_checkpointing(model, wrap_units(plugin, model), checkpoint=checkpoint, offload=offload)
    return model


def get_parameters_from_modules(
    modules: str | Iterable[torch.nn.Module] | None, model: torch.nn.Module, device: torch.device | str | None
) -> set[torch.nn.Parameter]:
    """The parameters of some modules, given as modules or as a regex over module names.

    The modules are moved to ``device`` first (FSDP leaves ignored modules unsharded, so they must
    already sit on the training device).

    Args:
        modules: an iterable of modules, a regex that module names must match in full, or None.
        model: the model the names refer to.
        device: where to move the modules (None: leave them).

    Returns:
        The set of their parameters (empty for None).
    """
    import re

    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        modules = [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
    params: set[torch.nn.Parameter] = set()
    for module in modules:
        if device is not None:
            module.to(device)
        params.update(module.parameters())
    return params


def ensure_weights_retied(
    param_init_fn: Callable[[torch.nn.Module], torch.nn.Module], model: torch.nn.Module, device: torch.device
) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """Wrap an FSDP ``param_init_fn`` so that tied weights stay tied when modules are materialised.

    Materialising modules one by one (from ``meta``) gives each name of a tied weight its own new
    tensor; the wrapper makes later names reuse the tensor created for the first one.

    Args:
        param_init_fn: ``fn(module) -> module`` that materialises a module's parameters.
        model: the model whose tied weights to keep tied.
        device: the device the parameters are materialised on (kept for the reference's call form).

    Returns:
        ``param_init_fn`` itself when the model has no tied weights, else the wrapper.
    """
    del device
    names_of: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    tied = [key for key, names in names_of.items() if len(names) > 1]
    if not tied:
        return param_init_fn
    group_of = {key: index for index, key in enumerate(tied)}
    first: dict[int, torch.nn.Parameter] = {}

    def init_keeping_ties(module: torch.nn.Module) -> torch.nn.Module:
        tied_here = {
            name: group_of[id(param)]
            for name, param in module.named_parameters(recurse=False)
            if id(param) in group_of
        }
        module = param_init_fn(module)
        for name, group in tied_here.items():
            if group in first:
                setattr(module, name, first[group])
            else:
                first[group] = getattr(module, name)
        return module

    return init_keeping_ties
