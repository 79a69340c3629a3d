"""``accelerando.utils`` is the reference's address book only.

Every module under ``src/accelerando/utils`` sits at an ``accelerate.utils.*`` path the reference has,
holds nothing but imports, ``__all__`` and (for the big namespaces) a ``name -> owner`` table read on
first access, and each name it hands out is the very object its owner defines. Nothing else in
accelerando imports it, and constructing a ``DeepSpeedPlugin`` loads no strategy code.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "accelerando"
UTILS = PACKAGE / "utils"
SURFACE = ROOT / "tests" / "parity" / "reference-surface.txt"
MAX_LINES = 70

# The one statement beyond imports that a module may hold, and why.
ALLOWED_STATEMENTS = {
    # the reference's accelerate.utils.tqdm is both a module and the function it holds: the module
    # object itself has to be callable, so its class is swapped for the owner's callable module class
    "tqdm": "sys.modules[__name__].__class__ = CallableProgressModule",
    # the reference's tests patch accelerate.utils.launch.which / .subprocess: the module's class
    # reads and writes those two names on the owner module, where the launch code looks them up
    "launch": "sys.modules[__name__].__class__ = PatchThroughModule",
}


def _reference_utils_modules() -> set[str]:
    names = set()
    for line in SURFACE.read_text().splitlines():
        if line.startswith("## accelerate.utils."):
            names.add(line.split()[1].removeprefix("accelerate.utils."))
    return names


def _utils_modules() -> list[pathlib.Path]:
    return sorted(path for path in UTILS.glob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    return "accelerando.utils" if path.stem == "__init__" else f"accelerando.utils.{path.stem}"


def _is_table(node: ast.stmt) -> bool:
    """``_EXPORTS: dict[str, str] = {"name": "owner.module", ...}``: a literal table, no logic."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
        return False
    if node.target.id != "_EXPORTS" or not isinstance(node.value, ast.Dict):
        return False
    items = [*node.value.keys, *node.value.values]
    return all(isinstance(item, ast.Constant) and isinstance(item.value, str) for item in items)


def _is_all(node: ast.stmt) -> bool:
    """``__all__`` built only from string literals, other ``__all__`` lists or the table's keys."""
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    if [getattr(target, "id", None) for target in targets] != ["__all__"]:
        return False
    if node.value is None:
        return False
    for part in ast.walk(node.value):
        if isinstance(part, ast.Call):
            ok = isinstance(part.func, ast.Name) and part.func.id == "list" and len(part.args) == 1
            if not ok or not (isinstance(part.args[0], ast.Name) and part.args[0].id == "_EXPORTS"):
                return False
        elif not isinstance(
            part, (ast.List, ast.Constant, ast.Starred, ast.Name, ast.Load, ast.expr_context)
        ):
            return False
    return True


def _is_lazy_hook(node: ast.stmt) -> bool:
    """``__getattr__ = lazy_getattr(...)`` / ``__dir__ = lazy_dir(__all__)``: the table's readers."""
    if not (
        isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    ):
        return False
    call = node.value
    pairs = {"__getattr__": "lazy_getattr", "__dir__": "lazy_dir"}
    return (
        node.targets[0].id in pairs
        and isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == pairs[node.targets[0].id]
    )


def _logic(path: pathlib.Path) -> list[str]:
    """The statements of ``path`` that are not imports, ``__all__``, a docstring or the lazy table."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            found.append(f"line {node.lineno}: defines {getattr(node, 'name', 'a lambda')}")
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if _is_all(node) or _is_table(node) or _is_lazy_hook(node):
            continue
        if ast.unparse(node) == ALLOWED_STATEMENTS.get(path.stem):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def _length(path: pathlib.Path) -> int:
    """Lines of ``path`` outside its ``_EXPORTS`` table (the table has one line per name)."""
    tree = ast.parse(path.read_text())
    table = sum(node.end_lineno - node.lineno + 1 for node in tree.body if _is_table(node))
    return len(path.read_text().splitlines()) - table


def _owners(path: pathlib.Path) -> dict[str, str]:
    """Each re-exported name -> the module the address book says owns it."""
    tree = ast.parse(path.read_text())
    owners: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("accelerando."):
            for alias in node.names:
                if alias.name == "*":
                    owner = importlib.import_module(node.module)
                    owners.update(dict.fromkeys(owner.__all__, node.module))
                elif alias.name != "__all__":
                    owners[alias.asname or alias.name] = node.module
        elif _is_table(node):
            owners.update(ast.literal_eval(node.value))
    return owners


@pytest.mark.parametrize("path", _utils_modules(), ids=lambda path: path.stem)
def test_each_module_is_at_a_reference_path_and_holds_no_logic(path: pathlib.Path):
    if path.stem != "__init__":
        assert path.stem in _reference_utils_modules(), (
            f"accelerando/utils/{path.name} is not an accelerate.utils path of the reference: move the code to "
            "its owner (common/, a strategy, precision/, big_modeling/, launchers/...)"
        )
    assert _logic(path) == [], (
        f"{path.name} must only re-export (imports + __all__): move the logic to its owner"
    )
    assert _length(path) <= MAX_LINES, f"{path.name}: an address book stays short"


def test_utils_has_no_subpackages():
    folders = [child.name for child in UTILS.iterdir() if child.is_dir() and child.name != "__pycache__"]
    assert folders == [], "each reference path under accelerate.utils is a single module"


@pytest.mark.parametrize("path", _utils_modules(), ids=lambda path: path.stem)
def test_each_name_is_the_owners_object(path: pathlib.Path):
    module = importlib.import_module(_module_name(path))
    owners = _owners(path)
    for name in module.__all__:
        assert name in owners, f"{path.name} exports {name} without naming its owner"
        owner = owners[name]
        assert not owner.startswith("accelerando.utils"), f"{name}: owner {owner} is itself an address"
        assert getattr(module, name) is getattr(importlib.import_module(owner), name), (name, owner)


def _imports_utils(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(
            alias.name == "accelerando.utils" or alias.name.startswith("accelerando.utils.")
            for alias in node.names
        )
    if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "accelerando.utils" or node.module.startswith("accelerando.utils."):
            return True
        return node.module == "accelerando" and any(alias.name == "utils" for alias in node.names)
    return False


def test_nothing_inside_accelerando_imports_the_address_book():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if UTILS in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _imports_utils(node):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], f"import from the owner instead of accelerando.utils: {offenders}"


def test_deepspeed_plugin_loads_no_strategy_code():
    # The plugin once reached its config helper through accelerando.utils.deepspeed, whose package
    # imported the DeepSpeed strategy, which imports the plugin: constructing a plugin loaded strategies.
    script = (
        "import sys\n"
        "from accelerando.plugins.deepspeed import DeepSpeedPlugin\n"
        "plugin = DeepSpeedPlugin(hf_ds_config={'train_micro_batch_size_per_gpu': 1, 'zero_optimization': {'stage': 2}})\n"
        "assert plugin.hf_ds_config.get_value('zero_optimization.stage') == 2\n"
        "DeepSpeedPlugin()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('accelerando.backends.strategies', 'accelerando.utils'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_check_catches_logic(tmp_path: pathlib.Path):
    module = tmp_path / "other.py"
    module.write_text(
        '"""Doc."""\n\nfrom x import y\n\n__all__ = ["y"]\n\n\ndef helper():\n    return 1\n\n\nz = y + 1\n'
    )
    assert _logic(module) == ["line 8: defines helper", "line 8: def helper():", "line 12: z = y + 1"]
