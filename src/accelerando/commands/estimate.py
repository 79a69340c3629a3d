"""``accelerando estimate-memory``: how much memory a model needs to load and to train, without its weights.

The model is a Hugging Face Hub name (``org/model``) or a local path. For a Hub name only the
config is fetched (through huggingface_hub) and the model is built on the ``meta`` device; with
``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, the config comes from the local Hugging Face
cache. A local folder is read from its safetensors headers (exact, no weights read) or its
``config.json``. This module imports nothing heavy at import time, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from accelerando.big_modeling.empty_init import init_empty_weights
from accelerando.big_modeling.offload import read_safetensors_header
from accelerando.big_modeling.sizes import calculate_maximum_sizes
from accelerando.commands.utils import CustomArgumentParser

if TYPE_CHECKING:
    from huggingface_hub import ModelInfo
    from torch import nn

__all__ = [
    "EstimateError",
    "ModelNotFoundError",
    "add_parser",
    "add_timm_hub_prefix",
    "check_has_model",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_sizes",
    "estimate_training_usage",
    "gather_data",
    "main",
    "run",
    "verify_on_hub",
]

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


_DESCRIPTION = "Estimate the memory a model needs to load (per dtype) and to train with Adam."


def estimate_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``estimate-memory`` parser (model name, ``--library_name``, ``--dtypes``,
    ``--trust_remote_code``).

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`estimate_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", help=_DESCRIPTION, description=_DESCRIPTION)
    else:
        parser = CustomArgumentParser("accelerando estimate-memory", description=_DESCRIPTION)
    parser.add_argument(
        "model_name",
        help="A model on the Hugging Face Hub (org/name), or a local folder, config.json or .safetensors file.",
    )
    parser.add_argument(
        "--library_name",
        choices=["transformers", "timm"],
        default=None,
        help="Library that builds the model, when the Hub does not say (default: the Hub's, else transformers).",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=list(DTYPE_BYTES),
        choices=list(DTYPE_BYTES),
        help="dtypes to report (default: all).",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="Allow the model's own code from the Hub or folder to run. Only for repositories you trust.",
    )
    parser.add_argument(
        "--plan",
        nargs=argparse.REMAINDER,
        default=None,
        metavar="PLAN_ARGS",
        help="Instead of the table, simulate a training step per parallel layout on a cluster, as `accelerando "
        "plan MODEL_NAME PLAN_ARGS` does; the arguments after --plan are its options (e.g. --gpus_per_machine 8 "
        "--device_memory 80GiB; see `accelerando plan --help`). Must come last.",
    )
    parser.set_defaults(func=estimate_command)
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando estimate-memory`` (see :func:`estimate_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = estimate_command_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


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
    return _count_model(create_empty_model(path, "transformers", trust_remote_code=trust_remote_code))


def _count_model(model: nn.Module) -> tuple[int, int, str]:
    """Count the elements of a (meta) model: ``(total, largest layer, largest layer's name)``."""
    total_bytes, (largest_bytes, names) = calculate_maximum_sizes(model)
    # Count elements: the empty model is float32 unless the config says otherwise.
    first = next(iter(model.parameters()), None)
    per_element = first.element_size() if first is not None else 4
    # Sizes are floats when boolean tensors (one bit each) are counted; the element counts are whole.
    return int(total_bytes // per_element), int(largest_bytes // per_element), ", ".join(names)


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


class EstimateError(ValueError):
    """The model cannot be found or built; the message says where it was looked for and the fix."""


class ModelNotFoundError(OSError, EstimateError):
    """The model is not local, not cached, and the Hub does not give it (absent, gated or unreachable).

    An ``OSError``, as the reference raises for a repository it cannot read, and an
    :class:`EstimateError` (``ValueError``) for code written against accelerando's own error.
    """


def add_timm_hub_prefix(model_name: str) -> str:
    """Return the name timm reads ``model_name`` under: a Hub repository id gets ``hf-hub:`` (once).

    ``timm>=1.0.29`` needs the ``hf-hub:`` source prefix for Hub repositories (``org/name``); a bare
    architecture name (``resnet50``, ``resnet50.a1_in1k``) comes from timm's own registry and a name that
    already names its source (``hf-hub:...``, ``local-dir:...``) is kept as is.

    Args:
        model_name: an architecture name, a Hub repository id, or a name with a source prefix.

    Returns:
        ``"hf-hub:" + model_name`` for a repository id, else ``model_name`` unchanged.
    """
    if re.match(r"^[A-Za-z][\w-]*:", model_name) or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def check_has_model(error: BaseException) -> str:
    """Tell which library raised ``error`` because a repository holds no model it can build.

    Args:
        error: the exception raised while building the model.

    Returns:
        ``"timm"`` (timm's "Unknown model" error), ``"transformers"`` (transformers' "does not appear to
        have a file named" error), else ``"unknown"``.
    """
    text = str(error.args[0]) if error.args else ""
    if isinstance(error, RuntimeError) and "Unknown model" in text:
        return "timm"
    if isinstance(error, OSError) and "does not appear to have a file named" in text:
        return "transformers"
    return "unknown"


def _hub_offline() -> bool:
    import huggingface_hub.constants as hub_constants

    return bool(hub_constants.HF_HUB_OFFLINE)


def verify_on_hub(repo: str, token: str | None = None) -> ModelInfo | str:
    """Look ``repo`` up on the Hugging Face Hub.

    Args:
        repo: the repository id (``org/name``).
        token: an access token for private or gated repositories (default: the logged-in one).

    Returns:
        The repository's ``ModelInfo``; ``"gated"`` when it is gated and this token may not read it;
        ``"repo"`` when it does not exist, the name is invalid, or the Hub cannot be reached
        (``HF_HUB_OFFLINE=1``, no network: any error of the HTTP client).

    Raises:
        ImportError: huggingface_hub is not installed (the message gives the install command).
    """
    try:
        from huggingface_hub import model_info
        from huggingface_hub.utils import GatedRepoError
    except ImportError as err:
        raise ImportError(
            "Looking a model up on the Hub needs huggingface_hub: pip install huggingface_hub."
        ) from err
    if _hub_offline():
        return "repo"
    try:
        return model_info(repo, token=token)
    except GatedRepoError:
        return "gated"
    except Exception:  # noqa: BLE001 - not found, bad name, or the HTTP client's own connection errors
        return "repo"


def _cached_folder(repo: str) -> str | None:
    """The local cache folder of ``repo``'s latest snapshot holding a ``config.json``, if any."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError

    try:
        found = try_to_load_from_cache(repo, "config.json")
    except (HFValidationError, ValueError):
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def _library_from_config(folder: str) -> str:
    import json

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    return "timm" if "architecture" in config and "model_type" not in config else "transformers"


def _not_found(model_name: str, reason: str) -> ModelNotFoundError:
    """The one-line error for a Hub name that is neither cached nor given by the Hub."""
    import huggingface_hub.constants as hub_constants

    cache = f"it is not in the local Hugging Face cache ({hub_constants.HF_HUB_CACHE})"
    if reason == "gated":
        why = "is gated on the Hub and this account has no access"
        fix = "log in with `hf auth login` with an account that was granted access, or pass a local model folder"
    elif _hub_offline():
        why = "cannot be looked up: the Hub cannot be reached (HF_HUB_OFFLINE=1)"
        fix = "pass a local model folder or its config.json, or unset HF_HUB_OFFLINE and connect"
    else:
        why = "does not exist on the Hub, or the Hub cannot be reached (no network?)"
        fix = "check the name, or pass a local model folder or its config.json (no network needed)"
    return ModelNotFoundError(
        f"Repo for model `{model_name}` {why}, and {cache}. Fix: {fix}; "
        f"`hf download {model_name} config.json` caches it for offline use."
    )


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> nn.Module:
    """Build ``model_name`` on the ``meta`` device (no weights are downloaded or allocated).

    Args:
        model_name: a Hub repository id or a local model folder.
        library_name: ``"transformers"`` or ``"timm"``; ``None`` = the library the Hub names for the
            model (for a local or cached copy: timm for a timm config, else transformers).
        trust_remote_code: allow the model's own code to run (transformers).
        access_token: token for private or gated repositories.

    Returns:
        The empty model (a ``torch.nn.Module`` whose parameters are on ``meta``).

    Raises:
        ModelNotFoundError: an ``OSError`` (as the reference raises): the model is neither local nor
            cached, and the Hub does not give it (absent, gated, or the Hub cannot be reached).
        EstimateError: the Hub names no library and none was given, or the library is not
            transformers or timm.
        ImportError: the library that builds the model is not installed.
    """
    source = model_name
    if not os.path.exists(model_name):
        info = verify_on_hub(model_name, access_token)
        if isinstance(info, str):
            cached = _cached_folder(model_name)
            if cached is None:
                raise _not_found(model_name, info)
            source = cached
            library_name = library_name or _library_from_config(cached)
        else:
            library_name = library_name or getattr(info, "library_name", None)
            if library_name is None:
                raise EstimateError(
                    f"The Hub does not say which library builds {model_name!r}. Fix: pass --library_name "
                    "transformers or --library_name timm."
                )
    elif library_name is None:
        has_config = os.path.isfile(os.path.join(model_name, "config.json"))
        library_name = _library_from_config(model_name) if has_config else "transformers"

    if library_name == "transformers":
        try:
            import transformers
        except ImportError as err:
            raise ImportError(
                "Building a transformers model needs transformers: pip install transformers."
            ) from err
        config = transformers.AutoConfig.from_pretrained(
            source, trust_remote_code=trust_remote_code, token=access_token
        )
        with init_empty_weights():
            return transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    if library_name == "timm":
        try:
            import timm
        except ImportError as err:
            raise ImportError("Building a timm model needs timm: pip install timm.") from err
        with init_empty_weights():
            # timm reads a Hub (or cached) model by its prefixed name, a local folder with local-dir:.
            name = f"local-dir:{model_name}" if os.path.isdir(model_name) else add_timm_hub_prefix(model_name)
            return timm.create_model(name, pretrained=False)
    raise EstimateError(
        f"Library {library_name!r} of {model_name!r} is not supported. Fix: pass --library_name transformers "
        "or --library_name timm for a model one of them can build."
    )


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """Render ``rows`` under ``headers`` as a box-drawn table with ``title`` above.

    Args:
        headers: the column names.
        rows: lists of cells (converted with ``str``), each as long as ``headers``.
        title: a line centred over the table.

    Returns:
        The table, lines joined with newlines.
    """
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    inner = sum(widths) + 3 * (len(widths) - 1)
    width = max(inner, len(title))
    widths[-1] += width - inner  # a long title widens the last column

    def line(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * (w + 2) for w in widths) + right

    def row_text(row: list[str]) -> str:
        return "│" + "│".join(f" {cell:<{w}} " for cell, w in zip(row, widths, strict=True)) + "│"

    lines = ["┌" + "─" * (width + 2) + "┐", "│ " + title.center(width) + " │", line("├", "┬", "┤")]
    lines.append(row_text([str(h) for h in headers]))
    lines.append(line("├", "┼", "┤"))
    lines += [row_text(row) for row in cells]
    lines.append(line("└", "┴", "┘"))
    return "\n".join(lines)


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: str | None = None) -> dict:
    """Estimate the memory of one Adam training step, by part, for a model of ``bytes`` in float32.

    Args:
        bytes: the model's size with float32 weights.
        mixed_precision: ``"float32"``, or ``"float16"`` / ``"bfloat16"`` / ``"fp8"`` for mixed precision
            (float32 master weights, half-precision compute). Other dtypes (int8, int4) are not
            trained, and every part is ``-1``.
        msamp_config: the MS-AMP optimisation level for fp8; MS-AMP estimates are not available.

    Returns:
        ``{"model", "optimizer", "gradients", "step"}`` -> bytes (``-1`` = not applicable). The peak
        is the largest value.

    Raises:
        ValueError: ``msamp_config`` was given.
    """
    if msamp_config is not None:
        raise ValueError(
            "Memory estimates for MS-AMP fp8 training are not available. Fix: leave msamp_config unset "
            "(fp8 is then estimated like other mixed precision)."
        )
    usage = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    full, half = bytes, bytes // 2
    if mixed_precision == "float32":
        # Weights, gradients, two Adam moments; the update step holds all of them at once.
        usage.update(model=full, gradients=full, optimizer=2 * full, step=4 * full)
    elif mixed_precision in ("float16", "bfloat16", "fp8"):
        # float32 master weights plus half-precision gradients for compute.
        usage.update(model=full, gradients=full + half, optimizer=2 * full, step=2 * full)
    return usage


def _looks_like_path(name: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything else with a separator or a dot prefix is a path."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or os.sep in name.replace("/", "")
    )


def _elements(args: argparse.Namespace) -> tuple[int, int, str]:
    name = args.model_name
    trust = getattr(args, "trust_remote_code", False)
    if os.path.exists(name):
        return estimate_sizes(name, trust)
    if _looks_like_path(name):
        raise EstimateError(
            f"{name!r} does not exist. Fix: pass an existing model folder or file, or a Hub name."
        )
    model = create_empty_model(name, getattr(args, "library_name", None), trust_remote_code=trust)
    return _count_model(model)


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Compute, per requested dtype, the largest layer, the total size and the training estimate.

    Args:
        args: ``model_name``, ``dtypes``, ``library_name``, ``trust_remote_code``.

    Returns:
        One row per dtype: ``[dtype, largest_layer_bytes, total_bytes, training_usage_dict]``.

    Raises:
        EstimateError: the model cannot be found or built (the message says why and the fix).
        ValueError: a local path holds no model.
    """
    try:
        total, largest, _ = _elements(args)
    except (RuntimeError, OSError) as err:
        library = check_has_model(err)
        if library != "unknown":
            raise EstimateError(
                f"{args.model_name!r} was read with {library}, but it holds no model {library} can build. "
                "Fix: pass the other --library_name, or a repository with a model config."
            ) from err
        raise
    rows = []
    for dtype in args.dtypes:
        per_element = DTYPE_BYTES[dtype]
        rows.append(
            [dtype, largest * per_element, total * per_element, estimate_training_usage(total * 4, dtype)]
        )
    return rows


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TB"


def estimate_command(args: argparse.Namespace) -> int:
    """Print the memory table for ``args.model_name`` and ``args.dtypes``.

    Args:
        args: parsed arguments (``model_name``, ``dtypes``, ``library_name``, ``trust_remote_code``).

    Returns:
        0 once the table is printed.

    Raises:
        ModelNotFoundError: (an ``OSError``) the model is not local or cached and the Hub does not
            give it (absent, gated, or unreachable: offline or no network).
        EstimateError: the model cannot be built (no library known, or a path without a model).
        ImportError: transformers or timm is needed and not installed.
    """
    data = gather_data(args)
    rows = []
    for dtype, largest, total, training in data:
        peak = max(training.values())
        rows.append([dtype, _human(largest), _human(total), _human(peak) if peak != -1 else "N/A"])
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam (Peak vRAM)"]
    print(create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`"))
    return 0


def run(args: argparse.Namespace) -> int:
    """``accelerando estimate-memory``: :func:`estimate_command`, a failure printed as one line.

    With ``--plan``, ``accelerando plan MODEL_NAME PLAN_ARGS`` instead (the planner loads only then).

    Returns:
        0 on success, 1 when the model cannot be found or built (the reason and the fix on stderr), or
        with ``--plan`` the plan's code (1 when no layout fits).

    Raises:
        SystemExit: with ``--plan``, a bad plan argument or model (the message names it).
    """
    plan_args = getattr(args, "plan", None)
    if plan_args is not None:
        from accelerando.commands import plan

        return plan.run(plan.plan_command_parser().parse_args([args.model_name, *plan_args]))
    try:
        return estimate_command(args)
    except (ValueError, ImportError, OSError) as error:
        print(f"estimate-memory: {error}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``accelerando-estimate-memory`` and ``python -m accelerando.commands.estimate``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    return run(estimate_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
