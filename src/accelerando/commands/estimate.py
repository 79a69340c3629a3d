"""``accelerando estimate-memory``: how much memory a local model needs, without loading its weights.

Sizes come from the safetensors headers of a model folder (exact, no weights read) or, when the
folder only has a transformers ``config.json``, from the model built on the ``meta`` device.
Nothing is downloaded. This module imports nothing heavy at import time, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

__all__ = ["add_parser", "estimate_sizes", "main", "run"]

DTYPE_BYTES: dict[str, float] = {"float32": 4, "float16": 2, "int8": 1, "int4": 0.5}
# Bytes per element in a safetensors header, to count elements from stored byte ranges.
_STORED_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_LAYER_INDEX = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``estimate-memory`` subcommand.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The subcommand's parser (its default ``func`` is :func:`run`).
    """
    parser = subparsers.add_parser(
        "estimate-memory",
        help="Estimate the memory a local model needs to load and to train, per dtype.",
        description=__doc__.splitlines()[0],
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_name",
        metavar="MODEL_DIR_OR_CONFIG",
        help="A local model folder (safetensors files and/or config.json), a config.json or a .safetensors file.",
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=list(DTYPE_BYTES), choices=list(DTYPE_BYTES), help="dtypes to report."
    )
    parser.add_argument(
        "--library_name",
        choices=["transformers", "timm"],
        default=None,
        help="Library of a config-only folder.",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="Allow custom model code from the folder (config only).",
    )


def _safetensors_files(path: str) -> list[str]:
    if os.path.isfile(path) and path.endswith(".safetensors"):
        return [path]
    if os.path.isdir(path):
        return sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".safetensors"))
    return []


def _layer_of(name: str) -> str:
    match = _LAYER_INDEX.match(name)
    return match.group(1) if match else name.rpartition(".")[0] or name


def _from_headers(files: list[str]) -> tuple[int, int, str]:
    """Count elements from safetensors headers: ``(total elements, largest layer elements, its name)``."""
    total = 0
    layers: dict[str, int] = {}
    from accelerando.big_modeling.offload import read_safetensors_header

    for path in files:
        header, _ = read_safetensors_header(path)  # checked against the file size: crafted files refused
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            count = (end - begin) // _STORED_BYTES.get(entry["dtype"], 1)
            total += count
            layers[_layer_of(name)] = layers.get(_layer_of(name), 0) + count
    name, largest = max(layers.items(), key=lambda item: item[1]) if layers else ("", 0)
    return total, largest, name


def _from_config(path: str, trust_remote_code: bool) -> tuple[int, int, str]:
    """Build the model on ``meta`` from its config and count elements: same result as ``_from_headers``."""
    try:
        import transformers
    except ImportError as error:
        raise ValueError(
            f"{path} has no safetensors files, and reading its config.json needs transformers: pip install transformers."
        ) from error
    from accelerando.big_modeling.empty_init import init_empty_weights
    from accelerando.big_modeling.sizes import calculate_maximum_sizes

    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    total_bytes, (largest_bytes, names) = calculate_maximum_sizes(model)
    # Count elements: the empty model is float32 unless the config says otherwise.
    per_element = next(model.parameters()).element_size()
    return total_bytes // per_element, largest_bytes // per_element, ", ".join(names)


def estimate_sizes(path: str, trust_remote_code: bool = False) -> tuple[int, int, str]:
    """Count the elements of a local model: total, largest layer, and the largest layer's name.

    Args:
        path: a model folder, a ``config.json`` or a ``.safetensors`` file.
        trust_remote_code: allow custom model code (config-only folders).

    Returns:
        ``(total_elements, largest_layer_elements, largest_layer_name)``.

    Raises:
        ValueError: if the path does not exist or holds neither safetensors files nor a config.
    """
    if not os.path.exists(path):
        raise ValueError(f"{path!r} does not exist: pass a local model folder (nothing is downloaded).")
    files = _safetensors_files(path)
    if files:
        return _from_headers(files)
    config_dir = os.path.dirname(path) if path.endswith(".json") else path
    if os.path.isfile(os.path.join(config_dir, "config.json")):
        return _from_config(config_dir, trust_remote_code)
    raise ValueError(f"{path!r} holds neither *.safetensors files nor a config.json; pass a model folder.")


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TB"


def run(args: argparse.Namespace) -> int:
    """Print the memory table for ``args.model_name`` and ``args.dtypes``.

    Args:
        args: parsed arguments (``model_name``, ``dtypes``, ``trust_remote_code``).

    Returns:
        0 on success, 1 when the model can not be read (the reason is printed to stderr).
    """
    try:
        total, largest, name = estimate_sizes(args.model_name, getattr(args, "trust_remote_code", False))
    except ValueError as error:
        print(f"estimate-memory: {error}", file=sys.stderr)
        return 1
    rows = [("dtype", "Largest Layer", "Total Size", "Training using Adam")]
    for dtype in args.dtypes:
        size = DTYPE_BYTES[dtype]
        # Adam training holds weights, gradients and two optimizer moments: about 4x the weights.
        rows.append((dtype, _human(largest * size), _human(total * size), _human(4 * total * size)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    line = "+-" + "-+-".join("-" * width for width in widths) + "-+"
    print(f"Memory needed by {args.model_name} (largest layer: {name})")
    print(line)
    for index, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |")
        if index == 0:
            print(line)
    print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m accelerando.commands.estimate``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    from accelerando.commands.spellings import SpellingParser, add_dash_spellings

    parser = SpellingParser(prog="accelerando estimate-memory", description=__doc__.splitlines()[0])
    _add_arguments(parser)
    return run(add_dash_spellings(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
