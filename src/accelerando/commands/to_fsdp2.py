"""``accelerando to-fsdp2``: convert a config file's FSDP1 options to their FSDP2 form.

FSDP2 (``fully_shard``) has fewer knobs than FSDP1: ``fsdp_sharding_strategy`` becomes the boolean
``fsdp_reshard_after_forward``, ``fsdp_backward_prefetch``, ``fsdp_sync_module_states`` and
``fsdp_use_orig_params`` no longer exist, and ``fsdp_forward_prefetch`` has no FSDP2 equivalent yet.
Each dropped option is named in a warning; every other key is kept as is.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from accelerando.commands.utils import CustomArgumentParser
from accelerando.core.settings.configfile import read_config_file, write_config_file

__all__ = [
    "ConversionStatus",
    "convert_config_to_fsdp2",
    "load_config",
    "main",
    "run",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]

logger = logging.getLogger(__name__)

_DESCRIPTION = "Convert the FSDP1 options of an accelerando (or Accelerate) config file to FSDP2."


class ConversionStatus(enum.Enum):
    """Why an FSDP1 option is left out of the FSDP2 config."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# FSDP1 key -> its FSDP2 key (same key when unchanged), or why it has none.
_KEY_MAP: dict[str, str | ConversionStatus] = {
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_backward_prefetch_policy": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}
# Whether each FSDP1 sharding strategy frees the gathered parameters after forward.
_RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "NO_SHARD": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
}
_SHARDING_BY_NUMBER = {str(i + 1): name for i, name in enumerate(_RESHARD_AFTER_FORWARD)}


def _reshard_after_forward(strategy: object) -> bool:
    name = _SHARDING_BY_NUMBER.get(str(strategy), str(strategy).upper())
    if name not in _RESHARD_AFTER_FORWARD:
        raise ValueError(
            f"fsdp_sharding_strategy {strategy!r} is not an FSDP1 sharding strategy. Fix: use one of "
            f"{', '.join(_RESHARD_AFTER_FORWARD)} (or 1-5) before converting."
        )
    return _RESHARD_AFTER_FORWARD[name]


def load_config(config_file: str) -> dict[str, object]:
    """Read a YAML or JSON config file.

    Args:
        config_file: the file.

    Returns:
        Its top-level mapping.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file cannot be parsed (``ConfigError``).
    """
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"Config file `{config_file}` not found. Fix: check the --config_file path.")
    return read_config_file(config_file)


def convert_config_to_fsdp2(config: dict[str, object]) -> dict[str, object]:
    """Return ``config`` with its ``fsdp_config`` section in FSDP2 form (``fsdp_version: 2``).

    A config without an FSDP section, or already at version 2, is returned unchanged (with a log line).
    Dropped options are named in warnings.

    Args:
        config: a config mapping as read from a file (not modified).

    Returns:
        The converted mapping.

    Raises:
        ValueError: ``fsdp_sharding_strategy`` holds an unknown strategy, or ``fsdp_config`` is not a
            mapping.
    """
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("The config has no fsdp_config section; nothing to convert.")
        return config
    if not isinstance(fsdp, Mapping):
        raise ValueError(
            f"fsdp_config must be a mapping of fsdp_* options, got {fsdp!r}. Fix: check the file."
        )
    if str(fsdp.get("fsdp_version", 1)) == "2":
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        return config
    converted: dict[str, object] = {}
    for key, value in fsdp.items():
        target = _KEY_MAP.get(key, key)
        if target is ConversionStatus.REMOVED:
            logger.warning("%s does not exist in FSDP2; it is left out of the converted config.", key)
        elif target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning("%s has no FSDP2 equivalent yet; it is left out of the converted config.", key)
        elif key == "fsdp_sharding_strategy":
            converted[str(target)] = _reshard_after_forward(value)
        elif key != "fsdp_version":
            converted[str(target)] = value
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def to_fsdp2_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``to-fsdp2`` parser (``--config_file``, ``--output_file``, ``--overwrite``).

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`to_fsdp2_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", help=_DESCRIPTION, description=_DESCRIPTION)
    else:
        parser = CustomArgumentParser("accelerando to-fsdp2", description=_DESCRIPTION)
    parser.add_argument("--config_file", required=True, help="The FSDP1 config file to convert.")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Allow replacing an existing file: --output_file, or the input file when --output_file is not given.",
    )
    parser.add_argument(
        "--output_file",
        default=None,
        help="Where to write the converted config (default: over --config_file, which needs --overwrite).",
    )
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> int:
    """Convert ``args.config_file`` and write the result, raising on a missing or protected file.

    Args:
        args: parsed arguments (``config_file``, ``output_file``, ``overwrite``).

    Returns:
        0 once the converted config is written.

    Raises:
        FileNotFoundError: ``config_file`` does not exist.
        ValueError: neither ``output_file`` nor ``overwrite`` is given, or the file cannot be read or
            holds an unknown FSDP1 sharding strategy.
        FileExistsError: ``output_file`` exists and ``overwrite`` is not set.
    """
    if not Path(args.config_file).exists():
        raise FileNotFoundError(
            f"Config file `{args.config_file}` not found. Fix: check the --config_file path."
        )
    if args.output_file is None and not args.overwrite:
        raise ValueError(
            "If --overwrite is not set, --output_file must be provided. Fix: pass --output_file NEW.yaml, or "
            "--overwrite to convert the file in place."
        )
    output = args.output_file or args.config_file
    if args.output_file is not None and Path(output).exists() and not args.overwrite:
        raise FileExistsError(
            f"Output file `{output}` already exists and --overwrite is not set. Fix: pass --overwrite or "
            "another --output_file."
        )
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    write_config_file(converted, output)
    print(f"FSDP2 config written to {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    """``accelerando to-fsdp2``: :func:`to_fsdp2_command`, with a failure printed as one line.

    Args:
        args: parsed arguments of :func:`to_fsdp2_command_parser`.

    Returns:
        0 when written; 2 when a file is missing, would be replaced without ``--overwrite``, or
        cannot be converted (the line says which and the fix).
    """
    try:
        return to_fsdp2_command(args)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"accelerando to-fsdp2: {err}", file=sys.stderr)
        return 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando to-fsdp2`` (see :func:`to_fsdp2_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = to_fsdp2_command_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.to_fsdp2``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return run(to_fsdp2_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
