"""Fixtures for the client tests (transformers, peft, trl on accelerando standing in for accelerate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clients_support import Scenario, run_scenario


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    """``scenario(*flags, processes=1)`` runs trainer_scenario.py in ``tmp_path`` and returns the results."""

    def run(*flags: str, processes: int = 1, timeout: float = 900) -> list[dict[str, Any]]:
        return run_scenario(tmp_path, *flags, processes=processes, timeout=timeout)

    return run
