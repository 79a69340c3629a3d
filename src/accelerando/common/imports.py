"""Availability checks for optional libraries and hardware.

Every ``is_*_available`` function answers without importing the optional package (it asks
``importlib.util.find_spec``, cached per process) and without initialising an accelerator runtime, so
calling one is safe before ``fork`` and costs microseconds after the first call.

Why hardware checks never initialise CUDA: ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``
(which runs ``cuInit``) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set, and a process that has run
``cuInit`` can no longer fork CUDA-using children. ``torch.cuda.device_count()`` is documented as not
poisoning fork when NVML discovery succeeds, and it does not cache a count taken before initialisation
(so a later ``CUDA_VISIBLE_DEVICES`` change is still seen). We therefore answer "is CUDA there" with
``torch.cuda.device_count() > 0`` and do not cache hardware answers.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import torch

from accelerando.core.devices.families import CUDABackend, MPSBackend
from accelerando.core.settings import environment_text

if TYPE_CHECKING:
    from packaging.version import Version

# The package checks generated from _PACKAGE_CHECKS below are appended to __all__ there.
__all__ = [
    "USE_TORCH_XLA",
    "compare_versions",
    "deepspeed_required",
    "is_bf16_available",
    "is_bitsandbytes_multi_backend_available",
    "is_cuda_available",
    "is_fp16_available",
    "is_fp8_available",
    "is_habana_gaudi1",
    "is_hpu_available",
    "is_mps_available",
    "is_package_available",
    "is_pippy_available",
    "is_rocm_available",
    "is_torch_distributed_available",
    "is_torch_version",
    "is_torch_xla_available",
    "is_transformer_engine_mxfp8_available",
    "is_triton_available",
    "is_weights_only_available",
    "is_xccl_available",
    "is_xpu_available",
    "package_version",
    "torchao_required",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# Set USE_TORCH_XLA=0 to make accelerando ignore an installed torch_xla (read once, at import).
USE_TORCH_XLA: bool = (environment_text("USE_TORCH_XLA") or "true").strip().lower() not in (
    "0",
    "false",
    "no",
    "n",
    "off",
    "f",
)

_OPERATORS: dict[str, Callable[[Version, Version], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}


@functools.cache
def is_package_available(import_name: str, distribution_name: str | None = None) -> bool:
    """Tell whether a package could be imported, without importing it.

    Args:
        import_name: the top-level module name (``"wandb"``, ``"transformer_engine"``).
        distribution_name: when given, the installed distribution must also have metadata under this
            name (guards against a stray folder of the same name on ``sys.path``).

    Returns:
        True when the module spec is found (and the distribution metadata, if asked for).
    """
    if _find_spec_without_import(import_name) is None:
        return False
    if distribution_name is None:
        return True
    try:
        importlib.metadata.version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _find_spec_without_import(name: str) -> importlib.machinery.ModuleSpec | None:
    # importlib.util.find_spec("a.b") imports package "a" (running its __init__), so dotted names
    # are resolved one level at a time through the parent's search path instead.
    head, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(head)
    except (ImportError, ValueError):
        # Raised for a module already imported with __spec__ None, or a broken finder.
        return None
    for part in rest:
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec


@functools.cache
def package_version(distribution_name: str) -> Version | None:
    """Return the installed version of a distribution, or None when it is not installed.

    Args:
        distribution_name: the name pip knows the package by (``"bitsandbytes"``).

    Returns:
        The parsed version, or None.
    """
    from packaging.version import parse  # its version regex costs ~10 ms CPU: only on a version check

    try:
        return parse(importlib.metadata.version(distribution_name))
    except importlib.metadata.PackageNotFoundError:
        return None


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (or a version) with a requirement.

    Args:
        library_or_version: a distribution name (its installed version is used) or a version.
        operation: one of ``<``, ``<=``, ``==``, ``!=``, ``>=``, ``>``.
        requirement_version: the version to compare against.

    Returns:
        The result of ``installed <operation> requirement``; False when the library is not installed.

    Raises:
        ValueError: if ``operation`` is not one of the six comparison operators.
    """
    from packaging.version import Version, parse  # see package_version

    if operation not in _OPERATORS:
        raise ValueError(f"Unknown comparison {operation!r}; use one of {sorted(_OPERATORS)}.")
    if isinstance(library_or_version, Version):
        current: Version | None = library_or_version
    else:
        current = package_version(library_or_version)
        if current is None:
            try:
                current = parse(library_or_version)
            except ValueError:
                return False
    return _OPERATORS[operation](current, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the running torch version with ``version``.

    Local build tags (``+cpu``, ``+cu121``) are ignored, so ``is_torch_version(">=", "2.1.0")`` holds
    for ``2.1.0+cpu``.

    Args:
        operation: one of ``<``, ``<=``, ``==``, ``!=``, ``>=``, ``>``.
        version: the version to compare against, e.g. ``"2.1.0"``.

    Returns:
        True when ``torch.__version__ <operation> version``.

    Raises:
        ValueError: if ``operation`` is not a comparison operator.
    """
    from packaging.version import parse  # see package_version

    return compare_versions(parse(parse(torch.__version__).base_version), operation, version)


# --- hardware --------------------------------------------------------------------------------------


def is_cuda_available() -> bool:
    """Tell whether at least one CUDA (or ROCm) device is visible, without initialising CUDA.

    The answer is the CUDA device family's (``accelerando.core.devices``), so both always agree.

    Returns:
        True when torch was built with CUDA and reports one device or more.
    """
    return CUDABackend.is_available()


def is_mps_available(min_version: str | None = "1.12") -> bool:
    """Tell whether Apple's Metal (MPS) backend can be used.

    Args:
        min_version: minimum torch version required for MPS support (None: no minimum).

    Returns:
        True when the MPS backend is built and available (and torch is recent enough).
    """
    if min_version is not None and not is_torch_version(">=", min_version):
        return False

    return MPSBackend.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    """Tell whether an Intel XPU device can be used.

    Args:
        check_device: also require that at least one device is visible (torch's check already does).

    Returns:
        True when ``torch.xpu`` reports a device.
    """
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def is_hpu_available(init_hccl: bool = False) -> bool:
    """Tell whether an Intel Gaudi (HPU) device can be used.

    Args:
        init_hccl: accepted for API compatibility; the check never initialises the HCCL backend.

    Returns:
        True when the Habana PyTorch bridge is installed.
    """
    return is_package_available("habana_frameworks") and is_package_available("habana_frameworks.torch")


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Tell whether ``torch_xla`` is installed.

    Args:
        check_is_tpu: accepted for API compatibility; asking for the device kind would initialise the
            XLA runtime, so only installation is checked.
        check_is_gpu: same as ``check_is_tpu``.

    Returns:
        True when ``torch_xla`` can be imported and ``USE_TORCH_XLA`` was not set to a false value.
    """
    return USE_TORCH_XLA and is_package_available("torch_xla")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Tell whether bfloat16 arithmetic is supported on the default accelerator (or the CPU).

    On CUDA this asks the device's compute capability, which initialises CUDA; it is therefore only
    asked when a CUDA device is present.

    Args:
        ignore_tpu: do not answer True merely because torch_xla is installed.

    Returns:
        True when bf16 is usable.
    """
    if is_torch_xla_available() and not ignore_tpu:
        return True
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_mps_available():
        return is_torch_version(">=", "2.5.0")
    return True


# --- package checks: one table, one generator ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PackageCheck:
    """One row of the package-check table; ``_make_check`` turns it into a public function."""

    name: str  # the public function's name
    label: str  # what the package is, as the docstring names it
    modules: tuple[str, ...]  # import names that must all be findable (any one of them, with any_of)
    distribution: str | None = None  # also require this distribution's metadata; its version is compared
    min_version: str | None = None  # lowest acceptable version: fixed, or the parameter's default
    version_parameter: bool = False  # expose ``min_version`` as a parameter
    any_of: bool = False
    device_family: str | None = None  # ``torch.<family>`` the extension registers; adds ``check_device``


_C = _PackageCheck
_PACKAGE_CHECKS: tuple[_PackageCheck, ...] = (
    # libraries
    _C("is_deepspeed_available", "DeepSpeed", ("deepspeed",), distribution="deepspeed"),
    _C("is_transformers_available", "Hugging Face Transformers", ("transformers",)),
    _C("is_datasets_available", "Hugging Face Datasets", ("datasets",)),
    _C("is_peft_available", "Hugging Face PEFT", ("peft",)),
    _C("is_bnb_available", "bitsandbytes", ("bitsandbytes",), "bitsandbytes", None, version_parameter=True),
    _C(
        "is_4bit_bnb_available", "bitsandbytes with 4-bit layers", ("bitsandbytes",), "bitsandbytes", "0.39.0"
    ),
    _C(
        "is_8bit_bnb_available", "bitsandbytes with 8-bit layers", ("bitsandbytes",), "bitsandbytes", "0.37.2"
    ),
    _C("is_numpy_available", "numpy", ("numpy",), None, "1.25.0", version_parameter=True),
    _C("is_pandas_available", "pandas", ("pandas",)),
    _C("is_matplotlib_available", "matplotlib", ("matplotlib",)),
    _C("is_rich_available", "Rich", ("rich",)),
    _C("is_tqdm_available", "tqdm", ("tqdm",)),
    _C("is_pytest_available", "pytest", ("pytest",)),
    _C("is_timm_available", "timm (PyTorch Image Models)", ("timm",)),
    _C("is_torchvision_available", "torchvision", ("torchvision",)),
    _C("is_torchdata_available", "torchdata", ("torchdata",)),
    _C(
        "is_torchdata_stateful_dataloader_available",
        "torchdata's StatefulDataLoader",
        ("torchdata", "torchdata.stateful_dataloader"),
    ),
    _C("is_megatron_lm_available", "Megatron-LM", ("megatron", "megatron.core")),
    _C("is_ipex_available", "Intel Extension for PyTorch", ("intel_extension_for_pytorch",)),
    _C("is_transformer_engine_available", "NVIDIA Transformer Engine", ("transformer_engine",)),
    _C("is_torchao_available", "torchao", ("torchao",)),
    _C("is_msamp_available", "Microsoft's MS-AMP", ("msamp",)),
    _C("is_schedulefree_available", "the schedule-free optimizers package", ("schedulefree",)),
    _C("is_lomo_available", "the LOMO optimizers package (lomo-optim)", ("lomo_optim",)),
    _C("is_import_timer_available", "the import-timer profiler", ("import_timer",)),
    _C("is_pynvml_available", "NVML bindings (pynvml)", ("pynvml",)),
    _C("is_amdsmi_available", "AMD SMI bindings (amdsmi)", ("amdsmi",)),
    _C("is_boto3_available", "boto3 (the AWS SDK)", ("boto3",)),
    _C("is_sagemaker_available", "the Amazon SageMaker Python SDK", ("sagemaker",)),
    # trackers
    _C("is_wandb_available", "Weights & Biases", ("wandb",)),
    _C("is_tensorboard_available", "a TensorBoard writer", ("tensorboard", "tensorboardX"), any_of=True),
    _C("is_comet_ml_available", "Comet ML", ("comet_ml",)),
    _C("is_mlflow_available", "MLflow (or mlflow-skinny)", ("mlflow",)),
    _C("is_aim_available", "Aim", ("aim",)),
    _C("is_clearml_available", "ClearML", ("clearml",)),
    _C("is_dvclive_available", "DVCLive", ("dvclive",)),
    _C("is_swanlab_available", "SwanLab", ("swanlab",)),
    _C("is_trackio_available", "Trackio", ("trackio",)),
    _C("is_neptune_available", "the Neptune client", ("neptune",)),
    # vendors' torch extensions: installed, and with check_device=True a device is visible
    _C("is_npu_available", "an Ascend NPU", ("torch_npu",), device_family="npu"),
    _C("is_mlu_available", "a Cambricon MLU", ("torch_mlu",), device_family="mlu"),
    _C("is_musa_available", "a Moore Threads MUSA device", ("torch_musa",), device_family="musa"),
    _C("is_sdaa_available", "a Tecorigin SDAA device", ("torch_sdaa",), device_family="sdaa"),
    _C("is_neuron_available", "an AWS Neuron device", ("torch_neuronx",), device_family="neuron"),
)
del _C


def _installed(check: _PackageCheck, min_version: str | None) -> bool:
    # is_package_available is looked up at each call, so monkeypatching it reaches every check.
    first, *others = check.modules
    if check.any_of:
        found = any(is_package_available(module) for module in check.modules)
    else:
        found = is_package_available(first, check.distribution) and all(
            is_package_available(module) for module in others
        )
    if not found:
        return False
    return min_version is None or compare_versions(check.distribution or first, ">=", min_version)


def _device_visible(check: _PackageCheck) -> bool:
    # Importing the extension registers torch.<family>; only done when the caller asks for a device.
    importlib.import_module(check.modules[0])
    family = getattr(torch, check.device_family or "", None)
    try:
        return bool(family is not None and family.is_available())
    except RuntimeError:  # a broken driver answers "no device", not a crash
        return False


def _docstring(check: _PackageCheck) -> str:
    modules = " and ".join(f"``{module}``" for module in check.modules)
    if check.any_of:
        modules = " or ".join(f"``{module}``" for module in check.modules)
    if check.device_family is not None:
        extension = check.modules[0]
        return (
            f"Tell whether {check.label} can be used (requires the ``{extension}`` extension).\n\n"
            "Args:\n"
            f"    check_device: also require a visible device; this imports ``{extension}``, so it only\n"
            "        happens when asked.\n\n"
            "Returns:\n"
            f"    True when ``{extension}`` is installed (and, if asked, a device is visible).\n"
        )
    lines = [f"Tell whether {check.label} is installed, without importing it.", ""]
    if check.version_parameter:
        lines += ["Args:", "    min_version: the lowest acceptable version (None: any).", ""]
    returns = f"True when {modules} can be imported"
    if check.distribution is not None:
        returns += f" and the ``{check.distribution}`` distribution is installed"
    if check.min_version is not None and not check.version_parameter:
        returns += f", at version {check.min_version} or later"
    elif check.version_parameter:
        returns += ", at least at ``min_version``"
    return "\n".join([*lines, "Returns:", f"    {returns}.", ""])


def _make_check(check: _PackageCheck) -> Callable[..., bool]:
    """Build the public function for one table row, with the parameters the reference gives it."""
    available: Callable[..., bool]
    if check.device_family is not None:

        def with_device(check_device: bool = False) -> bool:
            if not _installed(check, None):
                return False
            return not check_device or _device_visible(check)

        available = with_device
    elif check.version_parameter:

        def with_version(min_version: str | None = check.min_version) -> bool:
            return _installed(check, min_version)

        available = with_version
    else:

        def fixed() -> bool:
            return _installed(check, check.min_version)

        available = fixed
    available.__name__ = available.__qualname__ = check.name
    available.__doc__ = _docstring(check)
    return available


globals().update({check.name: _make_check(check) for check in _PACKAGE_CHECKS})
__all__ += [check.name for check in _PACKAGE_CHECKS]

if TYPE_CHECKING:
    # The checks generated above, declared for static analysis (one per _PACKAGE_CHECKS row, same
    # parameters; tests/utils/test_imports_declared.py keeps the two in step).
    def is_deepspeed_available() -> bool: ...
    def is_transformers_available() -> bool: ...
    def is_datasets_available() -> bool: ...
    def is_peft_available() -> bool: ...
    def is_bnb_available(min_version: str | None = None) -> bool: ...
    def is_4bit_bnb_available() -> bool: ...
    def is_8bit_bnb_available() -> bool: ...
    def is_numpy_available(min_version: str | None = "1.25.0") -> bool: ...
    def is_pandas_available() -> bool: ...
    def is_matplotlib_available() -> bool: ...
    def is_rich_available() -> bool: ...
    def is_tqdm_available() -> bool: ...
    def is_pytest_available() -> bool: ...
    def is_timm_available() -> bool: ...
    def is_torchvision_available() -> bool: ...
    def is_torchdata_available() -> bool: ...
    def is_torchdata_stateful_dataloader_available() -> bool: ...
    def is_megatron_lm_available() -> bool: ...
    def is_ipex_available() -> bool: ...
    def is_transformer_engine_available() -> bool: ...
    def is_torchao_available() -> bool: ...
    def is_msamp_available() -> bool: ...
    def is_schedulefree_available() -> bool: ...
    def is_lomo_available() -> bool: ...
    def is_import_timer_available() -> bool: ...
    def is_pynvml_available() -> bool: ...
    def is_amdsmi_available() -> bool: ...
    def is_boto3_available() -> bool: ...
    def is_sagemaker_available() -> bool: ...
    def is_wandb_available() -> bool: ...
    def is_tensorboard_available() -> bool: ...
    def is_comet_ml_available() -> bool: ...
    def is_mlflow_available() -> bool: ...
    def is_aim_available() -> bool: ...
    def is_clearml_available() -> bool: ...
    def is_dvclive_available() -> bool: ...
    def is_swanlab_available() -> bool: ...
    def is_trackio_available() -> bool: ...
    def is_neptune_available() -> bool: ...
    def is_npu_available(check_device: bool = False) -> bool: ...
    def is_mlu_available(check_device: bool = False) -> bool: ...
    def is_musa_available(check_device: bool = False) -> bool: ...
    def is_sdaa_available(check_device: bool = False) -> bool: ...
    def is_neuron_available(check_device: bool = False) -> bool: ...


def _ask(check_name: str) -> bool:
    # Generated checks are not visible to static analysis, and a test may monkeypatch any check:
    # both are served by looking the function up by name at each call.
    return bool(globals()[check_name]())


# --- checks with their own logic ------------------------------------------------------------------------


def is_habana_gaudi1() -> bool:
    """Tell whether the Intel Gaudi device is a first-generation Gaudi (which lacks fp16 support).

    Asking needs the Habana bridge's device query, so ``habana_frameworks`` is imported, but only
    when it is installed.

    Returns:
        True on a Gaudi 1; False on later generations or when no Habana bridge is installed.
    """
    if not is_hpu_available():
        return False
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return bool(experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi)


def is_rocm_available() -> bool:
    """Tell whether this torch build targets AMD ROCm (HIP) rather than NVIDIA CUDA.

    Returns:
        True when ``torch.version.hip`` is set.
    """
    return getattr(torch.version, "hip", None) is not None


def is_fp16_available() -> bool:
    """Tell whether float16 mixed precision can be used on this machine's accelerator.

    Returns:
        False on a first-generation Intel Gaudi (no fp16 support), True everywhere else.
    """
    return not is_habana_gaudi1()


def is_fp8_available() -> bool:
    """Tell whether any FP8 backend is installed (MS-AMP, Transformer Engine or torchao).

    Returns:
        True when at least one of ``msamp``, ``transformer_engine`` or ``torchao`` is installed.
    """
    return (
        _ask("is_msamp_available") or _ask("is_transformer_engine_available") or _ask("is_torchao_available")
    )


def is_transformer_engine_mxfp8_available() -> bool:
    """Tell whether Transformer Engine can run MXFP8 block scaling on this machine's GPU.

    Needs Transformer Engine and a CUDA device; the answer comes from Transformer Engine's own
    capability check, so ``transformer_engine`` is imported, but only when both are present.

    Returns:
        True when MXFP8 recipes are supported (Blackwell-class GPUs with a recent Transformer Engine).
    """
    if not (_ask("is_transformer_engine_available") and is_cuda_available()):
        return False
    fp8 = importlib.import_module("transformer_engine.pytorch.fp8")
    check = getattr(fp8, "check_mxfp8_support", None)
    return bool(check is not None and check()[0])


def is_torch_distributed_available() -> bool:
    """Tell whether this torch build includes ``torch.distributed``.

    Returns:
        True when ``torch.distributed.is_available()``.
    """
    return bool(torch.distributed.is_available())


def is_xccl_available() -> bool:
    """Tell whether torch's XCCL backend (collectives on Intel XPUs, torch 2.7 or later) is built in.

    Returns:
        True when torch is 2.7 or later and reports the XCCL backend as available.
    """
    if not (is_torch_version(">=", "2.7.0") and is_torch_distributed_available()):
        return False
    from torch.distributed import distributed_c10d

    check = getattr(distributed_c10d, "is_xccl_available", None)
    return bool(check is not None and check())


def is_pippy_available() -> bool:
    """Tell whether pipeline parallelism (``torch.distributed.pipelining``, torch 2.4 or later) exists.

    Returns:
        True when torch is 2.4 or later.
    """
    return is_torch_version(">=", "2.4.0")


def is_weights_only_available() -> bool:
    """Tell whether ``torch.load(weights_only=True)`` can load our checkpoints (torch 2.4 or later).

    Earlier releases lack ``torch.serialization.add_safe_globals``, which loading numpy RNG states
    with ``weights_only`` needs.

    Returns:
        True when torch is 2.4 or later.
    """
    return is_torch_version(">=", "2.4.0")


def is_triton_available() -> bool:
    """Tell whether Triton is installed (the ``pytorch-triton-xpu`` build on Intel XPU machines).

    Returns:
        True when the Triton distribution that matches this machine's accelerator is installed.
    """
    if is_xpu_available():
        return is_package_available("triton", "pytorch-triton-xpu")
    return is_package_available("triton")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Tell whether the installed bitsandbytes supports devices other than CUDA (its multi-backend build).

    The build advertises it in ``bitsandbytes.features``, a runtime attribute, so bitsandbytes is
    imported, but only when it is installed.

    Returns:
        True when bitsandbytes is installed and lists the ``multi_backend`` feature.
    """
    if not _ask("is_bnb_available"):
        return False
    bnb = importlib.import_module("bitsandbytes")
    return "multi_backend" in getattr(bnb, "features", set())


# --- decorators -------------------------------------------------------------------------------------


def _requires(check_name: str, what: str, install: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    # The check is looked up by name at each call, so it sees the environment of the call.
    def decorator(func: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            if not globals()[check_name]():
                raise ImportError(
                    f"{getattr(func, '__qualname__', func)} needs {what}, which is not installed. "
                    f"Fix: `pip install {install}`."
                )
            return func(*args, **kwargs)

        return wrapper

    return decorator


def deepspeed_required(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a function so that calling it without DeepSpeed installed raises a clear error.

    Args:
        func: the function that needs DeepSpeed.

    Returns:
        The wrapped function; the check runs at each call, not at decoration.

    Raises:
        ImportError (from the wrapped function): when ``deepspeed`` is not installed.
    """
    return _requires("is_deepspeed_available", "DeepSpeed", "deepspeed")(func)


def torchao_required(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a function so that calling it without torchao installed raises a clear error.

    Args:
        func: the function that needs torchao.

    Returns:
        The wrapped function; the check runs at each call, not at decoration.

    Raises:
        ImportError (from the wrapped function): when ``torchao`` is not installed.
    """
    return _requires("is_torchao_available", "torchao", "torchao")(func)
