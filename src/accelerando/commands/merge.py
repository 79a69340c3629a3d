"""``accelerando merge-weights CHECKPOINT_DIR OUTPUT_DIR``: sharded FSDP weights -> full weights.

Runs in one process without a process group. torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accelerando.commands.utils import CustomArgumentParser

__all__ = ["add_parser", "main", "merge_command", "merge_command_parser", "run"]

_DESCRIPTION = (
    "Merge the shards FSDP wrote with SHARDED_STATE_DICT into one weights file "
    "(or several with an index above --max_shard_size)."
)


def merge_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``merge-weights`` parser.

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`merge_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser(
            "merge-weights",
            help="Merge a sharded FSDP checkpoint (pytorch_model_fsdp_<i>/) into full weights.",
            description=_DESCRIPTION,
        )
    else:
        parser = CustomArgumentParser("accelerando merge-weights", description=_DESCRIPTION)
    parser.add_argument(
        "checkpoint_directory", help="The sharded folder, e.g. checkpoint/pytorch_model_fsdp_0."
    )
    parser.add_argument("output_path", help="Folder to write the merged weights into.")
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="Write pytorch_model.bin with torch.save instead of model.safetensors.",
    )
    parser.add_argument(
        "--remove_checkpoint_dir", action="store_true", help="Delete the sharded folder after merging."
    )
    parser.add_argument(
        "--max_shard_size", default="10GB", help="Largest output file before splitting (default 10GB)."
    )
    parser.add_argument(
        "--trust_checkpoint",
        action="store_true",
        help="Unpickle the checkpoint's non-tensor items fully, which runs any code the files hold "
        "(only for checkpoints you trust; by default they are read as plain data only).",
    )
    parser.set_defaults(func=merge_command)
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando merge-weights`` (see :func:`merge_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    return merge_command_parser(subparsers)


def merge_command(args: argparse.Namespace) -> int:
    """Merge the shards named by ``args``; print where the weights went.

    Args:
        args: parsed arguments of ``merge-weights``.

    Returns:
        0 on success, 1 when the folder is not a sharded checkpoint, is damaged, or holds items only
        full unpickling can read (without ``--trust_checkpoint``).
    """
    from accelerando.backends.strategies.fsdp.checkpoint import merge_fsdp_weights
    from accelerando.checkpointing.manifest import CheckpointError

    try:
        out = merge_fsdp_weights(
            args.checkpoint_directory,
            args.output_path,
            safe_serialization=not args.unsafe_serialization,
            remove_checkpoint_dir=args.remove_checkpoint_dir,
            max_shard_size=args.max_shard_size,
            load_kwargs={"weights_only": False} if getattr(args, "trust_checkpoint", False) else None,
        )
    except (FileNotFoundError, CheckpointError) as err:
        print(f"accelerando merge-weights: {err}", file=sys.stderr)
        return 1
    print(f"Merged weights written to {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Same as :func:`merge_command`."""
    return merge_command(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``accelerando-merge-weights`` and ``python -m accelerando.commands.merge``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return merge_command(merge_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
