"""What Megatron-LM training needs (megatron-core and CUDA) and the error raised when it is missing."""

from __future__ import annotations

from typing import NoReturn

from accelerando.common.imports import is_megatron_lm_available

__all__ = [
    "MEGATRON_ALTERNATIVES",
    "MegatronLMUnavailableError",
    "megatron_core_missing",
    "refuse_megatron",
    "require_cuda",
    "require_megatron_and_cuda",
    "require_megatron_core",
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
    return not is_megatron_lm_available()


def _missing() -> list[str]:
    import torch

    missing = []
    if megatron_core_missing():
        missing.append("megatron-core is not installed (pip install megatron-core)")
    if not torch.cuda.is_available():
        missing.append(
            "no CUDA GPU is available (megatron-core's DDP buffers, RNG tracker and kernels need one)"
        )
    return missing


def refuse_megatron(what: str) -> NoReturn:
    """Refuse ``what``, naming whichever of megatron-core and CUDA is missing (always raises).

    Args:
        what: the feature asked for, named in the message (e.g. ``"MegatronEngine"``).

    Raises:
        MegatronLMUnavailableError: always; the message names what is missing (megatron-core, CUDA)
            and the torch-native alternatives.
    """
    missing = _missing() or ["it cannot run in this configuration"]
    raise MegatronLMUnavailableError(
        f"{what} needs megatron-core and CUDA GPUs: {'; '.join(missing)}. Use the {MEGATRON_ALTERNATIVES}."
    )


def require_megatron_and_cuda(what: str) -> None:
    """Return when megatron-core and a CUDA GPU are both present, else refuse ``what`` (see :func:`refuse_megatron`).

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing.
    """
    if _missing():
        refuse_megatron(what)


def require_megatron_core(what: str) -> None:
    """Return when megatron-core is importable, else refuse ``what`` naming the install command.

    Raises:
        MegatronLMUnavailableError: megatron-core is missing.
    """
    if megatron_core_missing():
        refuse_megatron(what)


def require_cuda(what: str) -> None:
    """Return when a CUDA GPU is available, else refuse ``what``: megatron-core trains on CUDA only.

    Raises:
        MegatronLMUnavailableError: no CUDA GPU.
    """
    import torch

    if not torch.cuda.is_available():
        refuse_megatron(what)
