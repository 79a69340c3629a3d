"""Every file in ``src/`` stays at most 600 lines of code (docstrings, comments and blank lines aside).

A file past that is split by subject into a package behind the same import path (DESIGN.md, "Rules
that keep it that way"); the few that are not yet are named in :data:`ALLOWED` with the reason.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "accelerando"
MAX_CODE_LINES = 600

# Files allowed past the limit, each with its reason. Remove a line when its file is split.
ALLOWED: dict[str, str] = {}


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def code_lines(text: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings = _docstring_lines(ast.parse(text))
    lines: set[int] = set()
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip:
            lines.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(lines)


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE.parent)): code_lines(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_code_lines_counts_code_only() -> None:
    text = '"""Doc\n\nmore."""\n\n# a comment\nx = 1  # trailing\n\n\ndef f():\n    """Doc."""\n    return (\n        x\n    )\n'
    assert code_lines(text) == 5  # x = 1, def, return (, x, )


def test_every_file_is_at_most_600_code_lines() -> None:
    over = {path: size for path, size in _sizes().items() if size > MAX_CODE_LINES and path not in ALLOWED}
    assert not over, (
        f"files over {MAX_CODE_LINES} lines of code: {over}. Split each by subject into a package behind the "
        "same import path, or name it in ALLOWED (tests/runtime/test_file_sizes.py) with the reason."
    )


def test_the_allow_list_has_reasons_and_no_stale_entries() -> None:
    sizes = _sizes()
    assert all(ALLOWED.values()), [path for path, reason in ALLOWED.items() if not reason]
    stale = [path for path in ALLOWED if sizes.get(path, 0) <= MAX_CODE_LINES]
    assert not stale, f"no longer over the limit (remove from ALLOWED): {stale}"
