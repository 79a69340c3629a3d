"""Placeholder at the reference's path for its check of checkpointing a transformers model trained on GLUE MRPC.

Needs evaluate, datasets, transformers and models or data from the Hugging Face Hub (downloads).
Without them it prints the reason and exits 0; see ``external_deps/__init__.py``.
"""

from __future__ import annotations

import os

from accelerando.test_utils.scripts.external_deps import missing_modules, run_or_skip

__all__ = ["main"]


def main() -> None:
    """Skip with the first unmet requirement, else report that the check is not provided."""
    unmet = [
        f"needs {name}, which is not installed"
        for name in missing_modules("evaluate", "datasets", "transformers")
    ]
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        unmet.append("needs models and data from the Hugging Face Hub; HF_HUB_OFFLINE is set")
    run_or_skip("test_checkpointing.py", unmet)


if __name__ == "__main__":
    main()
