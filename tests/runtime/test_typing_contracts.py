"""Typed contracts between the layers: pyright over src/ and the count of ``Any`` in annotations.

- The five contract modules (runtime, connector, strategies/base, precision/base,
  checkpointing/target) pass pyright in strict mode with no error.
- pyright in basic mode over all of src/ reports no error (a whole-tree analysis takes about a minute
  of CPU; it is part of the default run because a type error is a broken contract).
- ``Any`` in annotations (parameters, returns, annotated assignments; string annotations included)
  stays at or under its ratchet, on the way to the issue's ceiling of 300.

Configuration: ``[tool.pyright]`` in pyproject.toml; the checker is ``basedpyright`` (pyright with
node bundled as a wheel, so it runs offline), from the test extra.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

from suite_support import PyrightRun

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "accelerando"
CONTRACT_MODULES = [
    "src/accelerando/core/runtime.py",
    "src/accelerando/backends/connector.py",
    "src/accelerando/backends/strategies/base.py",
    "src/accelerando/backends/precision/base.py",
    "src/accelerando/checkpointing/target.py",
]
# Measured with this file's counter over src/accelerando: 2028 before issue 28 item 2, 1867 after its
# first pass, 133 after the second, 132 with typed Settings attributes (the goal is under 300). Each one left is commented where it
# stands (loaded or JSON data, keywords forwarded to an untyped library, a plugin type one layer up).
# Lower it with every file you type; never raise it.
ANY_RATCHET = 132
ANY_GOAL = 300
# pyright basic over src/ (reportMissingImports off, see pyproject.toml): 508 errors before issue 28,
# 496 after the first pass, 0 after the second. A new error fails the default run.
PYRIGHT_BASIC_RATCHET = 0


def _pyright(*paths: str) -> dict:
    """Run basedpyright with the project's configuration; its JSON report."""
    run = PyrightRun(*paths)
    try:
        return run.report()
    finally:
        run.stop()


def _errors(report: dict) -> list[str]:
    return [
        f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']} ({d.get('rule')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]


def test_contract_modules_pass_pyright_strict():
    report = _pyright(*CONTRACT_MODULES)
    assert report["summary"]["filesAnalyzed"] >= len(CONTRACT_MODULES)
    errors = _errors(report)
    assert errors == [], "\n".join(errors)


def test_pyright_basic_over_src_does_not_grow(pyright_report_over_src):
    # The same run as _pyright() with no path; tests/conftest.py starts it in the background at
    # collection (it takes about 100 s of one core), and this test waits for its report.
    report = pyright_report_over_src
    errors = _errors(report)
    assert len(errors) <= PYRIGHT_BASIC_RATCHET, "\n".join(errors[:50])


def count_any_in_annotations(source: str) -> int:
    """Occurrences of ``Any`` / ``typing.Any`` in the annotations of one module's source."""
    total = 0

    def visit(annotation: ast.expr | None) -> None:
        nonlocal total
        if annotation is None:
            return
        for node in ast.walk(annotation):
            if (isinstance(node, ast.Name) and node.id == "Any") or (
                isinstance(node, ast.Attribute) and node.attr == "Any"
            ):
                total += 1
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
                try:
                    visit(ast.parse(node.value, mode="eval").body)
                except SyntaxError:
                    pass

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                visit(argument.annotation)
            for argument in (arguments.vararg, arguments.kwarg):
                visit(argument.annotation if argument is not None else None)
            visit(node.returns)
        elif isinstance(node, ast.AnnAssign):
            visit(node.annotation)
    return total


def test_the_counter_counts_annotations_only():
    source = (
        "from typing import Any\n"
        "import typing\n"
        "x: dict[str, Any] = {}\n"
        "def f(a: Any, *b: Any, c: 'list[Any]', **d: typing.Any) -> Any:\n"
        "    y = Any\n"
        "    return cast(Any, a)\n"
    )
    assert count_any_in_annotations(source) == 6


def test_any_in_annotations_stays_under_the_ratchet():
    counts = {
        str(path.relative_to(PACKAGE)): count_any_in_annotations(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda item: -item[1])[:10]
    assert total <= ANY_RATCHET, (
        f"{total} Any in annotations (ratchet {ANY_RATCHET}, goal {ANY_GOAL}); "
        f"use a real type (torch.nn.Module, Mapping[str, object], a Protocol, object). Most: {worst}"
    )


def test_connector_builds_the_runtime_whole_then_activates_it(fresh_state, isolated_env, monkeypatch):
    import accelerando.backends.strategies as strategies
    import accelerando.core.runtime as rt
    from accelerando.backends import connector
    from accelerando.backends.precision.base import Precision
    from accelerando.backends.strategies.base import Strategy

    seen: dict[str, object] = {}

    class RecordingStrategy(Strategy):
        def __init__(self, runtime: rt.Runtime, precision: Precision, **options: object) -> None:
            super().__init__(runtime, precision, **options)
            seen["active_while_built"] = rt.current()
            seen["runtime"] = runtime
            seen["precision"] = precision
            seen["device"] = runtime.device

    monkeypatch.setattr(strategies, "strategy_class", lambda name: RecordingStrategy)
    built = connector.build(connector.resolve_settings({"cpu": True}), rt.Plugins())
    assert seen["active_while_built"] is None  # nothing sees the record before it is complete
    assert seen["runtime"] is built.runtime and built.strategy.runtime is built.runtime
    assert seen["precision"] is built.precision and built.strategy.precision is built.precision
    assert seen["device"] == built.runtime.device and rt.current() is built.runtime
    assert isinstance(built.strategy, RecordingStrategy)


def test_the_runtime_is_data_without_the_objects_built_from_it(fresh_state, isolated_env):

    import accelerando.core.runtime as rt
    from accelerando.backends import connector

    built = connector.build(connector.resolve_settings({"cpu": True}), rt.Plugins())
    fields = [f.name for f in dataclasses.fields(built.runtime)]
    assert fields == ["settings", "process", "mesh", "distributed_type", "plugins", "reason"]
    copy = dataclasses.replace(built.runtime, reason="copied")  # plain data: copying builds no strategy
    assert copy.settings is built.runtime.settings and copy.reason == "copied"


def test_strategies_read_no_global_state():
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sorted((PACKAGE / "backends" / "strategies").rglob("*.py"))
        if "AcceleratorState()" in path.read_text() or "PartialState()" in path.read_text()
    ]
    # The exceptions are the reference's public helpers that take no Accelerator and read the process
    # state: get_fsdp2_grad_scaler, and the Megatron train-step classes built without one; not strategies.
    assert offenders == [
        "backends/strategies/fsdp/checkpoint.py",
        "backends/strategies/megatron/train_steps.py",
    ]
