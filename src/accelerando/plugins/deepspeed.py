"""DeepSpeedPlugin: the user's DeepSpeed configuration (a JSON file or dict, or a few fields).

Besides the dataclass, this module holds the plain config-dict helpers the plugin needs when it is
built (dotted-key access, loading, the ``deepspeed.zero.Init`` view of a config) and the lazy import
of ``deepspeed``. They import nothing from ``accelerando.backends.strategies``; the DeepSpeed strategy
(``accelerando.backends.strategies.deepspeed``) builds on them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from accelerando.common import imports
from accelerando.core.devices.deepspeed_accelerator import prefer_deepspeed_cpu_accelerator
from accelerando.core.devices.detect import detect_device_backend
from accelerando.core.safe_files import FileTooLargeError, NotRegularFileError, read_regular
from accelerando.core.settings import environment_setting, fill_unset
from accelerando.plugins.hf_deepspeed_config import HfDeepSpeedConfig

if TYPE_CHECKING:
    from types import ModuleType

    import torch

__all__ = [
    "AUTO",
    "DeepSpeedPlugin",
    "get_value",
    "import_deepspeed",
    "load_config",
    "set_value",
    "zero_init_config",
]

logger = logging.getLogger(__name__)

AUTO = "auto"
_OFFLOAD_DEVICES = ("none", "cpu", "nvme", AUTO)
# plugin field -> dotted key of the DeepSpeed config it controls.
_FIELD_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
# Settings of the "deepspeed" group whose plugin field has another name (the others: same name).
_RENAMED_SETTINGS = {
    "deepspeed_config_file": "hf_ds_config",
    "deepspeed_moe_layer_cls_names": "transformer_moe_cls_names",
}


# --------------------------------------------------------------------------- config dictionaries
# A DeepSpeed config is a few KiB; a file above this is refused before it is read.
MAX_CONFIG_BYTES = 64 * 2**20


def load_config(config: str | os.PathLike[str] | Mapping[str, object]) -> dict[str, Any]:
    """Return a private copy of a DeepSpeed config given as a JSON file path or a mapping.

    Args:
        config: path to a JSON file, or a dict.

    Returns:
        A deep copy the caller may edit.

    Raises:
        ValueError: the file does not exist, is not a regular file (a folder, FIFO, device: the message
            says which), is above ``MAX_CONFIG_BYTES`` or is not valid JSON.
        TypeError: ``config`` is neither a path nor a mapping.
    """
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)

        try:
            raw = read_regular(path, MAX_CONFIG_BYTES)  # a FIFO or /dev/zero would hang a plain read
        except FileNotFoundError:
            raise ValueError(
                f"DeepSpeed config file {path!r} does not exist; pass an existing JSON file or a dict"
            ) from None
        except (NotRegularFileError, FileTooLargeError) as exc:
            raise ValueError(f"DeepSpeed config file: {exc}; pass a JSON file or a dict") from None
        except OSError as exc:
            raise ValueError(
                f"DeepSpeed config file {path!r} cannot be read: {exc.strerror or exc}"
            ) from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"DeepSpeed config file {path!r} is not valid JSON: {exc}") from exc
    raise TypeError(f"a DeepSpeed config must be a JSON file path or a dict, got {type(config).__name__}")


def get_value(config: Mapping[str, object], key: str, default: object = None) -> Any:
    """Read a dotted key (``"zero_optimization.stage"``); ``default`` when any level is missing.

    The result is a JSON value of the config (a number, string, list or section), hence ``Any``.
    """
    node: object = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_value(config: dict[str, Any], key: str, value: object) -> None:
    """Write a dotted key, creating the intermediate sections."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def zero_init_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` that ``deepspeed.zero.Init`` accepts before ``prepare`` resolved it.

    ``zero.Init`` parses the whole config, batch sizes included, but only uses the ZeRO section and
    the dtype; unresolved "auto" values are replaced by neutral ones (batch 1, no 16-bit).
    """
    out = copy.deepcopy(config)

    def strip(node: dict[str, Any]) -> None:
        for key in list(node):
            if isinstance(node[key], dict):
                strip(node[key])
            elif node[key] == AUTO:
                del node[key]

    strip(out)
    for fmt in ("fp16", "bf16"):
        if fmt in out and "enabled" not in out[fmt]:
            out[fmt]["enabled"] = False
    if "train_micro_batch_size_per_gpu" not in out and "train_batch_size" not in out:
        out["train_micro_batch_size_per_gpu"] = 1
    out.setdefault("gradient_accumulation_steps", 1)
    return out


def import_deepspeed(device_type: str | None = None) -> ModuleType:
    """Import and return the ``deepspeed`` module.

    On a CPU run (``device_type`` "cpu", or no accelerator found when it is None) DeepSpeed is
    pointed at its CPU accelerator first (``DS_ACCELERATOR=cpu`` unless set).

    Raises:
        ImportError: DeepSpeed is not installed; the message names the pip extra.
    """
    if not imports.is_deepspeed_available():
        raise ImportError(
            "DeepSpeed is not installed: pip install 'accelerando[deepspeed]' (or pip install deepspeed)"
        )
    if "deepspeed" not in sys.modules:
        if device_type is None:
            device_type = detect_device_backend().name
        prefer_deepspeed_cpu_accelerator(device_type)
    import deepspeed

    return deepspeed


# Settings an accelerando/accelerate config file must leave to a DeepSpeed config file when it names
# one (the reference's list): the launcher lists the ones it took from the file in config_ds_fields.
_LEFT_TO_DEEPSPEED_FILE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
    "mixed_precision",
)


def _refuse_config_file_fields() -> None:
    """Refuse launcher config-file values that a DeepSpeed config file must hold instead.

    Reads the ``config_ds_fields`` setting (``ACCELERATE_CONFIG_DS_FIELDS``, written by the launcher:
    the DeepSpeed keys that came from its config file).

    Raises:
        ValueError: one of those keys is among ``_LEFT_TO_DEEPSPEED_FILE`` (the message names them).
    """
    clashing = [
        name for name in environment_setting("config_ds_fields") or () if name in _LEFT_TO_DEEPSPEED_FILE
    ]
    if clashing:
        raise ValueError(
            f"with a DeepSpeed config file, the launcher's config file must not set {clashing} "
            f"(ACCELERATE_CONFIG_DS_FIELDS): {', '.join(_LEFT_TO_DEEPSPEED_FILE)} are read from the DeepSpeed "
            "config file only; move them there and remove them from the launcher's config file "
            "(`accelerando config` asks only for what is needed when a DeepSpeed config file is used)"
        )


def _as_hf_config(
    config: str | os.PathLike[str] | Mapping[str, object] | HfDeepSpeedConfig,
) -> HfDeepSpeedConfig:
    """Return ``config`` as an :class:`~accelerando.utils.deepspeed.HfDeepSpeedConfig`.

    An ``HfDeepSpeedConfig`` (transformers' ``HfTrainerDeepSpeedConfig`` included) is kept as is, so
    its ``.config`` dict stays shared with its owner; a dict or JSON file path is read into a new one
    (a private copy), a string that is no file is read as base64-encoded JSON (the launcher's form).

    Raises:
        ValueError: a missing or invalid file, or a string that is neither a file nor base64 JSON.
        TypeError: ``config`` is none of these.
    """
    if isinstance(config, HfDeepSpeedConfig):
        return config
    if isinstance(config, str) and not os.path.exists(config):
        try:
            return HfDeepSpeedConfig(config)
        except ValueError:
            pass  # load_config names the missing file
    return HfDeepSpeedConfig(load_config(config))


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed settings: a config file/dict used as is, or a config built from these fields.

    Every field left as None comes from the launcher (``ACCELERANDO_DEEPSPEED_*`` /
    ``ACCELERATE_DEEPSPEED_*`` variables, ``--zero_stage`` ...), else from the default. With a
    config (``hf_ds_config``), a field fills the config's ``"auto"`` at its key; a field that
    contradicts a concrete config value is an error. Values still ``"auto"`` (batch sizes, optimizer
    and scheduler hyper-parameters, precision) are filled at ``prepare`` from the prepared objects.

    Args:
        hf_ds_config: DeepSpeed config as a JSON file path, a dict or an
            :class:`~accelerando.utils.deepspeed.HfDeepSpeedConfig` (transformers'
            ``HfTrainerDeepSpeedConfig`` too). After init it is always an ``HfDeepSpeedConfig`` whose
            ``.config`` is ``deepspeed_config`` (the same dict; an object passed in is kept, not copied).
        gradient_accumulation_steps: micro-batches per step; None/"auto" = the Accelerator's.
        gradient_clipping: max gradient norm applied by the engine; None/"auto" = no clipping.
        zero_stage: 0-3, or "auto" to pick the lowest stage that fits in memory (default 2).
        is_train_batch_min: with several training dataloaders, use the smallest batch size for
            ``train_micro_batch_size_per_gpu`` (False = the largest).
        offload_optimizer_device: "none", "cpu", "nvme" or "auto" (offload only if needed).
        offload_param_device: "none", "cpu", "nvme" or "auto" (ZeRO-3 only).
        offload_optimizer_nvme_path / offload_param_nvme_path: NVMe folders for "nvme" offload.
        zero3_init_flag: build models under ``deepspeed.zero.Init`` (already sharded) with ZeRO-3.
        zero3_save_16bit_model: gather a full 16-bit model on save under ZeRO-3.
        transformer_moe_cls_names: comma-separated mixture-of-experts layer class names.
        enable_msamp: use MS-AMP FP8 optimizer states (needs the ``msamp`` package); default False.
        msamp_opt_level: MS-AMP level, "O1" (default) or "O2".

    Raises:
        ValueError / TypeError: an invalid value or a contradiction with the config, naming the fix.
    """

    hf_ds_config: str | os.PathLike[str] | Mapping[str, object] | HfDeepSpeedConfig | None = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | str | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None
    deepspeed_config: dict[str, Any] = field(init=False, repr=False)
    selected: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        code_given = {name for name in _FIELD_KEYS if getattr(self, name) is not None}
        self._fill_from_settings()
        self.enable_msamp = bool(self.enable_msamp)
        self.msamp_opt_level = self.msamp_opt_level or "O1"
        self._validate_fields()
        if self.hf_ds_config is not None:
            _refuse_config_file_fields()
            hf_config = self.hf_ds_config = _as_hf_config(self.hf_ds_config)
            # The very dict of the config object: transformers fills its "auto" values later.
            self.deepspeed_config = hf_config.config
            self._merge_fields_into_config(code_given)
        else:
            hf_config = self.hf_ds_config = _as_hf_config(self._config_from_fields())
            self.deepspeed_config = hf_config.config
        hf_config.set_stage_and_offload()
        self._sync_fields_from_config()
        self._finish_zero3_flags()
        if self.enable_msamp:
            self._check_msamp()

    # ------------------------------------------------------------------ building
    def _fill_from_settings(self) -> None:
        """Fill unset fields from the launcher's settings (defaults < environment).

        The DeepSpeed settings group fills the fields of the same name (``deepspeed_config_file``
        -> ``hf_ds_config``); the Accelerator-wide ``gradient_accumulation_steps`` fills only when some
        layer set it (its default of 1 must not hide the config's own value).

        Raises:
            ValueError: an invalid value in the environment (naming the variable).
        """
        fill_unset(self, "deepspeed", rename=_RENAMED_SETTINGS)
        if self.gradient_accumulation_steps is None:
            probe = SimpleNamespace(gradient_accumulation_steps=None)
            fill_unset(probe, "core")
            self.gradient_accumulation_steps = probe.gradient_accumulation_steps

    def _validate_fields(self) -> None:
        stage = self.zero_stage
        if stage is not None and stage != AUTO and (isinstance(stage, bool) or stage not in (0, 1, 2, 3)):
            try:
                stage = int(stage)
            except (TypeError, ValueError):
                stage = -1
            if stage not in (0, 1, 2, 3):
                raise ValueError(f"zero_stage must be 0, 1, 2, 3 or 'auto', got {self.zero_stage!r}")
            self.zero_stage = stage
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value is not None and str(value).lower() not in _OFFLOAD_DEVICES:
                raise ValueError(f"{name} must be one of {_OFFLOAD_DEVICES}, got {value!r}")
        if self.msamp_opt_level not in ("O1", "O2"):
            raise ValueError(f"msamp_opt_level must be 'O1' or 'O2', got {self.msamp_opt_level!r}")
        gas = self.gradient_accumulation_steps
        if gas is not None and gas != AUTO and (not isinstance(gas, int) or gas < 1):
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1 or 'auto', got {gas!r}")

    def _config_from_fields(self) -> dict[str, object]:
        """A complete config from the fields; batch sizes and precision stay "auto" until prepare."""
        config: dict[str, object] = {
            "train_batch_size": AUTO,
            "train_micro_batch_size_per_gpu": AUTO,
            "gradient_accumulation_steps": self.gradient_accumulation_steps or AUTO,
            "zero_optimization": {
                "stage": 2 if self.zero_stage is None else self.zero_stage,
                "offload_optimizer": {"device": self.offload_optimizer_device or "none"},
                "offload_param": {"device": self.offload_param_device or "none"},
                "stage3_gather_16bit_weights_on_model_save": bool(self.zero3_save_16bit_model),
            },
            "gradient_clipping": self.gradient_clipping if self.gradient_clipping is not None else AUTO,
            "steps_per_print": 2**31 - 1,
            "fp16": {"enabled": AUTO},
            "bf16": {"enabled": AUTO},
        }
        for name in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if getattr(self, name) is not None:
                set_value(config, _FIELD_KEYS[name], getattr(self, name))
        return config

    def _merge_fields_into_config(self, code_given: set[str]) -> None:
        """Fill the config's "auto" values from fields; refuse code values that contradict it."""
        config = self.deepspeed_config
        for name, key in _FIELD_KEYS.items():
            value = getattr(self, name)
            if value is None:
                continue
            current = get_value(config, key)
            if current == AUTO:
                set_value(config, key, value)
            elif current is not None and current != value:
                if name in code_given:
                    raise ValueError(
                        f"DeepSpeedPlugin({name}={value!r}) contradicts {key}={current!r} in the DeepSpeed "
                        'config; set it in one place only (or write "auto" in the config)'
                    )
                warnings.warn(
                    f"the launcher's {name}={value!r} is ignored: the DeepSpeed config sets {key}={current!r} "
                    '(write "auto" there to take the launcher\'s value)',
                    stacklevel=4,
                )

    def _sync_fields_from_config(self) -> None:
        """Make the fields reflect the config (the config is what the engine will use)."""
        config = self.deepspeed_config
        for name, key in _FIELD_KEYS.items():
            value = get_value(config, key)
            if value is not None:
                setattr(self, name, value)
        if self.zero_stage is None:
            self.zero_stage = 0

    def _finish_zero3_flags(self) -> None:
        if self.zero3_init_flag is None:
            self.zero3_init_flag = False
        if self.zero3_init_flag and self.zero_stage not in (3, AUTO):
            warnings.warn(
                f"zero3_init_flag applies to ZeRO stage 3 only; it is ignored with stage {self.zero_stage}",
                stacklevel=3,
            )
            self.zero3_init_flag = False

    def _check_msamp(self) -> None:

        if not imports.is_package_available("msamp"):
            raise ValueError(
                "enable_msamp=True needs MS-AMP: install the `msamp` package, or set enable_msamp=False"
            )
        self.deepspeed_config.setdefault("msamp", {"enabled": True, "opt_level": self.msamp_opt_level})

    # ------------------------------------------------------------------- queries
    @property
    def config(self) -> dict[str, Any]:
        """Alias of ``deepspeed_config``."""
        return self.deepspeed_config

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the dotted key ``ds_key_long`` of the config is still "auto" (False when absent)."""
        return get_value(self.deepspeed_config, ds_key_long) == AUTO

    def get_value(self, ds_key_long: str, default: object = None) -> Any:
        """Read the dotted key ``ds_key_long`` of the config (``"zero_optimization.stage"``).

        Returns ``default`` when any level of the key is missing.
        """
        return get_value(self.deepspeed_config, ds_key_long, default)

    def fill_match(
        self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: object
    ) -> None:
        """Fill ``ds_key_long`` from ``kwargs[ds_key_long]`` when the config says "auto".

        With ``must_match``, a concrete config value that differs from ``kwargs[ds_key_long]`` is
        appended to ``mismatches`` (a line naming both values). A key the config does not have is
        left alone.

        Args:
            ds_key_long: dotted config key (``"optimizer.params.lr"``).
            mismatches: list collecting mismatch lines (a new one when None).
            must_match: record concrete values that differ from the given one.
            **kwargs: dotted key -> value from the script (``**{"optimizer.params.lr": 1e-3}``).

        Raises:
            ValueError: the config says "auto" for ``ds_key_long`` and ``kwargs`` gives no value.
        """
        mismatches = [] if mismatches is None else mismatches
        *parents, leaf = ds_key_long.split(".")
        node = get_value(self.deepspeed_config, ".".join(parents)) if parents else self.deepspeed_config
        if not isinstance(node, dict) or leaf not in node:
            return
        current = node[leaf]
        if current == AUTO:
            if ds_key_long not in kwargs:
                raise ValueError(
                    f'the DeepSpeed config sets {ds_key_long} to "auto" but nothing gives its value; write a '
                    f"concrete value in the config (or pass {ds_key_long} when filling it)"
                )
            node[leaf] = kwargs[ds_key_long]
            return
        if must_match and ds_key_long in kwargs and current is not None and current != kwargs[ds_key_long]:
            mismatches.append(
                f"- config {ds_key_long}={current!r} vs script {ds_key_long}={kwargs[ds_key_long]!r}"
            )

    def deepspeed_config_process(
        self,
        prefix: str = "",
        mismatches: list[str] | None = None,
        config: dict[str, object] | None = None,
        must_match: bool = True,
        **kwargs: object,
    ) -> None:
        """Fill every "auto" value of the config (or of the sub-``config`` under ``prefix``) from ``kwargs``.

        Walks the config recursively and applies :meth:`fill_match` to each leaf, with dotted keys
        (``kwargs`` keys are dotted too: ``**{"train_micro_batch_size_per_gpu": 8}``).

        Raises:
            ValueError: an "auto" value that ``kwargs`` does not give, or (with ``must_match``) concrete
                config values that contradict ``kwargs``, all listed in one message at the top level.
        """
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(
                    prefix=f"{prefix}{key}.",
                    mismatches=mismatches,
                    config=value,
                    must_match=must_match,
                    **kwargs,
                )
            else:
                self.fill_match(f"{prefix}{key}", mismatches, must_match=must_match, **kwargs)
        if mismatches and prefix == "":
            lines = "\n".join(mismatches)
            raise ValueError(
                f"these DeepSpeed config values contradict the script's:\n{lines}\nmake them equal, or write "
                '"auto" in the config to take the script\'s values'
            )

    def set_moe_leaf_modules(self, model: torch.nn.Module) -> None:
        """Mark the mixture-of-experts layers named in ``transformer_moe_cls_names`` as ZeRO-3 leaves.

        ZeRO-3 then gathers each such layer's parameters as one unit instead of hooking its experts
        one by one (which hangs when ranks route tokens to different experts). A no-op without names.

        Raises:
            ValueError: a class name matches no submodule of ``model`` (the model's classes are listed).
            ImportError: DeepSpeed is not installed.
        """
        if not self.transformer_moe_cls_names:
            return
        names = [n.strip() for n in str(self.transformer_moe_cls_names).split(",") if n.strip()]
        found: dict[str, type] = {}
        for module in model.modules():
            found.setdefault(type(module).__name__, type(module))
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(
                f"transformer_moe_cls_names names {missing}, which match no submodule of {type(model).__name__}; "
                f"use some of: {sorted(found)}"
            )
        import_deepspeed()
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, [found[n] for n in names])

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Fill ``fp16.enabled`` / ``bf16.enabled`` "auto" values from the Accelerator's precision.

        Raises:
            ValueError: the config enables a 16-bit format that contradicts ``mixed_precision``.
        """
        config = self.deepspeed_config
        for fmt in ("fp16", "bf16"):
            wanted = mixed_precision == fmt
            current = get_value(config, f"{fmt}.enabled")
            if current == AUTO:
                set_value(config, f"{fmt}.enabled", wanted)
            elif current is True and not wanted and mixed_precision not in ("no", None):
                raise ValueError(
                    f"the DeepSpeed config enables {fmt} but mixed_precision is {mixed_precision!r}; "
                    f'use mixed_precision={fmt!r} or set {fmt}.enabled to "auto"'
                )

    def is_zero3_init_enabled(self) -> bool:
        """Whether models built now are sharded at construction (ZeRO-3 with ``zero3_init_flag``)."""
        return bool(self.zero3_init_flag) and self.zero_stage == 3

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Context in which models are built directly sharded (``deepspeed.zero.Init``).

        Active when ``enable`` is True or ``zero3_init_flag`` is set, and the stage is 3.

        Raises:
            ImportError: DeepSpeed is not installed (names the pip extra).
        """
        if not ((enable or self.zero3_init_flag) and self.zero_stage == 3):
            yield
            return
        deepspeed = import_deepspeed()
        with deepspeed.zero.Init(config_dict_or_path=zero_init_config(self.deepspeed_config)):
            yield

    def set_deepspeed_weakref(self) -> None:
        """Let ``transformers`` build models under ``deepspeed.zero.Init`` when ZeRO-3 init is on.

        ``transformers`` reads a process-wide weak reference to a ``HfDeepSpeedConfig``; this plugin
        keeps the object alive while it is the active one. A no-op without ``transformers`` or
        without ``zero3_init_flag`` at stage 3; a logged warning when ``transformers`` refuses.
        """
        self._hf_config = None
        if not self.is_zero3_init_enabled() or not imports.is_package_available("transformers"):
            return
        try:
            from transformers.integrations.deepspeed import HfDeepSpeedConfig

            self._hf_config = HfDeepSpeedConfig(zero_init_config(self.deepspeed_config))
        except (ImportError, LookupError) as exc:
            # Some transformers versions refuse HfDeepSpeedConfig unless the `accelerate` package is
            # installed (PackageNotFoundError is a LookupError); building under our context still works.
            logger.warning(
                "transformers will not build models under deepspeed.zero.Init by itself (%s); build them "
                "inside `with deepspeed_plugin.zero3_init_context_manager():`",
                exc,
            )

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Mark this plugin as the active one.

        Raises:
            ValueError: called directly; use ``accelerator.state.select_deepspeed_plugin(name)``
                (or ``accelerando.utils.deepspeed.select_deepspeed_plugin``) so the state knows.
        """
        if not _from_accelerator_state:
            raise ValueError(
                "select a DeepSpeed plugin through the accelerator state: "
                "accelerator.state.select_deepspeed_plugin(name)"
            )
        self.selected = True
        self.set_deepspeed_weakref()
