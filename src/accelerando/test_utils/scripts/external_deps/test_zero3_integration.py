"""Placeholder at the reference's path for its check of DeepSpeed ZeRO-3 with transformers.

Not provided (see ``external_deps/__init__.py``): prints why it checks nothing and exits 1.
"""

from __future__ import annotations

from accelerando.test_utils.scripts.external_deps import not_provided

__all__ = ["main"]


def main() -> None:
    """Print why this check does not run here and exit 1 (never a pass it did not earn)."""
    not_provided(__file__)


if __name__ == "__main__":
    main()
