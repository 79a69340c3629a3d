"""DeepSpeed config dictionaries: dotted-key access and filling of ``"auto"`` values.

A DeepSpeed config may leave values as ``"auto"``; ``accelerando`` fills them at ``prepare`` from
what the script gave (dataloader batch size, accumulation steps, optimizer hyper-parameters, ...).
Whatever stays ``"auto"`` afterwards is an error naming the key.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "AUTO",
    "auto_keys",
    "fill_auto",
    "get_value",
    "load_config",
    "require_no_auto",
    "set_value",
]

AUTO = "auto"


def load_config(config: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Return a private copy of a DeepSpeed config given as a JSON file path or a mapping.

    Args:
        config: path to a JSON file, or a dict.

    Returns:
        A deep copy the caller may edit.

    Raises:
        ValueError: the file does not exist or is not valid JSON.
        TypeError: ``config`` is neither a path nor a mapping.
    """
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise ValueError(
                f"DeepSpeed config file {path!r} does not exist; pass an existing JSON file or a dict"
            )
        with open(path, encoding="utf-8") as handle:
            try:
                return json.load(handle)
            except json.JSONDecodeError as exc:
                raise ValueError(f"DeepSpeed config file {path!r} is not valid JSON: {exc}") from exc
    raise TypeError(f"a DeepSpeed config must be a JSON file path or a dict, got {type(config).__name__}")


def get_value(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """Read a dotted key (``"zero_optimization.stage"``); ``default`` when any level is missing."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_value(config: dict[str, Any], key: str, value: Any) -> None:
    """Write a dotted key, creating the intermediate sections."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def auto_keys(config: Mapping[str, Any]) -> list[str]:
    """Every dotted key whose value is still ``"auto"``."""
    return [key for key, value in _walk(config, "") if value == AUTO]


def fill_auto(config: dict[str, Any], values: Mapping[str, Any]) -> list[str]:
    """Replace ``"auto"`` at each given dotted key by its value (None values are skipped).

    Concrete values in the config are never overwritten: the user's file wins.

    Returns:
        The keys that were filled.
    """
    filled = []
    for key, value in values.items():
        if value is not None and get_value(config, key) == AUTO:
            set_value(config, key, value)
            filled.append(key)
    return filled


# Where each remaining "auto" key can be given explicitly; used in the error message.
_HINTS = {
    "train_micro_batch_size_per_gpu": "pass a dataloader with a batch_size in the same prepare() call",
    "train_batch_size": "pass a dataloader with a batch_size in the same prepare() call",
    "gradient_accumulation_steps": "pass Accelerator(gradient_accumulation_steps=...)",
    "reduce_bucket_size": "give the model a config.hidden_size or set the value in the config",
    "stage3_prefetch_bucket_size": "give the model a config.hidden_size or set the value in the config",
    "stage3_param_persistence_threshold": "give the model a config.hidden_size or set the value in the config",
    "total_num_steps": "pass DummyScheduler(total_num_steps=...)",
    "warmup_num_steps": "pass DummyScheduler(warmup_num_steps=...)",
}


def require_no_auto(config: Mapping[str, Any]) -> None:
    """Raise when some value is still ``"auto"`` after filling.

    Raises:
        ValueError: naming every unresolved key and how to give it.
    """
    left = auto_keys(config)
    if not left:
        return
    lines = []
    for key in left:
        hint = _HINTS.get(key.rsplit(".", 1)[-1], "set it to a concrete value in the DeepSpeed config")
        lines.append(f"  {key}: {hint}")
    raise ValueError(
        "these DeepSpeed config values are 'auto' but could not be inferred from the objects passed "
        "to prepare():\n" + "\n".join(lines)
    )
