"""Plan a job before renting it: simulate a training step per parallel layout, rank those that fit.

Loaded only when asked (``accelerando plan``, or the automatic layout with a model to simulate):
``import accelerando`` does not import it. The pieces, in the order a plan uses them:
:mod:`.models` (where the model comes from), :mod:`.layouts` (our strategies' layout steps),
:mod:`.simulate` + :mod:`.tracking` (fake tensors on a fake process group, memory and collective
counters), :mod:`.derive` (layouts computed by formula), :mod:`.cost` (step-time model),
:mod:`.planner` (candidates and ranking), :mod:`.report` (table, plot, launch config).
"""

from __future__ import annotations

from accelerando.backends.planning.models import BUILTIN_CONFIGS, ModelSource, resolve_model
from accelerando.backends.planning.planner import LAYOUT_NAMES, Plan, candidates, plan
from accelerando.backends.planning.spec import (
    Candidate,
    ClusterSpec,
    LayoutEstimate,
    MemoryBreakdown,
    TrainingShape,
)

__all__ = [
    "BUILTIN_CONFIGS",
    "LAYOUT_NAMES",
    "Candidate",
    "ClusterSpec",
    "LayoutEstimate",
    "MemoryBreakdown",
    "ModelSource",
    "Plan",
    "TrainingShape",
    "candidates",
    "plan",
    "resolve_model",
]
