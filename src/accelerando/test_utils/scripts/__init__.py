"""Scripts run by ``accelerando test`` (each is a standalone program for ``accelerando launch``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["script_path"]


def script_path(name: str = "test_script.py") -> Path:
    """Return the path of a bundled check script.

    Args:
        name: file name inside this package.

    Returns:
        The script's absolute path.

    Raises:
        FileNotFoundError: when no such script is bundled.
    """
    path = Path(__file__).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(f"No bundled script {name!r} in {path.parent}.")
    return path
