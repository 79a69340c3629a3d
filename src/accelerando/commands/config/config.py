"""``accelerando config`` without a subcommand: ask questions in the terminal and write the answers.

The file written is checked with the rules ``accelerando launch`` applies when reading it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from accelerando.commands.config.cluster import get_cluster_input
from accelerando.commands.config.config_args import (
    BaseConfig,
    ClusterConfig,
    cache_dir,
    default_config_file,
    default_yaml_config_file,
)
from accelerando.commands.config.config_utils import SubcommandHelpFormatter
from accelerando.commands.utils import CustomArgumentParser
from accelerando.core.settings.configfile import ConfigError, config_to_layer, default_config_path

__all__ = [
    "cache_dir",
    "config_command",
    "config_command_parser",
    "default_config_file",
    "default_yaml_config_file",
    "description",
    "get_user_input",
    "main",
]

description = (
    "Ask a few questions in the terminal and save the answers as the config file `accelerando launch` "
    "reads. Run it once on every machine you train on."
)


def get_user_input() -> BaseConfig | None:
    """Ask how to train on this machine (or cluster) and return the config.

    SageMaker configs are built by :func:`accelerando.commands.config.sagemaker.get_sagemaker_input`;
    the launcher here runs on local machines only, so the command asks about those.

    Returns:
        The config, or ``None`` when the user cancelled.

    Raises:
        ImportError: questionary is not installed.
    """
    return get_cluster_input()


def config_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the parser of the interactive ``accelerando config`` (no subcommands).

    Args:
        subparsers: the ``add_subparsers()`` object to register ``config`` on; ``None`` makes a
            stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`config_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser(
            "config", help="Create or update a config file.", description=description,
            formatter_class=SubcommandHelpFormatter,
        )  # fmt: skip
    else:
        parser = CustomArgumentParser(
            "accelerando config", description=description, formatter_class=SubcommandHelpFormatter
        )
    parser.add_argument(
        "--config_file",
        default=None,
        help=f"Where to write the config file (default: {default_config_path()}, or "
        "$ACCELERANDO_CONFIG_FILE when set). A .json name writes JSON, anything else YAML.",
    )
    parser.set_defaults(func=config_command, config_command=None)
    return parser


def write_config(config: BaseConfig, path: str | Path) -> Path:
    """Write ``config`` to ``path`` (JSON for a ``.json`` name, else YAML) after checking it loads.

    Args:
        config: the config to write.
        path: destination.

    Returns:
        The path written.

    Raises:
        ConfigError: a value the launcher would refuse.
    """
    path = Path(path).expanduser()
    if isinstance(config, ClusterConfig):
        config_to_layer(config.to_dict(), str(path))
    if path.suffix == ".json":
        config.to_json_file(path)
    else:
        config.to_yaml_file(path)
    return path


def config_command(args: argparse.Namespace) -> int:
    """Ask the questions and write the config file named by ``args.config_file``.

    Args:
        args: parsed arguments (``config_file``: ``None`` = the default location).

    Returns:
        0 when written, 1 when cancelled, 2 when questionary is missing or an answer is invalid.
    """
    path = (
        Path(args.config_file).expanduser() if getattr(args, "config_file", None) else default_config_path()
    )
    try:
        config = get_user_input()
        if config is None:
            print("accelerando config: cancelled; nothing written.", file=sys.stderr)
            return 1
        written = write_config(config, path)
    except ImportError as err:
        print(f"accelerando config: {err}", file=sys.stderr)
        return 2
    except (ConfigError, ValueError) as err:
        print(f"accelerando config: {err}", file=sys.stderr)
        return 2
    print(f"Config file written to {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the interactive ``accelerando config`` (no subcommands) as a program.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    args = config_command_parser().parse_args(argv)
    return config_command(args)
