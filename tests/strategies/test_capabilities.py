"""Strategy capabilities (issue 43 item 7): four class-level flags the layers around a strategy ask.

``manages_precision`` (the connector's loss scaler, the preparer's precision conversion),
``divides_loss_for_accumulation`` (``Accelerator.backward``), ``plain_data_parallel`` (LocalSGD) and
``loads_own_checkpoints`` (``load_state``/``save_state``) are declared by every registered strategy in
its own class body (not inherited from the one-device base by accident), with the values pinned
here; the callers read the flag and never a strategy's type or name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from accelerando.backends.strategies import STRATEGIES, strategy_class
from accelerando.backends.strategies.base import CAPABILITIES, Strategy

SRC = Path(__file__).resolve().parents[2] / "src" / "accelerando"

# (manages_precision, divides_loss_for_accumulation, plain_data_parallel, loads_own_checkpoints)
EXPECTED = {
    "single": (False, True, True, False),
    "ddp": (False, True, True, False),
    "fsdp": (False, True, False, True),
    "deepspeed": (True, False, False, True),
    "megatron": (True, False, False, True),
    "composable": (False, True, False, True),
    "pipeline": (False, True, False, False),
    "fault_tolerant": (False, True, False, False),
}


def test_the_capabilities_are_the_four_flags_of_the_base():
    assert CAPABILITIES == (
        "manages_precision",
        "divides_loss_for_accumulation",
        "plain_data_parallel",
        "loads_own_checkpoints",
    )
    assert all(name in Strategy.__annotations__ for name in CAPABILITIES)


def test_every_registered_strategy_is_pinned():
    assert set(EXPECTED) == set(STRATEGIES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_strategy_declares_each_capability_itself(name):
    cls = strategy_class(name)
    missing = [flag for flag in CAPABILITIES if flag not in vars(cls)]
    assert not missing, f"{cls.__name__} inherits {missing}: declare each capability in its class body"
    declared = tuple(vars(cls)[flag] for flag in CAPABILITIES)
    assert all(type(value) is bool for value in declared)
    assert declared == EXPECTED[name]


def _capability_reads_and_type_probes(tree: ast.AST) -> tuple[set[str], list[str]]:
    reads = {
        node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in CAPABILITIES
    }
    probes = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("isinstance", "getattr", "hasattr")
        and any(
            isinstance(arg, ast.Name)
            and arg.id.endswith("Strategy")
            or isinstance(arg, ast.Constant)
            and arg.value in CAPABILITIES
            for arg in node.args
        )
    ]
    return reads, probes


def test_callers_ask_the_flags_instead_of_probing():
    # The questions are answered where they are asked, by reading the flag.
    callers = {
        "backends/connector.py": "manages_precision",
        "facade/preparer.py": "manages_precision",
        "accelerator.py": "divides_loss_for_accumulation",
        "local_sgd.py": "plain_data_parallel",
        "checkpointing/project.py": "loads_own_checkpoints",
    }
    for path, flag in callers.items():
        reads, probes = _capability_reads_and_type_probes(ast.parse((SRC / path).read_text()))
        assert flag in reads, f"{path} no longer reads {flag}"
        assert not probes, f"{path} probes a strategy instead of asking its capability: {probes}"
    # No module outside the strategies package asks for a capability with getattr/hasattr.
    for path in SRC.rglob("*.py"):
        if "backends/strategies" in path.as_posix():
            continue
        _, probes = _capability_reads_and_type_probes(ast.parse(path.read_text()))
        assert not [p for p in probes if any(flag in p for flag in CAPABILITIES)], (path, probes)
