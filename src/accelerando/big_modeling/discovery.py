"""Find the weight files of a checkpoint given as a file, a shard index or a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from accelerando.core.safe_files import describe_mode, read_regular
from accelerando.core.settings.fields import quote_value

__all__ = ["checkpoint_files"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_DEFAULT_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_DEFAULT_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")
# An index lists one line per tensor: megabytes for the largest models; far bigger is not read.
_MAX_INDEX_BYTES = 256 * 2**20


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """Resolve a checkpoint given as a file, a ``*.index.json`` or a folder to its weight files.

    Args:
        checkpoint: a ``.safetensors``/``.bin`` file, a sharded checkpoint's index, or a folder holding
            either (an index is preferred, then ``model.safetensors``, then a single weights file).

    Returns:
        The weight files to read, in shard order.

    Raises:
        ValueError: if nothing loadable is found (the message lists what the folder holds), or an
            index is unreadable or names a shard outside its own folder (nothing outside is touched).
    """
    path = Path(checkpoint)
    if path.is_file() and path.name.endswith(".json"):
        return _index_shards(path)
    if path.is_file():
        return [str(path)]
    if not path.is_dir():
        try:
            what = f"is {describe_mode(path.stat().st_mode)}, not a regular file or a folder"
        except OSError:
            what = "does not exist"
        raise ValueError(f"Checkpoint {str(checkpoint)!r} {what}; pass a weights file, an index or a folder.")
    for name in (*_DEFAULT_INDEX_NAMES, *_DEFAULT_SINGLE_NAMES):
        if (path / name).is_file():
            return checkpoint_files(path / name)
    indexes = sorted(p for p in path.iterdir() if p.name.endswith(".index.json"))
    if len(indexes) == 1:
        return checkpoint_files(indexes[0])
    weights = sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if len(weights) == 1:
        return [str(weights[0])]
    raise ValueError(
        f"{path} holds no single checkpoint (found {sorted(p.name for p in path.iterdir())}); pass the weights "
        "file or the *.index.json of a sharded checkpoint."
    )


def _index_shards(index: Path) -> list[str]:
    """The shard files an ``*.index.json`` lists, each checked to lie inside the index's folder.

    Every entry is checked by its text before any file is opened: a shard index comes with the
    checkpoint, and an entry such as ``../../x`` or ``/etc/x`` must not make us read elsewhere.
    """
    fix = "Fix: re-save the checkpoint, or pass a sharded checkpoint's *.index.json file."

    try:
        # A regular file only (a FIFO or a device would hang the read), of a bounded size.
        data = json.loads(read_regular(index, _MAX_INDEX_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(
            f"{index} is not a readable checkpoint index ({type(err).__name__}). {fix}"
        ) from None
    # A transformers index holds ``{"metadata": ..., "weight_map": {...}}``; a bare ``{tensor: file}``
    # mapping is accepted too, as the reference does.
    weight_map = data.get("weight_map", data) if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no 'weight_map' mapping. {fix}")
    for key, entry in weight_map.items():
        if not isinstance(entry, str) or not entry or "\x00" in entry:
            raise ValueError(
                f"{index}: weight_map[{quote_value(key, 80)}] = {quote_value(entry)} is not a file name. {fix}"
            )
        if os.path.isabs(entry) or ".." in Path(entry).parts:
            raise ValueError(
                f"{index}: weight_map[{quote_value(key, 80)}] = {quote_value(entry, 120)} points outside the index's "
                f"folder {str(index.parent)!r}; nothing was read from it. Shard files must be names relative to "
                "the index, inside its folder (e.g. 'model-00001-of-00002.safetensors'). Fix: correct the index "
                "or re-save the checkpoint."
            )
    return [str(index.parent / name) for name in dict.fromkeys(weight_map.values())]
