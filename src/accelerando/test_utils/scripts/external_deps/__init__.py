"""The reference's checks that need libraries, downloads or GPUs beyond accelerando's CPU test set.

Each script here stands at the reference's path (``test_utils/scripts/external_deps/<name>.py``) so
a suite that launches it finds it. What it needs is stated by :func:`run_or_skip`: when this machine
lacks any of it, the script prints one line with the reason and exits 0 (nothing it could check);
when everything is there, it says that accelerando's own version of this check is not written yet
and exits 1, so a suite never counts it as a pass it did not earn.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["cuda_devices", "missing_modules", "run_or_skip"]


def missing_modules(*names: str) -> list[str]:
    """The importable-module names among ``names`` that are not installed."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def cuda_devices() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_or_skip(script: str, unmet: Sequence[str]) -> None:
    """Exit this script: 0 with the first unmet requirement printed, else 1 (check not written yet).

    Args:
        script: the script's file name, for the printed line.
        unmet: the requirements this machine lacks, each a short reason; empty when all are met.

    Raises:
        SystemExit: always (status 0 when skipped, 1 when the check could run but is not provided).
    """
    if unmet:
        print(f"{script}: skipped: {unmet[0]}")
        raise SystemExit(0)
    print(
        f"{script}: this machine could run this check, but accelerando's version of it is not "
        "written yet; run the reference's script for it",
        file=sys.stderr,
    )
    raise SystemExit(1)
