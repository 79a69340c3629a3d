"""Show a plan: a text table, a bar plot of per-rank memory, and the chosen layout as a launch config."""

from __future__ import annotations

from pathlib import Path

from accelerando.backends.planning.planner import Plan
from accelerando.backends.planning.spec import CATEGORIES, LayoutEstimate

__all__ = ["format_table", "launch_config", "plan_to_json", "write_config", "write_plot"]

_GIB = 1024**3


def _unit(plan: Plan) -> tuple[str, int]:
    """GiB, or MiB when every peak is under 1 GiB (tiny models)."""
    largest = max((e.memory.peak for e in plan.estimates), default=0)
    return ("GiB", _GIB) if largest >= _GIB else ("MiB", 1024**2)


def _comms(estimate: LayoutEstimate) -> str:
    return (
        ", ".join(f"{k} {v / _GIB:.3g} GiB" for k, v in sorted(estimate.collective_bytes.items()) if v) or "-"
    )


def format_table(plan: Plan) -> str:
    """The plan as a fixed-width table (GiB per rank), its reasons and what was skipped.

    The first line says the figures are a simulation, not a measurement.
    """
    c, s = plan.cluster, plan.shape
    head = [
        f"SIMULATION (fake tensors, fake process group; no device was used): {plan.model} on "
        f"{c.num_machines} x {c.gpus_per_machine} devices of {c.device_memory / _GIB:.3g} GiB "
        f"({c.budget / _GIB:.3g} GiB usable), micro-batch {s.micro_batch} x {s.seq_length} tokens, "
        f"precision {s.mixed_precision}, {s.optimizer}, activation checkpointing "
        f"{'on' if s.activation_checkpointing else 'off'}"
    ]
    unit, scale = _unit(plan)
    columns = ["layout", "degrees", *CATEGORIES, "peak", "fits", "step s", "method"]
    rows = [columns]
    for e in plan.estimates:
        rows.append(
            [
                e.candidate.name,
                e.candidate.describe(),
                *[f"{getattr(e.memory, k) / scale:.2f}" for k in CATEGORIES],
                f"{e.memory.peak / scale:.2f}",
                "yes" if e.fits else "no",
                f"{e.step_seconds:.3g}",
                e.method,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    comms = ["", "bytes per collective per step, one rank:"]
    comms += [f"  {e.candidate.name}: {_comms(e)}" for e in plan.estimates]
    tail = [
        "",
        f"memory columns in {unit} per rank at its peak; step s = compute + communication (no overlap)",
    ]
    tail += [*plan.reasons, *[f"skipped {line}" for line in plan.skipped]]
    return "\n".join([*head, "", *lines, *comms, *tail])


def plan_to_json(plan: Plan) -> dict[str, object]:
    """The plan as JSON-ready data."""
    return {
        "model": plan.model,
        "cluster": vars(plan.cluster),
        "shape": vars(plan.shape),
        "layouts": [
            {
                "name": e.candidate.name,
                "degrees": e.candidate.describe(),
                "memory": e.memory.as_dict(),
                "collective_bytes": e.collective_bytes,
                "method": e.method,
                "fits": e.fits,
                "compute_seconds": e.compute_seconds,
                "communication_seconds": e.communication_seconds,
            }
            for e in plan.estimates
        ],
        "skipped": plan.skipped,
        "reasons": plan.reasons,
    }


def write_plot(plan: Plan, path: str | Path) -> Path:
    """A stacked bar per layout of its per-rank peak by category, with the budget as a line (PNG).

    Raises:
        ValueError: matplotlib is not installed (``pip install accelerando[plots]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError(
            "the plot needs matplotlib: pip install 'accelerando[plots]', or drop --plot"
        ) from err
    figure, axes = plt.subplots(figsize=(max(6, 0.9 * len(plan.estimates) + 2), 4.5))
    names = [e.candidate.name for e in plan.estimates]
    bottom = [0.0] * len(names)
    for category in CATEGORIES:
        values = [getattr(e.memory, category) / _GIB for e in plan.estimates]
        axes.bar(names, values, bottom=bottom, label=category)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes.axhline(plan.cluster.budget / _GIB, color="black", linestyle="--", label="budget")
    axes.set_ylabel("GiB per rank at peak")
    axes.set_title(f"{plan.model}: {plan.cluster.world_size} devices (simulated)")
    axes.legend(fontsize="small")
    axes.tick_params(axis="x", labelrotation=30)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target)
    plt.close(figure)
    return target


def launch_config(plan: Plan, estimate: LayoutEstimate | None = None) -> dict[str, object]:
    """The ``accelerando launch`` config file content for ``estimate`` (default: the chosen layout).

    Raises:
        ValueError: no layout fits and none was named.
    """
    chosen = estimate or plan.chosen
    if chosen is None:
        raise ValueError(
            "no layout fits, so there is no config to write; see the plan's reasons for the fixes"
        )
    c, s, cand = plan.cluster, plan.shape, chosen.candidate
    config: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": c.num_machines,
        "num_processes": c.world_size,
        "mixed_precision": s.mixed_precision,
        "distributed_type": "MULTI_GPU",
    }
    fsdp = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_reshard_after_forward": cand.zero_stage == 3,
        "fsdp_offload_params": cand.offload,
        "fsdp_activation_checkpointing": s.activation_checkpointing,
    }
    if cand.zero_stage == 1 or cand.name == "zero3":
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {"zero_stage": cand.zero_stage}
    elif cand.zero_stage >= 2:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = fsdp
        if cand.tp > 1 or cand.dp_replicate > 1:
            config["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": cand.dp_replicate,
                "parallelism_config_dp_shard_size": cand.dp_shard,
                "parallelism_config_tp_size": cand.tp,
            }
    return config


def write_config(plan: Plan, path: str | Path, estimate: LayoutEstimate | None = None) -> Path:
    """Write :func:`launch_config` as YAML, headed by a comment naming the layout and its estimate.

    Raises:
        ValueError: no layout fits and none was named.
    """
    import yaml

    data = launch_config(plan, estimate)
    chosen = estimate or plan.chosen
    if chosen is None:  # launch_config has raised already; this keeps the type checker informed
        raise ValueError("no layout fits")
    note = [
        f"# written by `accelerando plan`: {chosen.candidate.name} ({chosen.candidate.describe()}),",
        f"# estimated peak {chosen.memory.peak / _GIB:.2f} GiB per rank ({chosen.method})",
    ]
    if chosen.candidate.pp > 1:
        note.append(
            f"# pipeline stages are set in code: PipelineParallelPlugin(num_stages={chosen.candidate.pp})"
        )
    target = Path(path)
    target.write_text("\n".join(note) + "\n" + yaml.safe_dump(data, sort_keys=False))
    return target
