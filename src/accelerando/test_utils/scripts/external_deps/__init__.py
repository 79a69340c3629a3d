"""The reference's checks that need libraries, downloads or GPUs beyond accelerando's CPU test set.

Each script here stands at the reference's path (``test_utils/scripts/external_deps/<name>.py``) so that
its name resolves and a suite that launches it finds it, but accelerando's own version of these checks
is not written: every script prints what this machine lacks (or that the check is not provided) and
exits 1, so a suite never counts as a pass a check that did not run. The reference's own versions fail
on a CPU machine without downloads too (all but ``test_pippy.py``, which exits 0 with fewer than 2 GPUs).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import NamedTuple, NoReturn

__all__ = ["NEEDS", "Needs", "not_provided"]


class Needs(NamedTuple):
    """What one of the reference's external-dependency checks needs to run."""

    modules: tuple[str, ...]
    gpus: int = 0
    hub: bool = False


NEEDS: dict[str, Needs] = {
    "test_checkpointing.py": Needs(("evaluate", "datasets", "transformers"), gpus=0, hub=True),
    "test_metrics.py": Needs(("evaluate", "datasets", "transformers"), gpus=0, hub=True),
    "test_performance.py": Needs(("evaluate", "datasets", "transformers"), gpus=0, hub=True),
    "test_ds_multiple_model.py": Needs(
        ("deepspeed", "evaluate", "datasets", "transformers"), gpus=1, hub=True
    ),
    "test_peak_memory_usage.py": Needs(("datasets", "transformers"), gpus=1, hub=True),
    "test_ds_alst_ulysses_sp.py": Needs(("deepspeed", "transformers"), gpus=2, hub=False),
    "test_zero3_integration.py": Needs(("deepspeed", "transformers"), gpus=1, hub=False),
    "test_pippy.py": Needs(("transformers",), gpus=2, hub=False),
}


def _unmet(needs: Needs) -> list[str]:
    unmet = [
        f"needs {m}, which is not installed" for m in needs.modules if importlib.util.find_spec(m) is None
    ]
    if needs.gpus:
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < needs.gpus:
            unmet.append(f"needs {needs.gpus} CUDA device(s), found {found}")
    if needs.hub and os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        unmet.append("needs models and data from the Hugging Face Hub; HF_HUB_OFFLINE is set")
    return unmet


def not_provided(script: str) -> NoReturn:
    """End the script named ``script`` (its ``__file__``) with status 1, saying why it checks nothing.

    Raises:
        SystemExit: always, with status 1: the first unmet requirement is printed, or, when every one is
            met, that accelerando's version of this check is not written yet.
    """
    name = Path(script).name
    unmet = _unmet(NEEDS[name])
    reason = (
        unmet[0] if unmet else "accelerando's version of this check is not written yet; run the reference's"
    )
    print(f"{name}: not run: {reason}", file=sys.stderr)
    raise SystemExit(1)
