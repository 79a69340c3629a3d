"""Import budgets: the modules the first Accelerator loads, the deferred imports, the package root.

Imports sit at module level by default. An import of an accelerando module inside a function body
is allowed only when it is listed, with its one-line reason, in ``deferred_imports.txt`` next to
this file: an optional library behind it, a backend or subcommand chosen at run time, or a measured
cost on the first-Accelerator path (``from accelerando import Accelerator; Accelerator()``).
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "accelerando"
ALLOW_LIST = pathlib.Path(__file__).with_name("deferred_imports.txt")

# Ceilings: lower them when the code gets smaller; raise one only with a measured reason
# (python benchmarks/compare_reference.py --only first before and after).
# 52: lowered from 62 by issue 43, which re-based start-up on what a user notices: the deferrals that
# saved the launcher milliseconds moved to the top of their modules; those left keep optional
# libraries and torch out of the paths that must not load them, or keep the first Accelerator()
# within 0.5x the reference's CPU time.
# 59: the seven imports of one launch mode (multi-process rendezvous, watchdog and preflight;
# --fault_tolerance; --ray; --parallelism auto) went back into the functions of that mode: with them at
# module level a one-process launch measured +0.38 s over `python script.py` (budget +0.15 s).
MAX_DEFERRED_IMPORTS = 60  # 59 + the checkpoint conversions of issue 44 (strategies/base.py)
MAX_FIRST_ACCELERATOR_MODULES = 55
# The package root: the reference's root module paths (as modules or packages) plus five of our own.
MAX_ROOT_ENTRIES = 25
REFERENCE_ROOT_PATHS = {
    "__init__",
    "__main__",
    "accelerator",
    "big_modeling",
    "checkpointing",
    "commands",
    "data_loader",
    "hooks",
    "inference",
    "launchers",
    "local_sgd",
    "logging",
    "memory_utils",
    "optimizer",
    "parallelism_config",
    "scheduler",
    "state",
    "test_utils",
    "tracking",
    "utils",
}
OUR_ROOT_PACKAGES = {"core", "common", "plugins", "backends", "facade"}


def _module_name(path: pathlib.Path) -> tuple[str, bool]:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imported_modules(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]
) -> set[str]:
    """The accelerando modules an import statement loads (a ``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
    resolved = set()
    for name in names:
        if name.split(".")[0] != "accelerando":
            continue
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        resolved.add(name)
    return resolved


def _function_imports(
    node: ast.AST, function: str | None, module: str, is_package: bool, known: set[str], found: set[str]
) -> None:
    for child in ast.iter_child_nodes(node):
        inner = function
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = f"{function}.{child.name}" if function else child.name
        elif isinstance(child, ast.ClassDef) and function:
            inner = f"{function}.{child.name}"
        if inner and isinstance(child, (ast.Import, ast.ImportFrom)):
            for target in _imported_modules(child, module, is_package, known):
                found.add(f"{module}:{inner} -> {target}")
        _function_imports(child, inner, module, is_package, known, found)


def deferred_imports() -> set[str]:
    """Every ``module:function -> target`` where a function body imports an accelerando module."""
    files = {_module_name(p)[0]: p for p in PACKAGE.rglob("*.py")}
    found: set[str] = set()
    for module, path in files.items():
        _function_imports(
            ast.parse(path.read_text()), None, module, path.name == "__init__.py", set(files), found
        )
    return found


def allow_list() -> dict[str, str]:
    """The allow-list file as ``{entry: reason}``."""
    entries: dict[str, str] = {}
    for line in ALLOW_LIST.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        entry, _, reason = line.partition("#")
        entries[entry.strip()] = reason.strip()
    return entries


def test_every_deferred_import_is_listed_with_a_reason():
    found, listed = deferred_imports(), allow_list()
    unlisted = sorted(found - set(listed))
    assert not unlisted, (
        "imports inside function bodies that deferred_imports.txt does not list (move each to the top of "
        "its module, or list it there with the reason it must wait):\n" + "\n".join(unlisted)
    )
    stale = sorted(set(listed) - found)
    assert not stale, "deferred_imports.txt lists imports that are gone (remove the lines):\n" + "\n".join(
        stale
    )
    assert all(listed.values()), [entry for entry, reason in listed.items() if not reason]


def test_deferred_imports_stay_few():
    assert len(allow_list()) <= MAX_DEFERRED_IMPORTS


def test_the_lister_sees_a_new_deferred_import(tmp_path: pathlib.Path):
    module = PACKAGE / "_budget_probe_tmp.py"
    module.write_text(
        "def late():\n    from accelerando.core.version import __version__\n    return __version__\n"
    )
    try:
        assert "accelerando._budget_probe_tmp:late -> accelerando.core.version" in deferred_imports()
    finally:
        module.unlink()


def test_first_accelerator_module_count():
    code = (
        "import json, sys, torch\n"
        "before = set(sys.modules)\n"
        "from accelerando import Accelerator\n"
        "Accelerator()\n"
        "added = sorted(set(sys.modules) - before)\n"
        "print(json.dumps(added))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)}
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    added = json.loads(completed.stdout.strip().splitlines()[-1])
    ours = [name for name in added if name.split(".")[0] == "accelerando"]
    assert len(ours) <= MAX_FIRST_ACCELERATOR_MODULES, (
        f"from accelerando import Accelerator; Accelerator() loads {len(ours)} accelerando modules "
        f"(ceiling {MAX_FIRST_ACCELERATOR_MODULES}): {ours}"
    )
    # Nothing else but the standard library and our required dependencies.
    others = {name.split(".")[0] for name in added} - {"accelerando"}
    assert others <= set(sys.stdlib_module_names) | {"packaging", "yaml", "_yaml", "psutil", "numpy"}, others


def _root_entries() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if p.name not in {"__pycache__", "py.typed"})


def test_the_root_holds_the_reference_paths_and_five_packages_of_ours():
    entries = _root_entries()
    names = {pathlib.Path(entry).stem for entry in entries}
    assert names - REFERENCE_ROOT_PATHS <= OUR_ROOT_PACKAGES, (
        f"new entries at src/accelerando: {sorted(names - REFERENCE_ROOT_PATHS - OUR_ROOT_PACKAGES)}; put a new "
        "module inside the package that owns it (docs/concepts/source-layout.md)"
    )
    assert len(entries) <= MAX_ROOT_ENTRIES, (len(entries), entries)
