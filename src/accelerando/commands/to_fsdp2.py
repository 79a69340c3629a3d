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
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ConversionStatus",
    "convert_config_to_fsdp2",
    "load_config",
    "main",
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


def _reshard_after_forward(strategy: Any) -> bool:
    name = _SHARDING_BY_NUMBER.get(str(strategy), str(strategy).upper())
    if name not in _RESHARD_AFTER_FORWARD:
        raise ValueError(
            f"fsdp_sharding_strategy {strategy!r} is not an FSDP1 sharding strategy. Fix: use one of "
            f"{', '.join(_RESHARD_AFTER_FORWARD)} (or 1-5) before converting."
        )
    return _RESHARD_AFTER_FORWARD[name]


def load_config(config_file: str) -> dict[str, Any]:
    """Read a YAML or JSON config file.

    Args:
        config_file: the file.

    Returns:
        Its top-level mapping.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file cannot be parsed (``ConfigError``).
    """
    from accelerando.settings.configfile import read_config_file

    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"Config file {config_file!r} does not exist. Fix: check the --config_file path."
        )
    return read_config_file(config_file)


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """Return ``config`` with its ``fsdp_config`` section in FSDP2 form (``fsdp_version: 2``).

    A config without an FSDP section, or already at version 2, is returned unchanged (with a log line).
    Dropped options are named in warnings.

    Args:
        config: a config mapping as read from a file (not modified).

    Returns:
        The converted mapping.

    Raises:
        ValueError: ``fsdp_sharding_strategy`` holds an unknown strategy.
    """
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("The config has no fsdp_config section; nothing to convert.")
        return config
    if str(fsdp.get("fsdp_version", 1)) == "2":
        logger.warning("The config already uses FSDP2 (fsdp_version: 2); nothing to convert.")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        target = _KEY_MAP.get(key, key)
        if target is ConversionStatus.REMOVED:
            logger.warning("%s does not exist in FSDP2; it is left out of the converted config.", key)
        elif target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning("%s has no FSDP2 equivalent yet; it is left out of the converted config.", key)
        elif key == "fsdp_sharding_strategy":
            converted[target] = _reshard_after_forward(value)
        elif key != "fsdp_version":
            converted[str(target)] = value
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Build the ``to-fsdp2`` parser (``--config_file``, ``--output_file``, ``--overwrite``).

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`to_fsdp2_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", help=_DESCRIPTION, description=_DESCRIPTION)
    else:
        from accelerando.commands.utils import CustomArgumentParser

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
    """Convert ``args.config_file`` and write the result.

    Args:
        args: parsed arguments (``config_file``, ``output_file``, ``overwrite``).

    Returns:
        0 when written, 2 when a file is missing or would be replaced without ``--overwrite``.
    """
    from accelerando.settings.configfile import write_config_file

    output = args.output_file
    if output is None and not args.overwrite:
        print(
            "accelerando to-fsdp2: no --output_file given. Fix: pass --output_file NEW.yaml, or --overwrite "
            "to convert the file in place.",
            file=sys.stderr,
        )
        return 2
    output = output or args.config_file
    if os.path.exists(output) and not args.overwrite:
        print(
            f"accelerando to-fsdp2: {output} already exists. Fix: pass --overwrite or another --output_file.",
            file=sys.stderr,
        )
        return 2
    try:
        converted = convert_config_to_fsdp2(load_config(args.config_file))
    except (FileNotFoundError, ValueError) as err:
        print(f"accelerando to-fsdp2: {err}", file=sys.stderr)
        return 2
    write_config_file(converted, output)
    print(f"FSDP2 config written to {output}")
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``accelerando to-fsdp2`` (see :func:`to_fsdp2_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    return to_fsdp2_command_parser(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.to_fsdp2``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return to_fsdp2_command(to_fsdp2_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
