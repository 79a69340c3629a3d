"""Resuming on another number of processes: the batch per optimizer step, the step counter, the schedule.

A checkpoint's manifest records how the run that wrote it stepped (``gradient_accumulation_steps`` and
how many times each prepared scheduler advanced per optimizer step). When ``load_state`` reads it on
another number of processes, :func:`plan_resize` decides what the resumed run does, by the
``elastic_batch`` setting:

- ``"keep_accumulation"`` (default): ``gradient_accumulation_steps`` stays what the script set, so the
  batch per optimizer step changes with the number of processes; one line says from what to what.
- ``"keep_global"``: ``gradient_accumulation_steps`` becomes ``saved x saved processes / processes``
  when that is a whole number (the batch per optimizer step is the saved one), the micro-step counter
  is scaled alike, and each scheduler advances per optimizer step as often as it did in the saved run.
  Where it does not divide, the script's value is kept and one line says so.

With ``split_batches`` the global batch of a dataloader does not depend on the number of processes, so
both modes keep the accumulation steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

__all__ = ["ElasticPlan", "manifest_facts", "plan_resize", "saved_accumulation"]

logger = logging.getLogger(__name__)

KEEP_GLOBAL = "keep_global"


@dataclass(frozen=True)
class ElasticPlan:
    """What a resume on another number of processes changes.

    Attributes:
        gradient_accumulation_steps: the accumulation steps the resumed run uses.
        step: the micro-step counter the resumed run continues from.
        scheduler_repeats: per prepared scheduler, how often it advances per optimizer step (None:
            leave it as prepared).
        message: the one line that tells the user what changed (empty when nothing did).
    """

    gradient_accumulation_steps: int
    step: int
    scheduler_repeats: tuple[int, ...] | None
    message: str


def manifest_facts(gradient_accumulation_steps: int, scheduler_repeats: list[int]) -> dict[str, object]:
    """The entries a save adds to its manifest's ``extra`` for a later resize.

    Args:
        gradient_accumulation_steps: the run's accumulation steps at the save.
        scheduler_repeats: per prepared scheduler, how often it advances per optimizer step.
    """
    return {
        "gradient_accumulation_steps": int(gradient_accumulation_steps),
        "scheduler_repeats": [int(r) for r in scheduler_repeats],
    }


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def saved_accumulation(extra: dict[str, object], default: int) -> int:
    """The ``gradient_accumulation_steps`` a manifest's ``extra`` records (``default`` when it has none)."""
    value = extra.get("gradient_accumulation_steps", default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default


def plan_resize(
    extra: dict[str, object],
    saved_world: int,
    world: int,
    accumulation: int,
    step: int,
    split_batches: bool,
    mode: str,
) -> ElasticPlan:
    """Decide the accumulation steps, step counter and schedule of a resume on ``world`` processes.

    Args:
        extra: the checkpoint manifest's ``extra`` (what :func:`manifest_facts` wrote; older
            checkpoints lack it: the script's accumulation steps are taken as the saved ones).
        saved_world: processes of the run that saved.
        world: processes now.
        accumulation: ``gradient_accumulation_steps`` the script set now.
        step: the saved micro-step counter.
        split_batches: whether dataloaders split one global batch between the processes.
        mode: the ``elastic_batch`` setting (``"keep_accumulation"`` or ``"keep_global"``).

    Returns:
        The plan; its ``message`` is empty when the world size and the accumulation are unchanged.
    """
    saved = saved_accumulation(extra, accumulation)
    repeats = extra.get("scheduler_repeats")
    # All or nothing: dropping one odd entry would shift every later scheduler onto another's pace.
    valid = isinstance(repeats, list) and all(type(r) is int and r >= 1 for r in repeats)
    saved_repeats = tuple(cast("list[int]", repeats)) if valid else None
    factor = 1 if split_batches else saved_world
    per_micro_now = 1 if split_batches else world
    old_batch = f"{saved} x {factor}"
    if mode != KEEP_GLOBAL:
        if saved_world == world:
            return ElasticPlan(accumulation, step, None, "")
        return ElasticPlan(
            accumulation,
            step,
            None,
            f"resumed on {_processes(world)} from a save on {_processes(saved_world)}: "
            f"gradient_accumulation_steps stays "
            f"{accumulation}, so each optimizer step takes {accumulation} x {per_micro_now} per-process "
            f"batches instead of {old_batch} (elastic_batch='keep_global' keeps the saved batch)",
        )
    total = saved * factor
    if total % per_micro_now:
        return ElasticPlan(
            accumulation,
            step,
            None,
            f"elastic_batch='keep_global' cannot keep the batch per optimizer step ({old_batch} per-process "
            f"batches) on {_processes(world)}: it does not divide; gradient_accumulation_steps stays "
            f"{accumulation}",
        )
    new_accumulation = total // per_micro_now
    new_step = step * new_accumulation // saved
    if new_accumulation == accumulation and saved_world == world:
        return ElasticPlan(accumulation, new_step, saved_repeats, "")
    return ElasticPlan(
        new_accumulation,
        new_step,
        saved_repeats,
        f"elastic_batch='keep_global': resumed on {_processes(world)} from a save on {_processes(saved_world)}; "
        f"gradient_accumulation_steps {saved} -> {new_accumulation} keeps {total} per-process "
        f"batches per optimizer step (micro-step counter {step} -> {new_step})",
    )
