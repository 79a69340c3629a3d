"""FullyShardedDataParallelPlugin: the user-facing configuration of FSDP (versions 1 and 2).

Every field left as None is filled from the resolved settings (launcher flags, config file,
``FSDP_*`` / ``ACCELERANDO_FSDP_*`` environment), then from the defaults below; a value given in
code always wins. Nothing here imports ``torch.distributed.fsdp``: the strategy turns these plain
values into FSDP objects when it wraps a model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from accelerando.core.settings import fill_unset

__all__ = ["SHARDING_STRATEGIES", "STATE_DICT_TYPES", "FullyShardedDataParallelPlugin"]

logger = logging.getLogger(__name__)

SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
    "AUTO",
)
STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "no": None}

# plugin field -> settings field of the "fsdp" group.
_SETTINGS = {
    "fsdp_version": "fsdp_version",
    "sharding_strategy": "fsdp_sharding_strategy",
    "reshard_after_forward": "fsdp_reshard_after_forward",
    "auto_wrap_policy": "fsdp_auto_wrap_policy",
    "transformer_cls_names_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "min_num_params": "fsdp_min_num_params",
    "backward_prefetch": "fsdp_backward_prefetch",
    "forward_prefetch": "fsdp_forward_prefetch",
    "cpu_offload": "fsdp_offload_params",
    "state_dict_type": "fsdp_state_dict_type",
    "cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "sync_module_states": "fsdp_sync_module_states",
    "use_orig_params": "fsdp_use_orig_params",
    "activation_checkpointing": "fsdp_activation_checkpointing",
}
_ATTRIBUTE_OF = {setting: attr for attr, setting in _SETTINGS.items()}

_DEFAULTS: dict[str, object] = {
    "fsdp_version": 2,
    "state_dict_type": "FULL_STATE_DICT",
    "forward_prefetch": False,
    "cpu_offload": False,
    "cpu_ram_efficient_loading": False,
    "sync_module_states": False,
    "use_orig_params": True,
    "activation_checkpointing": False,
    "limit_all_gathers": True,
    "min_num_params": 100_000_000,
}


_NO_ATTRIBUTE = object()


def _name_of(value: object) -> str:
    """Upper-case name of an enum member or string ("ShardingStrategy.FULL_SHARD" -> "FULL_SHARD")."""
    name = getattr(value, "name", None) or str(value)
    return name.rsplit(".", 1)[-1].strip().upper()


def _choice(field_name: str, value: object, choices: tuple[str, ...]) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(choices):
        return choices[value - 1]  # the config wizard's numbered answers (1 = first choice)
    name = _name_of(value)
    if name.isdigit() and 1 <= int(name) <= len(choices):
        return choices[int(name) - 1]
    if name not in choices:
        raise ValueError(
            f"FullyShardedDataParallelPlugin: {field_name}={value!r} is not one of {list(choices)}"
        )
    return name


def _bool(field_name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"FullyShardedDataParallelPlugin: {field_name}={value!r} is not a boolean; pass True or False"
    )


@dataclass
class FullyShardedDataParallelPlugin:
    """Configuration of Fully Sharded Data Parallel training.

    FSDP2 (``torch.distributed.fsdp.fully_shard``) is used unless ``fsdp_version=1``. Fields that take
    an FSDP1 enum also accept its name as a string; unset fields come from the launcher / config
    file / ``FSDP_*`` environment, then from defaults.

    Args:
        fsdp_version: 1 (``FullyShardedDataParallel``) or 2 (``fully_shard``, the default).
        sharding_strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2
            (or a ``ShardingStrategy``), or "AUTO" to pick the least sharding that fits in memory.
        reshard_after_forward: FSDP2: free gathered parameters after forward (True = FULL_SHARD,
            False = SHARD_GRAD_OP). FSDP1: a sharding strategy name. Overrides ``sharding_strategy``.
        backward_prefetch: FSDP1 backward prefetch: BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH.
        mixed_precision_policy: None (the Accelerator's autocast alone, fp32 parameters and
            reductions, numerically identical to DDP), a ``MixedPrecisionPolicy`` (FSDP2), a
            ``MixedPrecision`` (FSDP1), a dict with ``param_dtype`` / ``reduce_dtype`` /
            ``buffer_dtype`` (dtypes or "bf16"/"fp16"/"fp32"), or "bf16"/"fp16".
        auto_wrap_policy: "TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP" or a callable
            ``policy(module, recurse, nonwrapped_numel) -> bool``.
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory.
        ignored_modules: modules (or a regex over module names) FSDP leaves unsharded.
        state_dict_type: FULL_STATE_DICT (one full file written by rank 0) or SHARDED_STATE_DICT
            (``torch.distributed.checkpoint`` shards) for ``save_state``.
        state_dict_config, optim_state_dict_config: FSDP1 state-dict configs (kept for FSDP1).
        limit_all_gathers: FSDP1 rate limiter.
        use_orig_params: FSDP1: expose the original parameters (needed for optimizers built before
            ``prepare`` and for mixed ``requires_grad``).
        param_init_fn: initialises modules on the meta device (FSDP1) or after sharding (FSDP2).
        sync_module_states: broadcast rank 0's weights when wrapping.
        forward_prefetch: prefetch the next all-gather in forward.
        activation_checkpointing: recompute each wrapped layer's activations in backward.
        activation_checkpointing_offload: keep the activations each wrapped layer saves for backward in
            CPU memory (torch's ``offload_wrapper``); with ``activation_checkpointing`` too, only the
            recomputed layers' inputs are saved, on CPU.
        cpu_ram_efficient_loading: only rank 0 materialises weights; implies ``sync_module_states``.
        transformer_cls_names_to_wrap: layer class names wrapped by TRANSFORMER_BASED_WRAP (default:
            the model's ``_no_split_modules``).
        min_num_params: parameters a submodule needs to be wrapped by SIZE_BASED_WRAP.

    Attributes:
        sources: field name -> where its value came from ("code", "env:FSDP_...", "default").

    Raises:
        ValueError: an unknown choice, an unsupported version, or an offload or mixed-precision object
            of the other FSDP version.
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: bool | str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable[..., bool] | str | None = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    sources: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._fill_from_settings()
        self._normalise()
        self._adopt_fsdp1_objects()
        self.validate_cpu_offload()
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()
        self._check_activation_offload()

    def _adopt_fsdp1_objects(self) -> None:
        """Under FSDP2, read FSDP1's ``CPUOffload`` / ``MixedPrecision`` as their plain values.

        Scripts written for FSDP1 (the reference's default) keep working under our FSDP2 default:
        ``CPUOffload(offload_params=x)`` becomes ``x`` and ``MixedPrecision`` its three dtypes.
        """
        if self.fsdp_version != 2:
            return
        if _fsdp_object_kind(self.cpu_offload, fsdp1=("CPUOffload",), fsdp2=()) == 1:
            self.cpu_offload = bool(self.cpu_offload.offload_params)
        policy = self.mixed_precision_policy
        if _fsdp_object_kind(policy, fsdp1=("MixedPrecision",), fsdp2=()) == 1:
            self.mixed_precision_policy = {
                key: getattr(policy, key)
                for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
                if getattr(policy, key, None) is not None
            }

    def _check_activation_offload(self) -> None:
        self.activation_checkpointing_offload = bool(self.activation_checkpointing_offload)

    # ----------------------------------------------------------------- filling
    def _fill_from_settings(self) -> None:
        """Fill unset fields from the process's settings (env / launcher), then from defaults.

        A bad value in the environment is logged and ignored (defaults apply): it must not hide the
        values given in code.
        """
        for attr in _SETTINGS:
            if getattr(self, attr) is not None:
                self.sources[attr] = "code"
        try:
            self.sources.update(fill_unset(self, "fsdp", prefix="fsdp_", rename=_ATTRIBUTE_OF))
        except Exception as err:  # noqa: BLE001 - bad environment values must not hide code values
            logger.warning("FSDP settings could not be read from the environment (%s); using defaults", err)
        for attr, value in _DEFAULTS.items():
            if getattr(self, attr) is None:
                setattr(self, attr, value)
                self.sources.setdefault(attr, "default")

    def _normalise(self) -> None:
        assert self.fsdp_version is not None  # _fill_defaults set every unset field
        self.fsdp_version = int(self.fsdp_version)
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r} is not supported; use 1 or 2")
        if self.sharding_strategy is not None:
            self.sharding_strategy = _choice("sharding_strategy", self.sharding_strategy, SHARDING_STRATEGIES)
        if isinstance(self.reshard_after_forward, str):
            self._normalise_reshard_text(self.reshard_after_forward.strip())
        if self.backward_prefetch is not None:
            self.backward_prefetch = _choice("backward_prefetch", self.backward_prefetch, _PREFETCH)
        if isinstance(self.auto_wrap_policy, str) or self.auto_wrap_policy is None:
            self.auto_wrap_policy = self._default_wrap_policy()
        self.state_dict_type = _choice("state_dict_type", self.state_dict_type, STATE_DICT_TYPES)
        self.transformer_cls_names_to_wrap = _name_list(self.transformer_cls_names_to_wrap)
        for attr in ("forward_prefetch", "sync_module_states", "use_orig_params", "activation_checkpointing"):
            setattr(self, attr, _bool(attr, getattr(self, attr)))
        self.cpu_ram_efficient_loading = _bool("cpu_ram_efficient_loading", self.cpu_ram_efficient_loading)
        if isinstance(self.cpu_offload, (str, int)):
            self.cpu_offload = _bool("cpu_offload", self.cpu_offload)
        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            # Ranks other than 0 hold empty weights; without the broadcast they would train garbage.
            self.sync_module_states = True
        assert self.min_num_params is not None  # _fill_defaults set every unset field
        self.min_num_params = int(self.min_num_params)
        if self.min_num_params < 0:
            raise ValueError(f"min_num_params={self.min_num_params} must be >= 0")

    def _normalise_reshard_text(self, text: str) -> None:
        """``reshard_after_forward`` from text: a boolean, or (as FSDP2 configs write it) a strategy name."""
        if text.lower() in ("true", "false", "1", "0", "yes", "no"):
            self.reshard_after_forward = _bool("reshard_after_forward", text)
        else:
            self.sharding_strategy = _choice("reshard_after_forward", text, SHARDING_STRATEGIES)
            self.reshard_after_forward = None

    def _default_wrap_policy(self) -> str:
        policy = self.auto_wrap_policy
        if policy is None:
            # Naming layer classes (or a size) is asking for that policy.
            if self.transformer_cls_names_to_wrap:
                return "TRANSFORMER_BASED_WRAP"
            if self.sources.get("min_num_params", "default") != "default":
                return "SIZE_BASED_WRAP"
            return "TRANSFORMER_BASED_WRAP"
        return _choice("auto_wrap_policy", policy, _WRAP_POLICIES)

    # ------------------------------------------------------------------ views
    @property
    def is_auto_sharding(self) -> bool:
        """Whether the sharding strategy is chosen from memory when the model is prepared."""
        return self.sharding_strategy == "AUTO"

    def resolved_sharding(self) -> str:
        """The sharding strategy name in effect (FULL_SHARD when nothing says otherwise).

        ``reshard_after_forward`` (a bool) decides between FULL_SHARD and SHARD_GRAD_OP, keeping the
        hybrid variants hybrid.
        """
        strategy = self.sharding_strategy or "FULL_SHARD"
        if isinstance(self.reshard_after_forward, bool):
            hybrid = strategy.startswith("HYBRID")
            if self.reshard_after_forward:
                return "HYBRID_SHARD" if hybrid else "FULL_SHARD"
            return "HYBRID_SHARD_ZERO2" if hybrid else "SHARD_GRAD_OP"
        return strategy

    def set_sharding_strategy(self, strategy: str) -> None:
        """Set the sharding strategy by name (used once "AUTO" has been decided).

        Args:
            strategy: one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2.

        Raises:
            ValueError: an unknown strategy.
        """
        self.sharding_strategy = _choice("sharding_strategy", strategy, SHARDING_STRATEGIES)
        self.reshard_after_forward = None

    def set_state_dict_type(self, state_dict_type: object = None) -> None:
        """Switch between FULL_STATE_DICT and SHARDED_STATE_DICT (None re-reads the settings).

        Args:
            state_dict_type: the new type (a name or an FSDP1 ``StateDictType``).

        Raises:
            ValueError: an unknown type.
        """
        if state_dict_type is None:
            probe = SimpleNamespace(state_dict_type=None)
            fill_unset(probe, "fsdp", prefix="fsdp_")
            state_dict_type = probe.state_dict_type or "FULL_STATE_DICT"
        self.state_dict_type = _choice("state_dict_type", state_dict_type, STATE_DICT_TYPES)

    def set_mixed_precision(
        self, mixed_precision: str | torch.dtype, buffer_autocast: bool = False, override: bool = False
    ) -> None:
        """Set an FSDP mixed-precision policy computing in ``mixed_precision``.

        Parameters are all-gathered and computed in the low dtype; gradients are reduced in fp32
        (bf16 reductions lose too much over many processes). Leaves an existing policy alone
        unless ``override``.

        Args:
            mixed_precision: "bf16", "fp16", "no" or a dtype.
            buffer_autocast: also cast buffers (FSDP1) to the low dtype.
            override: replace a policy already set.

        Raises:
            ValueError: an unknown precision name.
        """
        if self.mixed_precision_policy is not None and not override:
            return
        dtype = (
            mixed_precision if isinstance(mixed_precision, torch.dtype) else _DTYPES.get(str(mixed_precision))
        )
        if dtype is None and str(mixed_precision) not in _DTYPES:
            raise ValueError(f"mixed_precision={mixed_precision!r}; choose 'bf16', 'fp16' or 'no'")
        if dtype is None:
            self.mixed_precision_policy = None
            return
        policy: dict[str, torch.dtype] = {"param_dtype": dtype, "reduce_dtype": torch.float32}
        if buffer_autocast:
            policy["buffer_dtype"] = dtype
        self.mixed_precision_policy = policy

    def mixed_precision_dtypes(self) -> dict[str, torch.dtype] | None:
        """The policy as ``{param_dtype, reduce_dtype, buffer_dtype}`` dtypes, or None without one.

        Raises:
            TypeError: the policy is of an unsupported type.
        """
        policy = self.mixed_precision_policy
        if policy is None:
            return None
        if isinstance(policy, str):
            dtype = _DTYPES.get(policy.lower())
            if dtype is None:
                raise ValueError(f"mixed_precision_policy={policy!r}; use 'bf16', 'fp16' or a dict of dtypes")
            return {"param_dtype": dtype, "reduce_dtype": torch.float32}
        if isinstance(policy, dict):
            items = policy.items()
        elif hasattr(policy, "param_dtype"):
            items = ((k, getattr(policy, k, None)) for k in ("param_dtype", "reduce_dtype", "buffer_dtype"))
        else:
            raise TypeError(
                f"mixed_precision_policy of type {type(policy).__name__} is not supported; pass a "
                "MixedPrecisionPolicy, a MixedPrecision, a dict of dtypes or 'bf16'"
            )
        out: dict[str, torch.dtype] = {}
        for key, value in items:
            if value is None:
                continue
            out[key] = value if isinstance(value, torch.dtype) else _DTYPES[str(value).lower()]
        return out

    def layer_class_names(self, model: torch.nn.Module) -> list[str]:
        """Layer class names TRANSFORMER_BASED_WRAP wraps for ``model``.

        The configured names, else the model's ``_no_split_modules`` (transformers models).
        """
        names = list(self.transformer_cls_names_to_wrap or [])
        if not names:
            names = list(getattr(model, "_no_split_modules", None) or [])
        return names

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> list[type[torch.nn.Module]]:
        """Resolve TRANSFORMER_BASED_WRAP's class names against ``model``'s submodules.

        Args:
            model: the model about to be wrapped.

        Returns:
            The matching module classes (empty for other policies).

        Raises:
            ValueError: a configured class name matches no submodule of ``model``.
        """
        if self.auto_wrap_policy != "TRANSFORMER_BASED_WRAP":
            return []
        names = self.layer_class_names(model)
        by_name: dict[str, type[torch.nn.Module]] = {}
        for module in model.modules():
            by_name.setdefault(type(module).__name__, type(module))
        missing = [n for n in names if n not in by_name]
        if missing and self.transformer_cls_names_to_wrap:
            known = sorted(n for n in by_name if n not in ("ModuleList", "Sequential", "ModuleDict"))
            raise ValueError(
                f"transformer layer class(es) {missing} match no submodule of {type(model).__name__}; "
                f"set fsdp_transformer_layer_cls_to_wrap to some of: {known}"
            )
        return [by_name[n] for n in names if n in by_name]

    # ------------------------------------------------------------ offload / policy checks
    def set_cpu_offload(self) -> None:
        """Turn ``cpu_offload`` into the object this FSDP version takes.

        FSDP2: ``CPUOffloadPolicy`` when offloading, else ``OffloadPolicy``; FSDP1: ``CPUOffload``.
        A value that already is the version's object is kept. The strategy accepts either form.

        Raises:
            ValueError: the value is the other FSDP version's object (see ``validate_cpu_offload``).
        """
        self.validate_cpu_offload()
        offload = _offload_flag(self.cpu_offload)
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

            if not isinstance(self.cpu_offload, OffloadPolicy):
                pin = torch.cuda.is_available()  # pinned host memory needs a CUDA runtime
                self.cpu_offload = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
        else:
            from torch.distributed.fsdp import CPUOffload

            if not isinstance(self.cpu_offload, CPUOffload):
                self.cpu_offload = CPUOffload(offload_params=offload)

    def validate_cpu_offload(self) -> None:
        """Check ``cpu_offload`` fits the FSDP version: a bool, or that version's offload object.

        Raises:
            ValueError: an FSDP1 ``CPUOffload`` with FSDP2, an FSDP2 ``OffloadPolicy`` with FSDP1, or
                any other type.
        """
        value = self.cpu_offload
        if value is None or isinstance(value, bool):
            return
        kind = _fsdp_object_kind(value, fsdp1=("CPUOffload",), fsdp2=("OffloadPolicy", "CPUOffloadPolicy"))
        if kind is None:
            raise ValueError(
                f"cpu_offload={value!r} is not supported; pass True/False, a CPUOffloadPolicy (FSDP2) or a "
                "CPUOffload (FSDP1)"
            )
        if kind != self.fsdp_version:
            wanted = "CPUOffloadPolicy / OffloadPolicy" if self.fsdp_version == 2 else "CPUOffload"
            raise ValueError(
                f"cpu_offload is a {type(value).__name__}, which is for FSDP{kind}, but fsdp_version="
                f"{self.fsdp_version}; pass True/False or a {wanted}"
            )

    def validate_mixed_precision_policy(self) -> None:
        """Check ``mixed_precision_policy`` fits the FSDP version.

        Accepted: None, a dict of dtypes, "bf16"/"fp16"/"fp32", or the version's own class
        (``MixedPrecisionPolicy`` for FSDP2, ``MixedPrecision`` for FSDP1).

        Raises:
            ValueError: the other version's class, or an unknown precision name.
            TypeError: any other type.
        """
        policy = self.mixed_precision_policy
        if policy is None or isinstance(policy, dict):
            return
        if isinstance(policy, str):
            if policy.lower() not in _DTYPES or policy.lower() == "no":
                raise ValueError(
                    f"mixed_precision_policy={policy!r}; use 'bf16', 'fp16', 'fp32' or a dict of dtypes"
                )
            return
        kind = _fsdp_object_kind(policy, fsdp1=("MixedPrecision",), fsdp2=("MixedPrecisionPolicy",))
        if kind is None:
            raise TypeError(
                f"mixed_precision_policy of type {type(policy).__name__} is not supported; pass a "
                "MixedPrecisionPolicy (FSDP2), a MixedPrecision (FSDP1), a dict of dtypes or 'bf16'"
            )
        if kind != self.fsdp_version:
            wanted = "MixedPrecisionPolicy" if self.fsdp_version == 2 else "MixedPrecision"
            raise ValueError(
                f"mixed_precision_policy is a {type(policy).__name__}, which is for FSDP{kind}, but "
                f"fsdp_version={self.fsdp_version}; pass a {wanted} or a dict of dtypes"
            )


def _offload_flag(value: object) -> bool:
    """Whether ``cpu_offload`` (bool or FSDP object) asks for parameters in CPU memory."""
    if value is None or isinstance(value, bool):
        return bool(value)
    offload_params = getattr(value, "offload_params", _NO_ATTRIBUTE)
    if offload_params is not _NO_ATTRIBUTE:  # FSDP1 CPUOffload
        return bool(offload_params)
    return type(value).__name__ == "CPUOffloadPolicy" or any(
        cls.__name__ == "CPUOffloadPolicy" for cls in type(value).__mro__
    )


def _fsdp_object_kind(value: object, fsdp1: tuple[str, ...], fsdp2: tuple[str, ...]) -> int | None:
    """1 or 2 when ``value`` is an instance of the named ``torch.distributed.fsdp`` classes, else None.

    Compares class names along the MRO so that checking needs no import of ``torch.distributed.fsdp``.
    """
    for cls in type(value).__mro__:
        if not cls.__module__.startswith("torch.distributed.fsdp"):
            continue
        if cls.__name__ in fsdp2:
            return 2
        if cls.__name__ in fsdp1:
            return 1
    return None


def _name_list(names: str | Iterable[str] | None) -> list[str] | None:
    """Layer class names from a comma-separated string or any iterable; None stays None."""
    if names is None:
        return None
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return list(names)
