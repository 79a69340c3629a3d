"""Placeholder at the reference's path for its check of pipeline-parallel inference of transformers models.

Needs transformers, 2 CUDA device(s).
Without them it prints the reason and exits 0; see ``external_deps/__init__.py``.
"""

from __future__ import annotations

from accelerando.test_utils.scripts.external_deps import cuda_devices, missing_modules, run_or_skip

__all__ = ["main"]


def main() -> None:
    """Skip with the first unmet requirement, else report that the check is not provided."""
    unmet = [f"needs {name}, which is not installed" for name in missing_modules("transformers")]
    if cuda_devices() < 2:
        unmet.append(f"needs 2 CUDA device(s), found {cuda_devices()}")
    run_or_skip("test_pippy.py", unmet)


if __name__ == "__main__":
    main()
