"""``accelerando plan``: will this model fit on this cluster, with which layout, and what will it send?

Simulates one training step per candidate layout with fake tensors and a fake process group at the
real world size (nothing is allocated, nothing is sent), prints the per-rank memory by category and
the bytes per collective, ranks the layouts that fit by estimated throughput, and can write the chosen
layout as a config file for ``accelerando launch``. See docs/guides/planning.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from accelerando.backends.planning import report
from accelerando.backends.planning.models import resolve_model
from accelerando.backends.planning.planner import plan
from accelerando.backends.planning.spec import ClusterSpec, TrainingShape
from accelerando.core.parallelism_layout import parse_memory

__all__ = ["add_parser", "plan_command_parser", "run"]

_DESCRIPTION = (
    "Simulate a training step for each parallel layout (fake tensors, fake process group) and rank those "
    "that fit the cluster."
)


def plan_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """The ``plan`` parser (registered on ``subparsers`` when given)."""
    if subparsers is not None:
        parser = subparsers.add_parser("plan", help=_DESCRIPTION, description=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("accelerando plan", description=_DESCRIPTION)
    parser.add_argument(
        "model",
        help="a built-in config (tiny-llama, tiny-gpt2, tiny-t5, llama-7b), a transformers config.json or its "
        "folder, module:function returning the model, or a model name in the local Hugging Face cache",
    )
    parser.add_argument(
        "--micro_batch", type=int, default=1, help="samples per data-parallel rank (default 1)"
    )
    parser.add_argument("--seq_length", type=int, default=2048, help="tokens per sample (default 2048)")
    parser.add_argument("--mixed_precision", choices=("no", "bf16"), default="bf16", help="default bf16")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="default adamw")
    parser.add_argument(
        "--activation_checkpointing", action="store_true", help="recompute layers in backward"
    )
    parser.add_argument("--num_machines", type=int, default=1, help="machines (default 1)")
    parser.add_argument("--gpus_per_machine", type=int, default=8, help="devices per machine (default 8)")
    parser.add_argument("--device_memory", default="80GiB", help="memory per device, e.g. 80GiB (default)")
    parser.add_argument("--intra_node_bandwidth", type=float, default=200e9, help="bytes/s in a node (200e9)")
    parser.add_argument(
        "--inter_node_bandwidth", type=float, default=25e9, help="bytes/s across nodes (25e9)"
    )
    parser.add_argument(
        "--device_flops", type=float, default=400e12, help="sustained FLOP/s per device (400e12)"
    )
    parser.add_argument("--headroom", type=float, default=0.10, help="memory fraction kept free (0.10)")
    parser.add_argument(
        "--layouts", default=None, help="comma-separated layout families to keep (default all)"
    )
    parser.add_argument("--plot", default=None, metavar="PNG", help="write a bar plot of per-rank memory")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the plan as JSON")
    parser.add_argument(
        "--write_config", default=None, metavar="YAML", help="write the chosen layout's config"
    )
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``plan`` on the CLI's subparsers."""
    return plan_command_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    """Plan, print the table, and write the optional plot, JSON and config. Returns 0, or 1 when none fits.

    Raises:
        SystemExit: a bad argument (the message names it and the fix).
    """
    try:
        shape = TrainingShape(
            micro_batch=args.micro_batch,
            seq_length=args.seq_length,
            mixed_precision=args.mixed_precision,
            optimizer=args.optimizer,
            activation_checkpointing=args.activation_checkpointing,
        )
        cluster = ClusterSpec(
            num_machines=args.num_machines,
            gpus_per_machine=args.gpus_per_machine,
            device_memory=parse_memory(args.device_memory),
            intra_node_bandwidth=args.intra_node_bandwidth,
            inter_node_bandwidth=args.inter_node_bandwidth,
            device_flops=args.device_flops,
            headroom=args.headroom,
        )
        source = resolve_model(args.model)
        only = [name.strip() for name in args.layouts.split(",")] if args.layouts else None
        result = plan(source, shape, cluster, only=only, progress=lambda line: print(line, file=sys.stderr))
    except ValueError as err:
        raise SystemExit(f"accelerando plan: {err}") from None
    print(report.format_table(result))
    if args.plot:
        print(f"plot: {report.write_plot(result, args.plot)}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.plan_to_json(result), handle, indent=2)
        print(f"json: {args.json}")
    if args.write_config:
        if result.chosen is None:
            print("no layout fits: no config written", file=sys.stderr)
        else:
            print(
                f"config: {report.write_config(result, args.write_config)} (accelerando launch --config_file)"
            )
    return 0 if result.chosen is not None else 1
