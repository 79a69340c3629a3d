"""FP8 training: needs a CUDA GPU with FP8 support and an FP8 backend (Transformer Engine, torchao, MS-AMP).

Not implemented yet (it is its own issue); requesting it fails clearly instead of silently training in
another precision.
"""

from __future__ import annotations

from accelerando.precision.base import Precision

__all__ = ["build_fp8_precision"]


def build_fp8_precision(device_type: str) -> Precision:
    """Refuse FP8 with a message saying what is needed.

    Raises:
        NotImplementedError: always for now; on CPU it also says that FP8 needs a CUDA GPU.
    """
    if device_type != "cuda":
        raise NotImplementedError(
            "mixed_precision='fp8' needs a CUDA GPU with FP8 support (Hopper or newer) and "
            "transformer-engine or torchao; on this machine use mixed_precision='bf16'"
        )
    raise NotImplementedError(
        "mixed_precision='fp8' is not supported by accelerando yet; use mixed_precision='bf16'"
    )
