"""Strategy capabilities (issue 43 item 7): small interfaces a strategy inherits, asked with isinstance.

``ManagesPrecision`` (the connector's loss scaler, the preparer's precision conversion),
``ScalesLossForAccumulation`` (``Accelerator.backward``), ``ReplicatesParameters`` (LocalSGD) and
``LoadsOwnCheckpoints`` (``load_state``/``save_state``, declared in the checkpointing layer) replace the
four ``ClassVar[bool]`` flags each strategy declared. Every registered strategy implements exactly the
interfaces pinned here (the same answers as the flags gave), lists them before ``Strategy`` in its bases
and overrides each of their methods; the callers ask ``isinstance``/``issubclass`` and never read a
capability by name, nor probe a strategy's type.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from accelerando.backends.strategies import STRATEGIES, strategy_class
from accelerando.backends.strategies.base import (
    ManagesPrecision,
    ReplicatesParameters,
    ScalesLossForAccumulation,
    SingleDeviceStrategy,
    Strategy,
)
from accelerando.checkpointing.target import LoadsOwnCheckpoints

SRC = Path(__file__).resolve().parents[2] / "src" / "accelerando"

INTERFACES: tuple[type, ...] = (
    ManagesPrecision,
    ScalesLossForAccumulation,
    ReplicatesParameters,
    LoadsOwnCheckpoints,
)
# The four flags the interfaces replaced: no module may read them any more.
OLD_FLAGS = (
    "manages_precision",
    "divides_loss_for_accumulation",
    "plain_data_parallel",
    "loads_own_checkpoints",
)

# The table the flags pinned (cf54e28), as interfaces:
# manages_precision=True, divides_loss_for_accumulation=False, plain_data_parallel=True, loads_own_checkpoints=True.
EXPECTED: dict[str, set[type]] = {
    "single": {ReplicatesParameters},
    "ddp": {ReplicatesParameters},
    "fsdp": {LoadsOwnCheckpoints},
    "deepspeed": {ManagesPrecision, ScalesLossForAccumulation, LoadsOwnCheckpoints},
    "megatron": {ManagesPrecision, ScalesLossForAccumulation, LoadsOwnCheckpoints},
    "composable": {LoadsOwnCheckpoints},
    "pipeline": set(),
    "fault_tolerant": set(),
}


def _own_methods(interface: type) -> list[str]:
    return [name for name, value in vars(interface).items() if callable(value) and not name.startswith("__")]


def test_each_interface_names_what_it_does():
    for interface in INTERFACES:
        assert _own_methods(interface), f"{interface.__name__} names no method"
        # A plain class: isinstance runs in C (an ABC's __instancecheck__ is a Python call per micro-batch).
        assert type(interface) is type, interface
    # The base strategy is every strategy's base, so it carries none (the one-device strategy does).
    assert not [i for i in INTERFACES if issubclass(Strategy, i)]
    assert strategy_class("single") is SingleDeviceStrategy


def test_every_registered_strategy_is_pinned():
    assert set(EXPECTED) == set(STRATEGIES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_strategy_implements_exactly_its_interfaces(name):
    cls = strategy_class(name)
    assert {i for i in INTERFACES if issubclass(cls, i)} == EXPECTED[name]
    for flag in OLD_FLAGS:
        assert not hasattr(cls, flag), f"{cls.__name__}.{flag}: capabilities are interfaces now"
    mro = cls.__mro__
    for interface in EXPECTED[name]:
        # Listed before Strategy, so a method it forgot raises instead of running the one-device default.
        assert mro.index(interface) < mro.index(Strategy), (cls.__name__, interface.__name__)
        for method in _own_methods(interface):
            owner = next(klass for klass in mro if method in vars(klass))
            assert owner is not interface, f"{cls.__name__} does not implement {interface.__name__}.{method}"


def test_an_interface_method_left_out_fails_loudly():
    class Forgetful(LoadsOwnCheckpoints, Strategy):
        name = "forgetful"

    with pytest.raises(NotImplementedError, match="Forgetful must implement load_model_checkpoint"):
        Forgetful.load_model_checkpoint(object.__new__(Forgetful), None, "dir", 0)  # type: ignore[arg-type]


def _capability_reads_and_probes(tree: ast.AST) -> tuple[set[str], list[str]]:
    """Interface names used in isinstance/issubclass, and getattr/hasattr/attribute reads of a flag or a
    type probe of a strategy class."""
    names = {i.__name__ for i in INTERFACES}
    asked: set[str] = set()
    probes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in OLD_FLAGS:
            probes.append(ast.unparse(node))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            kind = node.args[1]
            if isinstance(kind, ast.Name) and kind.id in names:
                asked.add(kind.id)
            elif isinstance(kind, ast.Name) and kind.id.endswith("Strategy"):
                probes.append(ast.unparse(node))
        if node.func.id in ("getattr", "hasattr") and any(
            isinstance(arg, ast.Constant) and (arg.value in OLD_FLAGS or arg.value in names)
            for arg in node.args
        ):
            probes.append(ast.unparse(node))
    return asked, probes


def test_callers_ask_the_interfaces_instead_of_probing():
    callers = {
        "backends/connector.py": "ManagesPrecision",
        "facade/preparer.py": "ManagesPrecision",
        "accelerator.py": "ScalesLossForAccumulation",
        "local_sgd.py": "ReplicatesParameters",
        "checkpointing/project.py": "LoadsOwnCheckpoints",
    }
    for path, interface in callers.items():
        asked, probes = _capability_reads_and_probes(ast.parse((SRC / path).read_text()))
        assert interface in asked, f"{path} no longer asks isinstance(..., {interface})"
        assert not probes, f"{path} probes a strategy instead of asking its interface: {probes}"
    # No module outside the strategies package reads a capability by name (getattr/hasattr/attribute).
    for path in SRC.rglob("*.py"):
        if "backends/strategies" in path.as_posix():
            continue
        _, probes = _capability_reads_and_probes(ast.parse(path.read_text()))
        flags = [p for p in probes if any(flag in p for flag in OLD_FLAGS)]
        by_name = [p for p in probes if p.startswith(("getattr", "hasattr"))]
        assert not flags and not by_name, (path, flags, by_name)


def test_the_answers_reach_the_callers(fresh_state):
    # The one-device strategy: LocalSGD accepts it, the loss is divided, the precision converts models.
    from accelerando import Accelerator
    from accelerando.local_sgd import LocalSGD

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert isinstance(acc._strategy, ReplicatesParameters)
    model = acc.prepare(torch.nn.Linear(2, 1))
    with LocalSGD(acc, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert list(acc._strategy.replica_parameters(model)) == list(model.parameters())
