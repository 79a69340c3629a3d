"""``accelerando config update``: rewrite an existing config file with current keys, keeping values.

Old spellings (top-level ``dynamo_backend``, ``fsdp_backward_prefetch_policy``, numeric FSDP sharding
strategies, a boolean ``fp16``) become current ones, missing basic keys get their defaults, and the
result is checked with the rules ``accelerando launch`` applies before the file is replaced.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from accelerando.commands.config.config_args import ClusterConfig, default_config_file, load_config_from_file
from accelerando.commands.config.config_utils import SubcommandHelpFormatter
from accelerando.core.settings.configfile import ConfigError, config_to_layer, default_config_path

__all__ = [
    "default_config_file",
    "description",
    "update_command_parser",
    "update_config",
    "update_config_command",
]

description = "Update an existing config file with the latest defaults while keeping its settings."


def update_config(args: argparse.Namespace) -> str:
    """Rewrite the config file named by ``args.config_file`` in the current layout.

    Args:
        args: parsed arguments; ``config_file`` ``None`` means the default config file.

    Returns:
        The path written.

    Raises:
        FileNotFoundError: the file does not exist (the message says how to create one).
        ConfigError: the file holds keys or values that cannot be migrated (named in the message).
    """
    config_file = getattr(args, "config_file", None)
    if config_file is None:
        config_file = str(default_config_path())
        if not Path(config_file).is_file():
            raise FileNotFoundError(
                f"There is no config file at {config_file} to update. Fix: pass --config_file, or create one "
                "with `accelerando config`."
            )
    config = load_config_from_file(config_file)
    if isinstance(config, ClusterConfig):
        config_to_layer(config.to_dict(), str(config_file))  # what we write must load
    if str(config_file).endswith(".json"):
        config.to_json_file(config_file)
    else:
        config.to_yaml_file(config_file)
    return str(config_file)


def update_command_parser(
    parser: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Register ``update`` on the subcommands of ``accelerando config``.

    Args:
        parser: the object returned by ``add_subparsers()`` of the ``config`` parser.
        parents: parsers whose options ``update`` shares (``--config_file``).

    Returns:
        The new subparser (its ``func`` is :func:`update_config_command`).
    """
    sub = parser.add_parser(
        "update",
        parents=list(parents),
        help=description,
        description=description,
        formatter_class=SubcommandHelpFormatter,
    )
    sub.set_defaults(func=update_config_command, config_command="update")
    return sub


def update_config_command(args: argparse.Namespace) -> int:
    """Run ``accelerando config update`` and say where the file went.

    Args:
        args: parsed arguments (``config_file``).

    Returns:
        0 on success, 2 when the file is missing or invalid (the message says why).
    """
    try:
        path = update_config(args)
    except (FileNotFoundError, ConfigError) as err:
        print(f"accelerando config update: {err}", file=sys.stderr)
        return 2
    print(f"Successfully updated the configuration file at {path}.")
    return 0
