"""Installing PyTorch/XLA on a hosted notebook (Google Colab, Kaggle) with a TPU attached."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

__all__ = ["install_xla"]


def _hosted_notebook() -> str | None:
    """Name the hosted notebook service this process runs in, if any."""
    if "google.colab" in sys.modules or any(k.startswith("COLAB_") for k in os.environ):
        return "Google Colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or "KAGGLE_URL_BASE" in os.environ:
        return "Kaggle"
    return None


def install_xla(upgrade: bool = False) -> None:
    """Install the ``torch_xla`` release that matches the installed torch, on Colab or Kaggle.

    Runs ``python -m pip install`` for ``torch_xla[tpu]`` at torch's own version (releases of the two
    are numbered alike). With ``upgrade``, torch is upgraded first and the newest ``torch_xla`` is
    installed with it.

    Args:
        upgrade: upgrade torch and install the latest ``torch_xla`` instead of the matching one.

    Raises:
        RuntimeError: outside Google Colab and Kaggle (install torch_xla yourself there, following
            the PyTorch/XLA instructions for your machine), or when pip fails.
    """
    where = _hosted_notebook()
    if where is None:
        raise RuntimeError(
            "install_xla only installs torch_xla on Google Colab and Kaggle notebooks. Elsewhere install it "
            "yourself: `pip install torch_xla[tpu]` at the version of your torch."
        )
    pip = [sys.executable, "-m", "pip", "install"]
    if upgrade:
        commands = [[*pip, "--upgrade", "torch"], [*pip, "--upgrade", "torch_xla[tpu]"]]
    else:
        torch_version = importlib.metadata.version("torch").split("+")[0]
        commands = [[*pip, f"torch_xla[tpu]=={torch_version}"]]
    for command in commands:
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"Installing torch_xla on {where} failed: `{' '.join(command)}` exited with "
                f"{result.returncode}. Its output above says why."
            )
