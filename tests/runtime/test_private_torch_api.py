"""Every use of a private torch API in src/ cites the upstream line it relies on (issue 43 item 7).

A private torch name (a module, function, class or attribute whose path has a component starting
with ``_``) can change in any torch release without notice. Each use carries a comment within two
lines of it, ``# torch 2.13: torch/<file>.py:<line> (private; what we use it for)``, so that a torch
upgrade knows where to look. The comment names the pinned version; when it is the installed one,
the cited file must exist in the installed torch and have that many lines.

Found (AST, not grep): imports from a torch module with a private component or of a private name;
attribute chains on a torch module alias with a private component (``torch.cuda.memory._dump_snapshot``,
``dist.distributed_c10d._get_default_group``, ``DeviceMesh._concatenate``); ``getattr`` of a private
name on a torch module; and the private attributes of torch objects listed in PRIVATE_ATTRIBUTES.
Not counted: ``nn.Module``'s own dictionaries (``_parameters``, ``_buffers``, ``_modules``), read
the way every library reads them.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

import torch

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "accelerando"
TORCH_ROOT = pathlib.Path(torch.__file__).resolve().parent.parent
PINNED = "2.13"
MARKER = f"torch {PINNED}:"
CITATION = re.compile(r"\b(torch/[\w/]+\.py):(\d+)")

# Private attributes of torch objects we read or set, by name (the object is not a module alias).
PRIVATE_ATTRIBUTES = {
    "_orig_mod",  # torch.compile's OptimizedModule: the compiled module
    "_per_optimizer_states",  # GradScaler: per-optimizer unscale / found-inf state
    "_flatten",  # DeviceMesh: flatten axes into one named axis
    "_step_count",  # LRScheduler: steps taken
}


def _private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def _torch_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to public torch modules or objects, to their dotted torch path."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "torch":
                continue
            for alias in node.names:
                if not _private([*node.module.split("."), alias.name]):
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _chain(node: ast.expr) -> tuple[str | None, list[str]]:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), names[::-1]


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for every private torch API use in one module's source."""
    tree = ast.parse(source)
    aliases = _torch_aliases(tree)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [a.name for a in node.names]
            if node.module.split(".")[0] == "torch" and _private([*node.module.split("."), *names]):
                yield node.lineno, f"from {node.module} import {', '.join(names)}"
        elif isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute):
            root, names = _chain(node)
            if root in aliases and _private(names):
                yield node.lineno, ".".join([aliases[root], *names])
            elif names and names[-1] in PRIVATE_ATTRIBUTES:
                yield node.lineno, f"<object>.{names[-1]}"
            elif root not in aliases and any(n in PRIVATE_ATTRIBUTES for n in names):
                yield node.lineno, f"<object>.{'.'.join(names)}"
        elif isinstance(node, ast.Call) and (name := _private_getattr(node, aliases)) is not None:
            yield node.lineno, f"getattr(..., {name!r})"


def _private_getattr(node: ast.Call, aliases: dict[str, str]) -> str | None:
    """The private name a ``getattr`` / ``setattr`` / ``hasattr`` call reads on a torch object, or None."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr")):
        return None
    if len(node.args) < 2:
        return None
    target, name = node.args[0], node.args[1]
    text = name.value if isinstance(name, ast.Constant) else None
    if isinstance(name, ast.JoinedStr) and name.values and isinstance(name.values[0], ast.Constant):
        text = name.values[0].value  # f"_is_mkldnn_{dtype}_supported"
    if not isinstance(text, str):
        return None
    root, _ = _chain(target)
    return text if (root in aliases and _private([text])) or text in PRIVATE_ATTRIBUTES else None


def _sites() -> list[tuple[pathlib.Path, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        found += [(path, line, what) for line, what in sorted(set(private_uses(path.read_text())))]
    return found


def test_the_finder_sees_each_kind_of_use():
    source = (
        "import torch\n"
        "import torch.distributed as dist\n"
        "from torch.distributed.device_mesh import DeviceMesh\n"
        "from torch._utils import _flatten_dense_tensors\n"
        "from torch.utils._pytree import tree_map\n"
        "torch.cuda.memory._dump_snapshot('x')\n"
        "dist.distributed_c10d._get_default_group()\n"
        "DeviceMesh._concatenate\n"
        "model._orig_mod\n"
        "getattr(torch.ops.mkldnn, f'_is_{x}')\n"
        "torch.cuda.memory.snapshot()\n"
        "self._private_of_ours\n"
    )
    lines = sorted(line for line, _ in private_uses(source))
    assert lines == [4, 5, 6, 7, 8, 9, 10]


def test_every_private_torch_use_cites_its_upstream_line():
    missing = []
    for path, line, what in _sites():
        lines = path.read_text().splitlines()
        window = lines[max(0, line - 3) : line + 2]  # two lines either side
        if not any(MARKER in text for text in window):
            missing.append(f"{path.relative_to(SRC)}:{line}: {what}")
    assert not missing, (
        f"private torch API without a '# {MARKER} torch/<file>.py:<line> (private; why)' comment "
        "within 2 lines:\n" + "\n".join(missing)
    )


def test_there_are_private_uses_to_check():
    # A finder that silently finds nothing would pass the test above; about 60 sites today.
    assert len(_sites()) >= 40


def test_citations_point_at_real_lines_of_the_installed_torch():
    if not torch.__version__.startswith(PINNED + "."):
        return  # the citations are for the pinned version
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        for number, text in enumerate(path.read_text().splitlines(), 1):
            comment = text.partition("#")[2]
            if MARKER not in comment:
                continue
            for match in CITATION.finditer(comment.partition(MARKER)[2]):
                cited, cited_line = TORCH_ROOT / match.group(1), int(match.group(2))
                if not cited.is_file() or cited_line > len(cited.read_text().splitlines()):
                    wrong.append(f"{path.relative_to(SRC)}:{number}: {match.group(1)}:{cited_line}")
    assert not wrong, "citations of torch lines that do not exist:\n" + "\n".join(wrong)
