"""What Megatron-LM training needs (megatron-core and CUDA) and the error raised when it is missing."""

from __future__ import annotations

from typing import NoReturn

__all__ = [
    "MEGATRON_ALTERNATIVES",
    "MegatronLMUnavailableError",
    "megatron_core_missing",
    "refuse_megatron",
]

MEGATRON_ALTERNATIVES = (
    "torch-native alternatives that run without megatron-core: tensor parallelism with "
    "Accelerator(parallelism_config=ParallelismConfig(tp_size=...)), pipeline parallelism with "
    "Accelerator(kwargs_handlers=[PipelineParallelPlugin(...)]) from accelerando.plugins.pipeline"
)


class MegatronLMUnavailableError(ImportError, RuntimeError, ValueError):
    """Megatron-LM was asked for where it cannot run (megatron-core missing, or no CUDA GPU).

    It is an ``ImportError`` (the package is missing), a ``RuntimeError`` (no CUDA device) and a
    ``ValueError`` (a layout this machine cannot run), so any of those ``except`` clauses catches it.
    """


def megatron_core_missing() -> bool:
    """True when ``megatron.core`` cannot be imported."""
    from accelerando.utils.imports import is_megatron_lm_available

    return not is_megatron_lm_available()


def refuse_megatron(what: str) -> NoReturn:
    """Refuse ``what``, naming whichever of megatron-core and CUDA is missing (always raises).

    Args:
        what: the feature asked for, named in the message (e.g. ``"MegatronEngine"``).

    Raises:
        MegatronLMUnavailableError: always; the message names what is missing (megatron-core, CUDA)
            or, with both present, that accelerando does not drive megatron-core yet, and the
            torch-native alternatives.
    """
    import torch

    missing = []
    if megatron_core_missing():
        missing.append("megatron-core is not installed (pip install megatron-core)")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is available (megatron-core's fused kernels and NCCL groups need one)")
    if missing:
        raise MegatronLMUnavailableError(
            f"{what} needs megatron-core and CUDA GPUs: {'; '.join(missing)}. Use the {MEGATRON_ALTERNATIVES}."
        )
    raise MegatronLMUnavailableError(
        f"{what}: megatron-core and CUDA are present, but accelerando does not drive megatron-core's model, "
        f"optimizer and engine construction yet. Use the {MEGATRON_ALTERNATIVES}."
    )
