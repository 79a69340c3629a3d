"""Check that "complete" example scripts contain every feature their by-feature counterparts add.

The reference's repository keeps a plain example (``examples/nlp_example.py``), one script per feature
(``examples/by_feature/*.py``) and "complete" scripts combining them. ``compare_against_test`` returns
the lines a feature script adds to the plain example that the complete script lacks; an empty list
means the complete script is up to date.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASELINE_EXAMPLE", "clean_lines", "compare_against_test", "get_function_contents_by_name"]

#: The plain example every feature script is compared with (relative to the working directory).
BASELINE_EXAMPLE = Path("examples", "nlp_example.py")


def get_function_contents_by_name(lines: list[str], name: str) -> list[str]:
    """Return the lines of the top-level function ``name``: its ``def`` line and its body.

    The body ends at the next top-level statement (a non-blank line without indentation that is not a
    comment), so blank lines and comments inside it are kept.

    Args:
        lines: a source file's lines (as ``readlines`` gives them).
        name: the function's name, e.g. ``"training_function"`` or ``"main"``.

    Raises:
        ValueError: no top-level ``def name(`` in ``lines``.
    """
    start = None
    for index, line in enumerate(lines):
        if line.startswith((f"def {name}(", f"async def {name}(")):
            start = index
            break
    if start is None:
        raise ValueError(
            f"No top-level function {name!r} found; the example scripts define it with `def {name}(`."
        )
    body = [lines[start]]
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if (
            stripped
            and not line[0].isspace()
            and not stripped.startswith("#")
            and not stripped.startswith(")")
        ):
            break
        body.append(line)
    return body


def clean_lines(lines: list[str]) -> list[str]:
    """Drop blank lines and leading indentation, so lines compare regardless of nesting depth."""
    return [line.lstrip() for line in lines if line.strip()]


def _function_lines(path: str | Path, name: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return clean_lines(get_function_contents_by_name(handle.readlines(), name))


def compare_against_test(
    base_filename: str,
    feature_filename: str,
    parser_only: bool,
    secondary_filename: str | None = None,
) -> list[str]:
    """List the lines a feature script adds that the complete script ``base_filename`` is missing.

    The compared function is ``main`` when ``parser_only`` (the argument parsing) and
    ``training_function`` otherwise. A line of the feature script's function counts as added when it is
    absent from the same function in ``examples/nlp_example.py`` (relative to the working directory);
    it is reported when it is also absent from ``base_filename`` (and from ``secondary_filename``,
    when given).

    Args:
        base_filename: the complete example to check.
        feature_filename: the by-feature script whose additions must be present.
        parser_only: compare ``main`` instead of ``training_function``.
        secondary_filename: another script whose lines also count as present.

    Returns:
        The missing lines (stripped of indentation), in the feature script's order; empty when none.

    Raises:
        FileNotFoundError: a script, or ``examples/nlp_example.py``, does not exist.
        ValueError: a script lacks the compared function.
    """
    function = "main" if parser_only else "training_function"
    if not BASELINE_EXAMPLE.is_file():
        raise FileNotFoundError(
            f"{BASELINE_EXAMPLE} not found under {Path.cwd()}; run from the folder holding `examples/`."
        )
    baseline = set(_function_lines(BASELINE_EXAMPLE, function))
    present = set(_function_lines(base_filename, function))
    if secondary_filename is not None:
        present |= set(_function_lines(secondary_filename, function))
    feature = _function_lines(feature_filename, function)
    return [line for line in feature if line not in baseline and line not in present]
