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
from typing import Any, TypeVar

import torch
from packaging.version import Version, parse

from accelerando.settings import environment_text

__all__ = [
    "USE_TORCH_XLA",
    "compare_versions",
    "deepspeed_required",
    "is_4bit_bnb_available",
    "is_8bit_bnb_available",
    "is_aim_available",
    "is_amdsmi_available",
    "is_bf16_available",
    "is_bitsandbytes_multi_backend_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp16_available",
    "is_fp8_available",
    "is_habana_gaudi1",
    "is_hpu_available",
    "is_import_timer_available",
    "is_ipex_available",
    "is_lomo_available",
    "is_matplotlib_available",
    "is_megatron_lm_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_msamp_available",
    "is_musa_available",
    "is_neptune_available",
    "is_neuron_available",
    "is_npu_available",
    "is_numpy_available",
    "is_package_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pippy_available",
    "is_pynvml_available",
    "is_pytest_available",
    "is_rich_available",
    "is_rocm_available",
    "is_sagemaker_available",
    "is_schedulefree_available",
    "is_sdaa_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_distributed_available",
    "is_torch_version",
    "is_torch_xla_available",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_tqdm_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_weights_only_available",
    "is_xccl_available",
    "is_xpu_available",
    "package_version",
    "torchao_required",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# Set USE_TORCH_XLA=0 to make accelerando ignore an installed torch_xla (read once, at import).
USE_TORCH_XLA: bool = (environment_text("USE_TORCH_XLA") or "true").strip().lower() not in (
    "0",
    "false",
    "no",
    "n",
    "off",
    "f",
)

_OPERATORS: dict[str, Callable[[object, object], bool]] = {
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
    return compare_versions(parse(parse(torch.__version__).base_version), operation, version)


# --- hardware --------------------------------------------------------------------------------------


def is_cuda_available() -> bool:
    """Tell whether at least one CUDA (or ROCm) device is visible, without initialising CUDA.

    The answer is the CUDA device family's (``accelerando.devices``), so both always agree.

    Returns:
        True when torch was built with CUDA and reports one device or more.
    """
    from accelerando.devices.families import CUDABackend

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
    from accelerando.devices.families import MPSBackend

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


def is_npu_available(check_device: bool = False) -> bool:
    """Tell whether an Ascend NPU can be used (requires the ``torch_npu`` extension).

    Args:
        check_device: also require that at least one device is visible. Importing ``torch_npu`` is
            needed for that, so it only happens when asked.

    Returns:
        True when ``torch_npu`` is installed (and, if asked, a device is visible).
    """
    if not is_package_available("torch_npu"):
        return False
    if not check_device:
        return True
    import torch_npu  # noqa: F401  (registers torch.npu)

    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


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


def is_ipex_available() -> bool:
    """Tell whether Intel Extension for PyTorch is installed.

    Returns:
        True when ``intel_extension_for_pytorch`` can be imported.
    """
    return is_package_available("intel_extension_for_pytorch")


# --- libraries -------------------------------------------------------------------------------------


def is_deepspeed_available() -> bool:
    """Tell whether DeepSpeed is installed.

    Returns:
        True when ``deepspeed`` can be imported and has distribution metadata.
    """
    return is_package_available("deepspeed", "deepspeed")


def is_transformers_available() -> bool:
    """Tell whether Hugging Face Transformers is installed.

    Returns:
        True when ``transformers`` can be imported.
    """
    return is_package_available("transformers")


def is_datasets_available() -> bool:
    """Tell whether Hugging Face Datasets is installed.

    Returns:
        True when ``datasets`` can be imported.
    """
    return is_package_available("datasets")


def is_wandb_available() -> bool:
    """Tell whether Weights & Biases is installed.

    Returns:
        True when ``wandb`` can be imported.
    """
    return is_package_available("wandb")


def is_tensorboard_available() -> bool:
    """Tell whether a TensorBoard writer is installed (``tensorboard`` or ``tensorboardX``).

    Returns:
        True when either package can be imported.
    """
    return is_package_available("tensorboard") or is_package_available("tensorboardX")


def is_comet_ml_available() -> bool:
    """Tell whether Comet ML is installed.

    Returns:
        True when ``comet_ml`` can be imported.
    """
    return is_package_available("comet_ml")


def is_mlflow_available() -> bool:
    """Tell whether MLflow (or its lighter ``mlflow-skinny`` distribution) is installed.

    Returns:
        True when ``mlflow`` can be imported.
    """
    return is_package_available("mlflow")


def is_aim_available() -> bool:
    """Tell whether Aim is installed.

    Returns:
        True when ``aim`` can be imported.
    """
    return is_package_available("aim")


def is_clearml_available() -> bool:
    """Tell whether ClearML is installed.

    Returns:
        True when ``clearml`` can be imported.
    """
    return is_package_available("clearml")


def is_dvclive_available() -> bool:
    """Tell whether DVCLive is installed.

    Returns:
        True when ``dvclive`` can be imported.
    """
    return is_package_available("dvclive")


def is_swanlab_available() -> bool:
    """Tell whether SwanLab is installed.

    Returns:
        True when ``swanlab`` can be imported.
    """
    return is_package_available("swanlab")


def is_trackio_available() -> bool:
    """Tell whether Trackio is installed.

    Returns:
        True when ``trackio`` can be imported.
    """
    return is_package_available("trackio")


def is_neptune_available() -> bool:
    """Tell whether the Neptune client is installed.

    Returns:
        True when ``neptune`` can be imported.
    """
    return is_package_available("neptune")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Tell whether bitsandbytes is installed (optionally at least ``min_version``).

    Args:
        min_version: the lowest acceptable version, e.g. ``"0.39.0"``.

    Returns:
        True when ``bitsandbytes`` is installed and recent enough.
    """
    if not is_package_available("bitsandbytes", "bitsandbytes"):
        return False
    return min_version is None or compare_versions("bitsandbytes", ">=", min_version)


def is_4bit_bnb_available() -> bool:
    """Tell whether the installed bitsandbytes supports 4-bit quantization (0.39.0 or later).

    Returns:
        True when 4-bit layers are available.
    """
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    """Tell whether the installed bitsandbytes supports 8-bit quantization (0.37.2 or later).

    Returns:
        True when 8-bit layers are available.
    """
    return is_bnb_available("0.37.2")


def is_rich_available() -> bool:
    """Tell whether Rich is installed.

    Returns:
        True when ``rich`` can be imported.
    """
    return is_package_available("rich")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Tell whether torchdata's ``StatefulDataLoader`` is installed.

    Returns:
        True when ``torchdata.stateful_dataloader`` can be imported.
    """
    return is_package_available("torchdata") and is_package_available("torchdata.stateful_dataloader")


def is_matplotlib_available() -> bool:
    """Tell whether matplotlib is installed.

    Returns:
        True when ``matplotlib`` can be imported.
    """
    return is_package_available("matplotlib")


def is_pynvml_available() -> bool:
    """Tell whether NVML bindings (``pynvml``) are installed.

    Returns:
        True when ``pynvml`` can be imported.
    """
    return is_package_available("pynvml")


def is_transformer_engine_available() -> bool:
    """Tell whether NVIDIA Transformer Engine is installed.

    Returns:
        True when ``transformer_engine`` can be imported.
    """
    return is_package_available("transformer_engine")


def is_torchao_available() -> bool:
    """Tell whether torchao is installed.

    Returns:
        True when ``torchao`` can be imported.
    """
    return is_package_available("torchao")


def is_msamp_available() -> bool:
    """Tell whether Microsoft's MS-AMP is installed.

    Returns:
        True when ``msamp`` can be imported.
    """
    return is_package_available("msamp")


def is_megatron_lm_available() -> bool:
    """Tell whether Megatron-LM (``megatron.core``) is installed.

    Returns:
        True when ``megatron.core`` can be imported.
    """
    return is_package_available("megatron") and is_package_available("megatron.core")


def is_tqdm_available() -> bool:
    """Tell whether tqdm is installed.

    Returns:
        True when ``tqdm`` can be imported.
    """
    return is_package_available("tqdm")


# --- more hardware -----------------------------------------------------------------------------------


def _device_extension_available(package: str, family: str, check_device: bool) -> bool:
    """Installed check for a vendor's torch extension; with ``check_device`` it is imported and asked."""
    if not is_package_available(package):
        return False
    if not check_device:
        return True
    importlib.import_module(package)  # registers torch.<family>
    module = getattr(torch, family, None)
    try:
        return bool(module is not None and module.is_available())
    except RuntimeError:
        return False


def is_mlu_available(check_device: bool = False) -> bool:
    """Tell whether a Cambricon MLU can be used (requires the ``torch_mlu`` extension).

    Args:
        check_device: also require a visible device; this imports ``torch_mlu``, so it only happens
            when asked.

    Returns:
        True when ``torch_mlu`` is installed (and, if asked, a device is visible).
    """
    return _device_extension_available("torch_mlu", "mlu", check_device)


def is_musa_available(check_device: bool = False) -> bool:
    """Tell whether a Moore Threads MUSA device can be used (requires the ``torch_musa`` extension).

    Args:
        check_device: also require a visible device (imports ``torch_musa``).

    Returns:
        True when ``torch_musa`` is installed (and, if asked, a device is visible).
    """
    return _device_extension_available("torch_musa", "musa", check_device)


def is_sdaa_available(check_device: bool = False) -> bool:
    """Tell whether a Tecorigin SDAA device can be used (requires the ``torch_sdaa`` extension).

    Args:
        check_device: also require a visible device (imports ``torch_sdaa``).

    Returns:
        True when ``torch_sdaa`` is installed (and, if asked, a device is visible).
    """
    return _device_extension_available("torch_sdaa", "sdaa", check_device)


def is_neuron_available(check_device: bool = False) -> bool:
    """Tell whether an AWS Neuron device (Trainium/Inferentia) can be used (``torch_neuronx``).

    Args:
        check_device: also require a visible device (imports ``torch_neuronx``).

    Returns:
        True when ``torch_neuronx`` is installed (and, if asked, a device is visible).
    """
    return _device_extension_available("torch_neuronx", "neuron", check_device)


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
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_transformer_engine_mxfp8_available() -> bool:
    """Tell whether Transformer Engine can run MXFP8 block scaling on this machine's GPU.

    Needs Transformer Engine and a CUDA device; the answer comes from Transformer Engine's own
    capability check, so ``transformer_engine`` is imported, but only when both are present.

    Returns:
        True when MXFP8 recipes are supported (Blackwell-class GPUs with a recent Transformer Engine).
    """
    if not (is_transformer_engine_available() and is_cuda_available()):
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


# --- more libraries ------------------------------------------------------------------------------------


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """Tell whether numpy is installed, at least at ``min_version``.

    Args:
        min_version: the lowest acceptable version.

    Returns:
        True when numpy is installed and recent enough.
    """
    return is_package_available("numpy") and compare_versions("numpy", ">=", min_version)


def is_pandas_available() -> bool:
    """Tell whether pandas is installed.

    Returns:
        True when ``pandas`` can be imported.
    """
    return is_package_available("pandas")


def is_peft_available() -> bool:
    """Tell whether Hugging Face PEFT is installed.

    Returns:
        True when ``peft`` can be imported.
    """
    return is_package_available("peft")


def is_timm_available() -> bool:
    """Tell whether timm (PyTorch Image Models) is installed.

    Returns:
        True when ``timm`` can be imported.
    """
    return is_package_available("timm")


def is_torchvision_available() -> bool:
    """Tell whether torchvision is installed.

    Returns:
        True when ``torchvision`` can be imported.
    """
    return is_package_available("torchvision")


def is_torchdata_available() -> bool:
    """Tell whether torchdata is installed.

    Returns:
        True when ``torchdata`` can be imported.
    """
    return is_package_available("torchdata")


def is_triton_available() -> bool:
    """Tell whether Triton is installed (the ``pytorch-triton-xpu`` build on Intel XPU machines).

    Returns:
        True when the Triton distribution that matches this machine's accelerator is installed.
    """
    if is_xpu_available():
        return is_package_available("triton", "pytorch-triton-xpu")
    return is_package_available("triton")


def is_pytest_available() -> bool:
    """Tell whether pytest is installed.

    Returns:
        True when ``pytest`` can be imported.
    """
    return is_package_available("pytest")


def is_boto3_available() -> bool:
    """Tell whether boto3 (the AWS SDK) is installed.

    Returns:
        True when ``boto3`` can be imported.
    """
    return is_package_available("boto3")


def is_sagemaker_available() -> bool:
    """Tell whether the Amazon SageMaker Python SDK is installed.

    Returns:
        True when ``sagemaker`` can be imported.
    """
    return is_package_available("sagemaker")


def is_schedulefree_available() -> bool:
    """Tell whether the schedule-free optimizers package is installed.

    Returns:
        True when ``schedulefree`` can be imported.
    """
    return is_package_available("schedulefree")


def is_lomo_available() -> bool:
    """Tell whether the LOMO optimizers package (``lomo-optim``) is installed.

    Returns:
        True when ``lomo_optim`` can be imported.
    """
    return is_package_available("lomo_optim")


def is_import_timer_available() -> bool:
    """Tell whether the ``import-timer`` profiler is installed.

    Returns:
        True when ``import_timer`` can be imported.
    """
    return is_package_available("import_timer")


def is_amdsmi_available() -> bool:
    """Tell whether AMD SMI bindings (``amdsmi``) are installed.

    Returns:
        True when ``amdsmi`` can be imported.
    """
    return is_package_available("amdsmi")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Tell whether the installed bitsandbytes supports devices other than CUDA (its multi-backend build).

    The build advertises it in ``bitsandbytes.features``, a runtime attribute, so bitsandbytes is
    imported, but only when it is installed.

    Returns:
        True when bitsandbytes is installed and lists the ``multi_backend`` feature.
    """
    if not is_bnb_available():
        return False
    bnb = importlib.import_module("bitsandbytes")
    return "multi_backend" in getattr(bnb, "features", set())


# --- decorators -------------------------------------------------------------------------------------


def _requires(check_name: str, what: str, install: str) -> Callable[[_F], _F]:
    # The check is looked up by name at each call, so it sees the environment of the call.
    def decorator(func: _F) -> _F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not globals()[check_name]():
                raise ImportError(
                    f"{getattr(func, '__qualname__', func)} needs {what}, which is not installed. "
                    f"Fix: `pip install {install}`."
                )
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def deepspeed_required(func: _F) -> _F:
    """Decorate a function so that calling it without DeepSpeed installed raises a clear error.

    Args:
        func: the function that needs DeepSpeed.

    Returns:
        The wrapped function; the check runs at each call, not at decoration.

    Raises:
        ImportError (from the wrapped function): when ``deepspeed`` is not installed.
    """
    return _requires("is_deepspeed_available", "DeepSpeed", "deepspeed")(func)


def torchao_required(func: _F) -> _F:
    """Decorate a function so that calling it without torchao installed raises a clear error.

    Args:
        func: the function that needs torchao.

    Returns:
        The wrapped function; the check runs at each call, not at decoration.

    Raises:
        ImportError (from the wrapped function): when ``torchao`` is not installed.
    """
    return _requires("is_torchao_available", "torchao", "torchao")(func)
