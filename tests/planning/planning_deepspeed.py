"""A measured DeepSpeed ZeRO-3 run for the planner's validation: the model through ``Accelerator`` as a user runs it.

The planner's own measured runs (:func:`accelerando.backends.planning.validation.measure_on_rank`) lay models
out with the strategies' steps below the facade; a DeepSpeed run needs the facade (``Accelerator`` with a
``DeepSpeedPlugin(zero_stage=3)``), which the planner package may not import (import-linter layers), so it
lives here, next to the tests, and ``benchmarks/bench_plan_validation.py`` imports it from this folder.

What is counted, per rank: every tensor storage created from the model's construction on (a
``MemTracker`` entered before the model is built and through ``accelerator.prepare``, so DeepSpeed's flat
partitions, fp32 master copy, gradient partitions and reduce bucket are all seen), with the peak taken
over the training steps only (the tracker is re-entered for them, which restarts its peak at the
current total). Three steps run and the collectives of the third are counted: DeepSpeed records the
order modules fetch their parameters in the first step and, at the end of the second, checks that every
rank recorded the same order (broadcasts of pickled lists: once per job, not steady state).

Only the peak total is comparable with the prediction: the tracker files what DeepSpeed allocates
outside forward and backward (its partitions, master copy, reduce bucket) as activations, so the
measured split by category is not DeepSpeed's.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import cast

import torch

from accelerando.backends.planning.simulate import StepCount
from accelerando.backends.planning.spec import TrainingShape
from accelerando.backends.planning.tracking import CollectiveCounter, tracked_breakdown
from accelerando.backends.planning.validation import ZERO3_LAYOUT, ZERO3_VARIANTS

try:
    from suite_support import deepspeed_extensions_folder
except ImportError:  # imported by benchmarks/bench_plan_validation.py, with only this folder on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from suite_support import deepspeed_extensions_folder

__all__ = ["DEEPSPEED_ENV", "measure_zero3_on_rank"]

#: Environment of every rank: DeepSpeed's CPU accelerator, and its CPU op prebuilt by tests/conftest.py.
DEEPSPEED_ENV = {
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": "cpu",
    "PYTHONWARNINGS": "ignore",
    "TORCH_EXTENSIONS_DIR": str(deepspeed_extensions_folder()),
}
_STEPS = 3


def measure_zero3_on_rank(
    model_name: str, shape: TrainingShape, layout: str = ZERO3_LAYOUT
) -> dict[str, StepCount | str]:
    """Train ``model_name`` with DeepSpeed ZeRO-3 through ``Accelerator`` on this rank; ``key -> count``.

    Called once per process by ``run_distributed`` (the environment holds the rendezvous address and
    :data:`DEEPSPEED_ENV`). ``layout``: a row of ``ZERO3_VARIANTS`` (the ``zero_optimization`` keys set
    over DeepSpeed's defaults). The key is ``"<model>/<layout>"``, as the validation's other rows.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    from accelerando import Accelerator, DeepSpeedPlugin
    from accelerando.backends.planning.models import resolve_model

    source = resolve_model(model_name)
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = shape.micro_batch
    plugin.deepspeed_config["zero_optimization"].update(ZERO3_VARIANTS[layout])
    accelerator = Accelerator(
        deepspeed_plugin=plugin, mixed_precision="bf16" if shape.mixed_precision == "bf16" else "no"
    )
    tracker = MemTracker()
    with tracker:
        torch.manual_seed(0)
        model = source.build()
        model.train()
        num_parameters = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        prepared = accelerator.prepare(model, optimizer)
        model, optimizer = cast("tuple[torch.nn.Module, torch.optim.Optimizer]", prepared)
    # made untracked, as the simulation's are (a batch is an input, not what a layout costs)
    batches = [source.batch(shape.micro_batch, shape.seq_length) for _ in range(_STEPS)]
    tracker.reset_mod_stats()
    counter = CollectiveCounter()
    with tracker:  # re-entered: its peak restarts at what prepare left live
        for step, batch in enumerate(batches):
            with counter if step == _STEPS - 1 else contextlib.nullcontext():
                loss = model(**batch).loss
                accelerator.backward(loss)  # DeepSpeed's engine steps its optimizer here
                optimizer.step()
                optimizer.zero_grad()
            tracker.reset_mod_stats()
    engine = accelerator.deepspeed_engine_wrapped.engine  # pyright: ignore[reportOptionalMemberAccess]
    partition = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in engine.module.parameters())
    count = StepCount(tracked_breakdown(tracker), dict(counter.bytes_by_kind), partition, num_parameters)
    return {f"{model_name}/{layout}": count}
