"""The generated package checks are declared for static analysis with the parameters they have."""

from __future__ import annotations

import ast
import inspect
import pathlib

from accelerando.common import imports


def _declared() -> dict[str, str]:
    """``{name: signature}`` of the functions in imports.py's module-level ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(pathlib.Path(imports.__file__).read_text())
    declared: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    declared[item.name] = f"({ast.unparse(item.args)}) -> {ast.unparse(item.returns)}"
    return declared


def test_every_generated_check_is_declared_with_its_signature():
    generated = {check.name: getattr(imports, check.name) for check in imports._PACKAGE_CHECKS}
    declared = _declared()
    assert sorted(declared) == sorted(generated)
    for name, function in generated.items():
        parameters = ", ".join(
            f"{p.name}: {p.annotation} = {p.default!r}"
            for p in inspect.signature(function).parameters.values()
        )
        # Compared without spaces: ast.unparse writes annotated defaults as ``x: int=0``.
        assert declared[name].replace(" ", "") == f"({parameters})->bool".replace(" ", ""), name
