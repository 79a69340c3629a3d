"""Compare accelerando's public surface with the reference's, listed in ``reference-surface.txt``.

``reference-surface.txt`` (beside this file) is the reference's public surface (Hugging Face
Accelerate, the release named in its first line): one ``## accelerate.X`` block per module, listing
functions (``name(params)``), classes (``class Name(params)`` and their members, indented) and
constants (``NAME = value``). For each block this module imports ``accelerando.X`` and reports a gap
for each listed name that is missing, each reference parameter a function, method or constructor
does not accept (extra parameters and ``**kwargs`` are fine) and each constant whose value differs.

Run as a script (``python tests/parity/surface.py``) it prints the gaps as a JSON list, one string per
gap, ``"<subject>: <what differs>"``; :mod:`tests.parity.test_surface_parity` runs it in a fresh
interpreter (importing every module of the package must not touch the test process).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SURFACE = Path(__file__).with_name("reference-surface.txt")
#: The home folder of the machine that recorded the surface: constants that are paths under a home
#: folder (``~/.cache/huggingface``) are compared under this machine's home instead.
RECORDED_HOME = "/root"


@dataclass
class Item:
    """One public name of a reference module.

    Attributes:
        kind: ``"func"``, ``"class"`` or ``"const"``.
        name: the name in its module.
        text: the printed signature (functions, class constructors) or the value's ``repr`` (constants).
        members: a class's public members as printed (``name(self, a)``, ``name  [property]``,
            ``name = value``).
    """

    kind: str
    name: str
    text: str = ""
    members: list[str] = field(default_factory=list)


_CLASS = re.compile(r"class (\w+)(\(.*\))?( -> .*)?$")
_FUNC = re.compile(r"(\w+)(\(.*\))( -> .*)?$")
_CONST = re.compile(r"(\w+) = (.*)$")


def parse_surface(text: str) -> dict[str, list[Item]]:
    """The modules of a surface listing and their items; modules marked "not importable" are left out."""
    modules: dict[str, list[Item]] = {}
    items: list[Item] | None = None
    owner: Item | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].split()[0]
            items = None if "not importable" in line else modules.setdefault(name, [])
            owner = None
            continue
        if items is None or not line.strip() or line.startswith("#"):
            continue
        if line.startswith("    "):
            if owner is not None:
                owner.members.append(line.strip())
            continue
        owner = None
        if match := _CLASS.match(line):
            owner = Item("class", match.group(1), match.group(2) or "")
            items.append(owner)
        elif match := _CONST.match(line):
            items.append(Item("const", match.group(1), match.group(2)))
        elif match := _FUNC.match(line):
            items.append(Item("func", match.group(1), match.group(2)))
    return modules


def parameter_names(signature: str) -> list[str]:
    """The named parameters of a printed signature ``(a, b: int = 1, *args, c=2, **kw) -> X``.

    ``self``, ``cls``, the ``/`` and ``*`` markers and ``*args`` / ``**kwargs`` are left out.
    """
    inner = signature.split(" -> ")[0].strip()
    if inner in ("(...)", "()"):
        return []
    parts, depth, token = [], 0, ""
    for char in inner[1:-1]:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(token)
            token = ""
        else:
            token += char
    parts.append(token)
    names = []
    for part in parts:
        name = part.strip().split(":")[0].split("=")[0].strip()
        if name and name not in ("/", "*", "self", "cls") and not name.startswith("*"):
            names.append(name)
    return names


def missing_parameters(obj: Any, wanted: list[str]) -> list[str]:
    """The names of ``wanted`` that ``obj`` does not accept (none when it takes ``**kwargs`` or has no
    signature to read)."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [name for name in wanted if name not in parameters]


def _here(value: Any) -> Any:
    """A recorded value with the recording machine's home folder replaced by this machine's."""
    home = os.path.expanduser("~")
    if isinstance(value, str) and value.startswith(RECORDED_HOME + "/"):
        return home + value[len(RECORDED_HOME) :]
    return value


def _constant_gap(obj: Any, text: str) -> str | None:
    try:
        want = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None  # not a literal (an object's repr): only its presence is checked
    if obj == want or obj == _here(want) or (isinstance(want, list) and list(obj or []) == want):
        return None
    return f"value {obj!r}, reference {text}"


def _class_gaps(prefix: str, cls: Any, item: Item) -> list[str]:
    gaps = []
    if item.text and (missing := missing_parameters(cls, parameter_names(item.text))):
        gaps.append(f"{prefix}(): no parameter {', '.join(missing)}")
    for member in item.members:
        name = re.match(r"\w+", member)
        if name is None:
            continue
        if not hasattr(cls, name.group(0)):
            gaps.append(f"{prefix}.{name.group(0)}: missing")
            continue
        signature = member[len(name.group(0)) :].split("  [")[0]
        if signature.startswith("(") and "[property]" not in member:
            missing = missing_parameters(getattr(cls, name.group(0)), parameter_names(signature))
            if missing:
                gaps.append(f"{prefix}.{name.group(0)}: no parameter {', '.join(missing)}")
    return gaps


def module_gaps(reference_module: str, items: list[Item], package: str = "accelerando") -> list[str]:
    """The gaps of one reference module's items in ours (``accelerate.X`` -> ``<package>.X``)."""
    ours = package + reference_module[len("accelerate") :]
    try:
        module = importlib.import_module(ours)
    except Exception as err:  # noqa: BLE001 - any import failure is the gap
        return [f"{ours}: module not importable ({type(err).__name__}: {str(err)[:80]})"]
    gaps = []
    for item in items:
        subject = f"{ours}.{item.name}"
        if not hasattr(module, item.name):
            gaps.append(f"{subject}: missing")
            continue
        obj = getattr(module, item.name)
        if item.kind == "func":
            if missing := missing_parameters(obj, parameter_names(item.text)):
                gaps.append(f"{subject}: no parameter {', '.join(missing)}")
        elif item.kind == "const":
            if (difference := _constant_gap(obj, item.text)) is not None:
                gaps.append(f"{subject}: {difference}")
        else:
            gaps += _class_gaps(subject, obj, item)
    return list(dict.fromkeys(gaps))


def surface_gaps(surface: Path = SURFACE, package: str = "accelerando") -> list[str]:
    """Every gap between ``package`` and the reference surface listed in ``surface``."""
    modules = parse_surface(surface.read_text(encoding="utf-8"))
    return [gap for name, items in modules.items() for gap in module_gaps(name, items, package)]


def surface_size(surface: Path = SURFACE) -> int:
    """How many items (names and class members) the surface lists."""
    modules = parse_surface(surface.read_text(encoding="utf-8"))
    return sum(1 + len(item.members) for items in modules.values() for item in items)


if __name__ == "__main__":
    json.dump(surface_gaps(), sys.stdout, indent=0)
    sys.stdout.write("\n")
