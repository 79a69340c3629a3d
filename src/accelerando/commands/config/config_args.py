"""Config files as dataclasses: :class:`ClusterConfig` (this machine) and :class:`SageMakerConfig`.

A config file written by ``accelerando config`` (or by the reference project) loads into one of these
with :func:`load_config_from_file`; ``to_yaml_file`` / ``to_json_file`` write it back. Old key names
are migrated on load (see :meth:`BaseConfig.process_config`); a key neither this project nor the
reference knows is an error naming the key and the fix.

The location constants are computed at import; functions look the location up again on every call,
so ``ACCELERANDO_CONFIG_FILE`` / ``XDG_CACHE_HOME`` changed later are still honoured.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from accelerando.common.constants import (
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
)
from accelerando.core.enums import DistributedType
from accelerando.core.enums_on_demand import ComputeEnvironment, SageMakerDistributedType
from accelerando.core.settings.configfile import (
    CONFIG_KEYS,
    ConfigError,
    config_to_layer,
    default_config_path,
    find_config_file,
    migrate_config,
    read_config_file,
)

__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "cache_dir",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "hf_cache_home",
    "load_config_from_file",
]

#: The Hugging Face cache folder (``$HF_HOME``, else ``<XDG cache>/huggingface``).
hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
)
#: The folder of accelerando's default config file.
cache_dir = str(default_config_path().parent)
#: accelerando's default config file (YAML).
default_yaml_config_file = str(default_config_path())
#: The JSON form of the default config file, beside the YAML one.
default_json_config_file = os.path.join(cache_dir, "default_config.json")
#: The default config file in use: the YAML one unless only the JSON one exists.
default_config_file = (
    default_yaml_config_file
    if os.path.isfile(default_yaml_config_file) or not os.path.isfile(default_json_config_file)
    else default_json_config_file
)

# Top-level keys this project's config files may hold beyond the reference's dataclass fields
# (gradient_accumulation_steps, use_fsdp, hang_timeout, ...): kept in ClusterConfig.extra_settings.
_OWN_TOP_KEYS = frozenset(key for key in CONFIG_KEYS if "." not in key)


def _live_default_file(suffix: str) -> str:
    """The default config file for ``suffix`` (``.yaml`` or ``.json``), looked up now."""
    return str(default_config_path().with_suffix(suffix))


def _plain(value: object) -> object:
    """Enum members become their value, recursively, so YAML and JSON writers see plain data."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


@dataclass
class BaseConfig:
    """Fields every config file has: where it runs, how processes cooperate, precision, CPU, debug.

    Raises:
        ValueError: (at construction) for a ``compute_environment`` or ``distributed_type`` that is
            not one of the allowed values; the message lists them.
    """

    compute_environment: ComputeEnvironment
    distributed_type: DistributedType | SageMakerDistributedType
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        self.compute_environment = _enum(ComputeEnvironment, self.compute_environment, "compute_environment")
        kinds = (
            SageMakerDistributedType
            if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
            else DistributedType
        )
        self.distributed_type = _enum(kinds, self.distributed_type, "distributed_type")
        self.mixed_precision = str(self.mixed_precision).lower()

    def to_dict(self) -> dict[str, object]:
        """Return the config as a plain mapping, as written to a file.

        Enum members become strings; ``None`` values and empty sections are left out.

        Returns:
            Key -> value.
        """
        result: dict[str, object] = {}
        for item in dataclasses.fields(self):
            value = _plain(getattr(self, item.name))
            if value is None or (isinstance(value, dict) and not value):
                continue
            result[item.name] = value
        return result

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the config as JSON (parent folders are created).

        Args:
            json_file: destination path.
        """
        _write(json_file, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the config as YAML (parent folders are created).

        Args:
            yaml_file: destination path.
        """
        import yaml

        _write(yaml_file, yaml.safe_dump(self.to_dict(), sort_keys=True))

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str] | None = None) -> BaseConfig:
        """Load a JSON config file.

        Args:
            json_file: the file; ``None`` = the default JSON config file.

        Returns:
            An instance of this class.

        Raises:
            ConfigError: the file cannot be read or parsed, holds unknown keys, or invalid values.
        """
        path = str(json_file) if json_file is not None else _live_default_file(".json")
        if not path.endswith(".json"):
            raise ConfigError(f"{path!r} is not a .json file. Fix: use from_yaml_file for YAML files.")
        return cls._from_mapping(read_config_file(path), path)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | os.PathLike[str] | None = None) -> BaseConfig:
        """Load a YAML config file.

        Args:
            yaml_file: the file; ``None`` = the default YAML config file.

        Returns:
            An instance of this class.

        Raises:
            ConfigError: the file cannot be read or parsed, holds unknown keys, or invalid values.
        """
        path = str(yaml_file) if yaml_file is not None else _live_default_file(".yaml")
        return cls._from_mapping(read_config_file(path), path)

    @staticmethod
    def process_config(config_dict: Mapping[str, object]) -> dict[str, Any]:
        """Bring a config mapping up to date: current key names and defaults for missing keys.

        Renames old keys (top-level ``dynamo_backend``, ``fsdp_backward_prefetch_policy``, a boolean
        ``fp16``) and fills ``compute_environment``, ``distributed_type``, ``mixed_precision``,
        ``use_cpu``, ``debug`` and ``enable_cpu_affinity`` when absent.

        Args:
            config_dict: a mapping as read from a file (not modified).

        Returns:
            A new, updated mapping.
        """
        data: dict[str, Any] = dict(config_dict)  # the file's values, checked by the dataclass
        if "fp16" in data and "mixed_precision" not in data:
            data["mixed_precision"] = "fp16" if data.pop("fp16") else "no"
        if data.get("dynamo_backend") in ("NO", "no"):
            data.pop("dynamo_backend")  # compilation off: the same as no dynamo section
        data = migrate_config(data)
        data.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE.value)
        data.setdefault("distributed_type", "NO")
        data.setdefault("mixed_precision", "no")
        data.setdefault("use_cpu", False)
        data.setdefault("debug", False)
        data.setdefault("enable_cpu_affinity", False)
        return data

    @classmethod
    def _from_mapping(cls, raw: Mapping[str, object], path: str) -> BaseConfig:
        data = cls.process_config(raw)
        names = {item.name for item in dataclasses.fields(cls)}
        extra = {key: data.pop(key) for key in list(data) if key not in names}
        cls._check_extra(extra, path)
        if extra:
            data["extra_settings"] = extra
        cls._validate(data, path)
        try:
            return cls(**data)
        except (TypeError, ValueError) as err:  # TypeError: a required key is missing
            raise ConfigError(f"Config file {path!r}: {err}") from None

    @classmethod
    def _check_extra(cls, extra: Mapping[str, object], path: str) -> None:
        if extra:
            raise ConfigError(
                f"Config file {path!r} has keys {cls.__name__} does not know: {', '.join(sorted(extra))}. "
                "Fix: remove or rename them (`accelerando config update` migrates old files)."
            )

    @classmethod
    def _validate(cls, data: Mapping[str, object], path: str) -> None:
        """Hook for subclasses: check values beyond the field types."""


EnumT = TypeVar("EnumT", bound=Enum)


def _enum(kind: type[EnumT], value: object, key: str) -> EnumT:
    try:
        return kind(str(value))
    except ValueError:
        allowed = ", ".join(member.value for member in kind)  # type: ignore[attr-defined]
        raise ValueError(f"{key} {value!r} is not one of: {allowed}.") from None


def _write(path: str | os.PathLike[str], text: str) -> None:
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


@dataclass
class ClusterConfig(BaseConfig):
    """A config for this machine or a cluster of machines (``compute_environment: LOCAL_MACHINE``).

    Backend sections (``deepspeed_config``, ``fsdp_config``, ``dynamo_config``, ...) are mappings of
    their options. ``extra_settings`` holds the top-level keys accelerando's files may add beyond the
    reference's fields (``gradient_accumulation_steps``, ``use_fsdp``, ...); :meth:`to_dict` writes
    them back at the top level. Values are checked with the rules ``accelerando launch`` applies.
    """

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict | None = None
    deepspeed_config: dict | None = None
    fsdp_config: dict | None = None
    parallelism_config: dict | None = None
    megatron_lm_config: dict | None = None
    mpirun_config: dict | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict | None = None
    extra_settings: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        for section in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "dynamo_config"):
            if getattr(self, section) is None:
                setattr(self, section, {})

    def to_dict(self) -> dict[str, object]:
        """Return the config as a plain mapping (``extra_settings`` merged in at the top level).

        Returns:
            Key -> value, ``None`` values, empty sections and an unset ``num_processes`` (-1) left out.
        """
        result = super().to_dict()
        extra = _plain(result.pop("extra_settings", {}))
        if isinstance(extra, dict):  # extra_settings is a dict, so its plain form is one too
            result.update(extra)
        if result.get("num_processes") == -1:
            del result["num_processes"]  # -1 means "not set"; a file holds a real count or nothing
        return result

    @classmethod
    def _check_extra(cls, extra: Mapping[str, object], path: str) -> None:
        unknown = {key: value for key, value in extra.items() if key not in _OWN_TOP_KEYS}
        super()._check_extra(unknown, path)

    @classmethod
    def _validate(cls, data: Mapping[str, object], path: str) -> None:
        flat = {key: value for key, value in data.items() if key != "extra_settings"}
        extra = data.get("extra_settings", {})
        if isinstance(extra, Mapping):  # _from_mapping stores a dict there
            flat.update(extra)
        config_to_layer(flat, path)


@dataclass
class SageMakerConfig(BaseConfig):
    """A config for an Amazon SageMaker job (``compute_environment: AMAZON_SAGEMAKER``).

    It loads and saves; ``accelerando launch`` does not start SageMaker jobs and says so.
    """

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> BaseConfig:
    """Load a config file into a :class:`ClusterConfig` or :class:`SageMakerConfig`.

    Args:
        config_file: the file; ``None`` = the default one (accelerando's, else the reference
            project's default config when only that exists).

    Returns:
        :class:`SageMakerConfig` when the file's ``compute_environment`` is ``AMAZON_SAGEMAKER``,
        else :class:`ClusterConfig`.

    Raises:
        FileNotFoundError: ``config_file`` does not exist, or it is ``None`` and no default file exists.
        ConfigError: the file is invalid (the message names the key and the fix).
    """
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The config file {str(config_file)!r} does not exist. Fix: pass an existing file, or create "
            "one with `accelerando config` and leave out --config_file."
        )
    path, _ = find_config_file(config_file)
    if path is None:
        raise FileNotFoundError(
            f"No config file at {default_config_path()}. Fix: create one with `accelerando config` "
            "(or `accelerando config default`), or pass --config_file."
        )
    data = read_config_file(path)
    sagemaker = data.get("compute_environment") == ComputeEnvironment.AMAZON_SAGEMAKER.value
    config_class: type[BaseConfig] = SageMakerConfig if sagemaker else ClusterConfig
    if path.suffix == ".json":
        return config_class.from_json_file(json_file=path)
    return config_class.from_yaml_file(yaml_file=path)
