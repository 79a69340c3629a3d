"""The ``accelerate`` names that installed libraries use, found with ``ast``, and whether each resolves.

Used by ``test_accelerate_names_resolve.py``: ``collect(paths)`` walks Python sources (in the test
process; nothing is imported), and running this file resolves the collected names in a fresh
interpreter, either on the real ``accelerate`` (``--side reference``) or on accelerando through
``install_as_accelerate()`` (``--side accelerando``), so the stand-in never enters the test process.

What counts as a use (a ``Use``'s ``kind`` and ``path``):

- ``import``: ``import accelerate.x.y`` -> the module ``accelerate.x.y``;
- ``from``: ``from accelerate.x import y`` -> ``accelerate.x:y`` (an attribute or a submodule);
- ``chain``: ``accelerate.x.y`` written as attributes of a name bound by one of those imports
  (``import accelerate`` then ``accelerate.utils.foo``; ``from accelerate import utils`` then
  ``utils.foo``), resolved as ``mock.patch`` resolves a target (``pkgutil.resolve_name``);
- ``string``: a string constant that is a dotted ``accelerate.`` path (``mock.patch("accelerate.x.y")``);
- ``accelerator``: ``accelerator.NAME`` or ``<anything>.accelerator.NAME``: an attribute of an
  ``Accelerator`` (checked on an instance built on the CPU).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pkgutil
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

ROOT = "accelerate"
_DOTTED = re.compile(r"^accelerate(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class Use(NamedTuple):
    """One use of an ``accelerate`` name: its kind, the path it resolves to, and where it was seen."""

    kind: str
    path: str
    where: str


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``, or None when the chain does not start at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


class _Collector(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.aliases: dict[str, str] = {}  # local name -> dotted accelerate path
        self.uses: list[Use] = []

    def add(self, kind: str, path: str, node: ast.AST) -> None:
        self.uses.append(Use(kind, path, f"{self.where}:{getattr(node, 'lineno', 0)}"))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                self.add("import", alias.name, node)
                # `import accelerate.x` binds `accelerate`; `import accelerate.x as y` binds y.
                local = alias.asname or ROOT
                self.aliases[local] = alias.name if alias.asname else ROOT

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and (module == ROOT or module.startswith(ROOT + ".")):
            for alias in node.names:
                if alias.name == "*":
                    continue
                self.add("from", f"{module}:{alias.name}", node)
                self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = _chain(node)
        if parts is not None and parts[0] in self.aliases:
            self.add("chain", ".".join([self.aliases[parts[0]], *parts[1:]]), node)
            return
        if parts is not None and len(parts) >= 2 and parts[-2] == "accelerator":
            self.add("accelerator", parts[-1], node)
        elif isinstance(node.value, ast.Attribute) and node.value.attr == "accelerator":
            self.add("accelerator", node.attr, node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and _DOTTED.match(node.value):
            self.add("string", node.value, node)


def _mentions(path: Path) -> str | None:
    """The file's text when it mentions accelerate at all (most files do not: skip parsing them)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if ROOT in text else None


def collect(roots: Iterable[Path]) -> list[Use]:
    """Every use of an ``accelerate`` name in the ``.py`` files under ``roots`` (see the module docstring)."""
    uses: list[Use] = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            text = _mentions(path)
            if text is None:
                continue
            try:
                tree = ast.parse(text, filename=str(path))
            except SyntaxError:
                continue
            collector = _Collector(f"{root.parent.name}/{root.name}/{path.relative_to(root)}")
            collector.visit(tree)
            # The module-level aliases are known only once the whole file is read: a second pass
            # catches chains written above the import that binds them (imports inside functions).
            late = _Collector(collector.where)
            late.aliases = dict(collector.aliases)
            late.visit(tree)
            uses.extend(late.uses)
    return uses


def _resolve(kind: str, path: str, accelerator: object) -> str | None:
    """None when ``path`` resolves, else the error (type and message) it raised."""
    try:
        if kind == "import":
            importlib.import_module(path)
        elif kind == "from":
            module, _, name = path.partition(":")
            found = importlib.import_module(module)
            if not hasattr(found, name):
                importlib.import_module(f"{module}.{name}")
        elif kind == "accelerator":
            getattr(accelerator, path)
        else:
            pkgutil.resolve_name(path)
    except Exception as error:  # noqa: BLE001 - any failure to resolve is the observation
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    return None


def record(roots: list[Path]) -> str:
    """The lines of ``accelerate_names_outside_packages.txt`` for the sources under ``roots``:
    ``kind path  # first place seen``, one per distinct use, sorted.
    """
    first: dict[tuple[str, str], str] = {}
    for use in collect(roots):
        first.setdefault((use.kind, use.path), use.where)
    return "".join(f"{kind} {path}  # {where}\n" for (kind, path), where in sorted(first.items()))


def main() -> None:
    """``--side S --uses FILE``: resolve the uses listed in FILE (JSON ``[[kind, path], ...]``) and
    print ``{"kind path": error or null}``; ``--record FOLDER...``: print the record lines for FOLDERs.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["reference", "accelerando"])
    parser.add_argument("--uses", type=Path)
    parser.add_argument("--record", type=Path, nargs="+")
    args = parser.parse_args()
    if args.record:
        sys.stdout.write(record(args.record))
        return
    if args.side == "accelerando":
        import accelerando

        accelerando.install_as_accelerate()
    import accelerate

    stand_in = getattr(accelerate, "__file__", "") or ""
    assert ("accelerando" in stand_in) == (args.side == "accelerando"), stand_in
    accelerator = accelerate.Accelerator(cpu=True)
    uses = json.loads(args.uses.read_text())
    json.dump({f"{kind} {path}": _resolve(kind, path, accelerator) for kind, path in uses}, sys.stdout)


if __name__ == "__main__":
    main()
