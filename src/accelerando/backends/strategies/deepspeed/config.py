"""DeepSpeed config dictionaries: filling of ``"auto"`` values (and the dotted-key helpers).

A DeepSpeed config may leave values as ``"auto"``; ``accelerando`` fills them at ``prepare`` from
what the script gave (dataloader batch size, accumulation steps, optimizer hyper-parameters, ...).
Whatever stays ``"auto"`` afterwards is an error naming the key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

# The dotted-key helpers are plain dict operations the plugin needs at construction; they live with
# it (plugins import nothing from strategies) and are re-exported here for the config filling.
from accelerando.plugins.deepspeed import AUTO, get_value, load_config, set_value

__all__ = [
    "AUTO",
    "auto_keys",
    "fill_auto",
    "get_value",
    "load_config",
    "require_no_auto",
    "set_value",
]


def _walk(node: object, prefix: str) -> Iterator[tuple[str, object]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def auto_keys(config: Mapping[str, object]) -> list[str]:
    """Every dotted key whose value is still ``"auto"``."""
    return [key for key, value in _walk(config, "") if value == AUTO]


def fill_auto(config: dict[str, object], values: Mapping[str, object]) -> list[str]:
    """Replace ``"auto"`` at each given dotted key by its value (None values are skipped).

    Concrete values in the config are never overwritten: the user's file wins.

    Returns:
        The keys that were filled.
    """
    filled: list[str] = []
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


def require_no_auto(config: Mapping[str, object]) -> None:
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
