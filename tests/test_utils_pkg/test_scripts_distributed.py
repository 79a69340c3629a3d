"""The bundled check scripts (test_utils/scripts) pass on 2 real processes (gloo on CPU).

One spawn runs every check of test_ops, test_sync and test_distributed_data_loop in the same two
processes (the Accelerator state is reset between scripts) and reports each check's error, if any.
"""

from __future__ import annotations

import traceback

import pytest

from suite_support import reset_accelerator_state, run_distributed_preloaded

# One spawn of two processes running ~10 checks: about a minute on a shared CPU.
pytestmark = pytest.mark.slow


def _run_all_checks() -> dict[str, str | None]:
    from accelerando import Accelerator
    from accelerando.test_utils.scripts import test_distributed_data_loop, test_ops, test_sync

    outcome: dict[str, str | None] = {}

    def attempt(name, check, *args):
        try:
            check(*args)
            outcome[name] = None
        except Exception:  # noqa: BLE001 - every check's failure is reported to the parent
            outcome[name] = traceback.format_exc()

    attempt("test_ops.main", test_ops.main)
    for script, options in (
        (test_sync, {"gradient_accumulation_steps": 2}),
        (test_distributed_data_loop, {}),
    ):
        reset_accelerator_state(partial=False)
        accelerator = Accelerator(**options)
        for name in script.__all__:
            if name.startswith("check_"):
                attempt(f"{script.__name__.rsplit('.', 1)[-1]}.{name}", getattr(script, name), accelerator)
        accelerator.wait_for_everyone()
    return outcome


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, str | None]]:
    return run_distributed_preloaded(_run_all_checks, 2)


_KNOWN_BROKEN: set[str] = set()


def test_bundled_checks_pass_on_two_processes(outcomes):
    assert len(outcomes) == 2
    for rank, outcome in enumerate(outcomes):
        assert "test_sync.check_accumulate" in outcome and "test_ops.main" in outcome
        failed = {name: error for name, error in outcome.items() if error and name not in _KNOWN_BROKEN}
        assert not failed, f"rank {rank}: " + "\n".join(f"{n}:\n{e}" for n, e in failed.items())


def test_join_uneven_inputs_check(outcomes):
    for outcome in outcomes:
        assert outcome["test_distributed_data_loop.check_join_uneven_inputs"] is None, outcome[
            "test_distributed_data_loop.check_join_uneven_inputs"
        ]
