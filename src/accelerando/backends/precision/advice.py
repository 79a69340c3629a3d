"""Whether the chosen precision runs natively on this hardware, and the warning when it does not.

Every precision runs everywhere PyTorch has autocast, but some only through emulation, which is
slower than float32 (measured with torch 2.13 on an AVX2 CPU, a 1024-wide MLP: bf16 and fp16
autocast about 6x slower than fp32, torchao FP8 about 4x). :func:`precision_advice` says when that
is the case and what to choose instead; :func:`warn_if_emulated` logs it once per process (on the
main process), when the connector builds the precision.

The facts, also in the docs' table (``docs/guides/mixed-precision.md``):

* ``no``: float32, native everywhere.
* ``bf16``: native on GPUs with compute capability 8.0+ (Ampere) and on CPUs with bf16 kernels
  (AVX512 / AMX on x86, the bf16 extension on Arm); emulated, slower than float32, elsewhere.
* ``fp16``: native on CUDA GPUs and on CPUs with fp16 arithmetic (AVX512-FP16 / AMX-FP16 on x86,
  fp16 arithmetic on Arm); emulated, slower than float32, on other CPUs. Its GradScaler works on both.
* ``fp8``: native on GPUs with compute capability 8.9+ (Ada, Hopper); torchao emulates it elsewhere,
  CPUs included.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from accelerando.logging import get_logger

__all__ = ["PrecisionAdvice", "cpu_has_native", "precision_advice", "warn_if_emulated"]

#: (precision, hardware) pairs already warned about in this process.
_WARNED: set[tuple[str, str]] = set()

# /proc/cpuinfo flags, used when this PyTorch lacks the oneDNN queries.
_CPU_FLAGS = {
    "bf16": ("avx512_bf16", "amx_bf16", "avx512f", "bf16"),
    "fp16": ("avx512_fp16", "amx_fp16", "asimdhp", "fphp"),
}


class PrecisionAdvice(NamedTuple):
    """Why ``precision`` is slow on ``hardware``, and the choice that is faster there.

    Attributes:
        precision: the chosen ``mixed_precision``.
        hardware: the device in words (``"this CPU (no native bf16 kernels)"``).
        better: the ``mixed_precision`` to choose instead.
        message: the whole warning sentence.
    """

    precision: str
    hardware: str
    better: str
    message: str


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def cpu_has_native(dtype: str) -> bool:
    """Whether this CPU computes ``dtype`` ("bf16" or "fp16") natively, i.e. has oneDNN kernels for it.

    Asks PyTorch's oneDNN (``torch.ops.mkldnn._is_mkldnn_bf16_supported`` / ``..._fp16_supported``),
    else reads the CPU flags. Without native kernels autocast still works, but slower than float32.
    """
    import torch

    # torch 2.13: torch/_inductor/utils.py:4405 calls the same C++ op (private; native bf16/fp16 CPU kernels?)
    query = getattr(torch.ops.mkldnn, f"_is_mkldnn_{dtype}_supported", None)
    if query is not None:
        try:
            return bool(query())
        except (RuntimeError, AttributeError):
            pass
    return bool(_cpu_flags() & set(_CPU_FLAGS[dtype]))


def _cuda_capability() -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def precision_advice(
    precision: str, device_type: str, fp8_backend: str | None = None
) -> PrecisionAdvice | None:
    """Return why ``precision`` is emulated on this ``device_type``, or None when it runs natively.

    Args:
        precision: ``mixed_precision`` ("no", "fp16", "bf16", "fp8").
        device_type: the torch device type the model trains on ("cpu", "cuda", ...).
        fp8_backend: for fp8, the backend chosen ("ao", "te", "msamp"); only torchao emulates.

    Returns:
        The advice, or None: native, "no", or a device this module knows nothing about.
    """
    if precision == "no":
        return None
    if device_type == "cpu":
        bf16 = cpu_has_native("bf16")
        if precision == "bf16" and not bf16:
            return _advice(
                precision,
                "this CPU (no native bf16 kernels: AVX512/AMX or Arm bf16)",
                "no",
                "bf16 autocast is emulated and slower than float32 here; it only saves activation memory",
            )
        if precision == "fp16" and not cpu_has_native("fp16"):
            return _advice(
                precision,
                "this CPU (no native fp16 kernels: AVX512-FP16/AMX-FP16 or Arm fp16)",
                "bf16" if bf16 else "no",
                "fp16 autocast is emulated and slower than float32 here",
            )
        if precision == "fp8":
            return _advice(
                precision,
                "a CPU (no FP8 units)",
                "bf16" if bf16 else "no",
                "torchao emulates FP8 here, slower than float32; FP8 pays off on GPUs of compute "
                "capability 8.9+",
            )
        return None
    if device_type == "cuda":
        capability = _cuda_capability()
        if capability is None:
            return None
        gpu = f"this GPU (compute capability {capability[0]}.{capability[1]})"
        if precision == "bf16" and capability < (8, 0):
            return _advice(
                precision, gpu, "fp16", "bf16 needs compute capability 8.0+ (Ampere) to run natively"
            )
        if precision == "fp8" and fp8_backend in (None, "ao") and capability < (8, 9):
            return _advice(
                precision,
                gpu,
                "bf16" if capability >= (8, 0) else "fp16",
                "torchao emulates FP8 below compute capability 8.9 (Ada, Hopper)",
            )
    return None


def _advice(precision: str, hardware: str, better: str, why: str) -> PrecisionAdvice:
    message = (
        f"mixed_precision={precision!r} on {hardware}: {why}. "
        f"mixed_precision={better!r} is faster on this hardware."
    )
    return PrecisionAdvice(precision, hardware, better, message)


def warn_if_emulated(
    precision: str, device_type: str, fp8_backend: str | None = None
) -> PrecisionAdvice | None:
    """Log :func:`precision_advice`'s warning, once per process for each (precision, device type).

    Called by :func:`accelerando.backends.precision.build_precision` after the precision object is built. The
    warning is logged on the main process only (``accelerando.backends.precision.advice`` logger).

    Returns:
        The advice when a warning applies (logged now or earlier), else None.
    """
    advice = precision_advice(precision, device_type, fp8_backend)
    if advice is None:
        return None
    key = (precision, device_type)
    if key not in _WARNED:
        _WARNED.add(key)
        get_logger(__name__).warning(advice.message, main_process_only=True)
    return advice
