"""Helpers for test suites of projects built on accelerando, under the reference's names.

* skip decorators by hardware (``require_cuda``, ``require_multi_device``, ...) and by installed library
  (``require_transformers``, ``require_wandb``, ...), plus ``slow`` (runs only when ``RUN_SLOW`` is a
  yes value) and ``skip``. Each works on a test function or a ``unittest.TestCase`` class and decides
  when it is applied (at import of the test module);
* ``torch_device`` / ``device_count`` / ``memory_allocated_func`` for this machine;
* ``get_launch_command`` and ``DEFAULT_LAUNCH_COMMAND`` (an ``accelerando launch`` command line),
  ``execute_subprocess_async`` and ``run_command`` to run it;
* test-case bases that reset the process state or keep a temporary folder, and small assertions.
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import re
import sys
import unittest
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, TypeVar

import torch

from accelerando.test_utils._backend import available, family_count, get_backend
from accelerando.test_utils._cases import AccelerateTestCase, MockingTestCase, TempDirTestCase
from accelerando.test_utils._subprocess import SubprocessCallException, execute_subprocess_async, run_command
from accelerando.utils import imports
from accelerando.utils.constants import (
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_PYTORCH_VERSION,
)
from accelerando.utils.environment import parse_flag_from_env

T = TypeVar("T")

torch_device, device_count, memory_allocated_func = get_backend()


# --- launching -------------------------------------------------------------------------------------


def get_launch_command(**kwargs: Any) -> list:
    """Build an ``accelerando launch`` command line from keyword arguments.

    ``True`` adds ``--name``; ``False`` and ``None`` add nothing; any other value adds ``--name=value``.
    The script and its arguments are appended by the caller. When this process runs accelerando as
    ``accelerate`` (``accelerando.stand_in.install_as_accelerate()``), ``--install_as_accelerate`` is
    added (unless given) so the launched scripts' ``import accelerate`` gets accelerando too.

    Example: ``get_launch_command(num_processes=2, cpu=True)`` gives
    ``["accelerando", "launch", "--num_processes=2", "--cpu"]``.
    """
    command = ["accelerando", "launch"]
    if "install_as_accelerate" not in kwargs and _stand_in_active():
        kwargs = {**kwargs, "install_as_accelerate": True}
    for name, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{name}")
        elif value is not None:
            command.append(f"--{name}={value}")
    return command


def _stand_in_active() -> bool:
    stand_in = sys.modules.get("accelerando.stand_in")  # never imported here: only asked if in use
    return bool(stand_in is not None and stand_in.is_installed_as_accelerate())


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def pytest_xdist_worker_id() -> int:
    """Return the pytest-xdist worker number (``gw3`` -> 3), or 0 outside xdist.

    Raises:
        ValueError: ``PYTEST_XDIST_WORKER`` is set to something other than ``gw<number>``.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    match = re.fullmatch(r"(?:gw)?(\d+)", worker.strip())
    if match is None:
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r} is not of the form gw<number>.")
    return int(match.group(1))


def get_torch_dist_unique_port() -> int:
    """Return a rendezvous port for this test worker: 29500 plus the xdist worker number.

    Workers of one ``pytest -n`` run then never share a port.
    """
    return 29500 + pytest_xdist_worker_id()


def path_in_accelerate_package(*components: str) -> Path:
    """Return the path of ``components`` inside the installed accelerando package.

    ``path_in_accelerate_package("test_utils", "scripts", "test_script.py")`` locates a bundled script.
    """
    import accelerando

    return Path(inspect.getfile(accelerando)).parent.joinpath(*components)


# --- skip decorators -------------------------------------------------------------------------------


def _requires(condition: Callable[[], bool], reason: str, name: str) -> Callable[[T], T]:
    def decorator(test_case: T) -> T:
        return unittest.skipUnless(condition(), reason)(test_case)

    decorator.__name__ = decorator.__qualname__ = name
    decorator.__doc__ = (
        f"Skip the decorated test (a function or a TestCase class) unless it can run here: {reason}."
    )
    return decorator


def skip(test_case: T) -> T:
    """Always skip the decorated test (a function or a TestCase class)."""
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case: T) -> T:
    """Skip the decorated test unless the ``RUN_SLOW`` environment variable is a yes value.

    Raises:
        ValueError: ``RUN_SLOW`` holds something that is not a yes/no spelling.
    """
    return unittest.skipUnless(
        parse_flag_from_env("RUN_SLOW", default=False), "test is slow (set RUN_SLOW=1)"
    )(test_case)


def run_first(test_case: T) -> T:
    """Mark the test to run before the others (``pytest.mark.order(1)``).

    The order is applied by the pytest-order plugin; without it installed the test is left unmarked
    (pytest would only warn about an unknown mark) and runs in file order.
    """
    if imports.is_package_available("pytest_order"):
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Skip the decorated test unless torch is at least ``version``.

    Use as ``@require_torch_min_version(version="2.4.0")``.

    Raises:
        ValueError: no ``version`` was given.
    """
    if version is None:
        raise ValueError(
            "require_torch_min_version needs a version, e.g. @require_torch_min_version(version='2.4')."
        )
    if test_case is None:
        return functools.partial(require_torch_min_version, version=version)
    return unittest.skipUnless(imports.is_torch_version(">=", version), f"test requires torch >= {version}")(
        test_case
    )


def _cuda() -> bool:
    return imports.is_cuda_available() and not imports.is_torch_xla_available()


def _xpu() -> bool:
    return imports.is_xpu_available()


def _hpu() -> bool:
    return imports.is_hpu_available()


def _any_tracker() -> bool:
    # comet_ml starts logging on import, which breaks the trackers' tests, so it must be absent.
    return (
        available("is_wandb_available", "wandb") or available("is_tensorboard_available", "tensorboard")
    ) and (not available("is_comet_ml_available", "comet_ml"))


def _tp() -> bool:
    return (
        imports.is_torch_version(">=", BETA_TP_AVAILABLE_PYTORCH_VERSION)
        and available("is_transformers_available", "transformers")
        and imports.compare_versions("transformers", ">=", BETA_TP_AVAILABLE_TRANSFORMERS_VERSION)
    )


def _fp8() -> bool:
    if hasattr(imports, "is_fp8_available"):
        return bool(imports.is_fp8_available())
    return (
        available("is_msamp_available", "msamp")
        or available("is_transformer_engine_available", "transformer_engine")
        or available("is_torchao_available", "torchao")
    )


def _fp16() -> bool:
    return bool(imports.is_fp16_available()) if hasattr(imports, "is_fp16_available") else True


def _lib(check: str, *modules: str) -> Callable[[], bool]:
    return lambda: available(check, *modules)


# hardware
require_cpu = _requires(lambda: torch_device == "cpu", "test requires only a CPU", "require_cpu")
require_non_cpu = _requires(
    lambda: torch_device != "cpu", "test requires a hardware accelerator", "require_non_cpu"
)
require_cuda = _requires(_cuda, "test requires a CUDA GPU (and no torch_xla)", "require_cuda")
require_cuda_or_xpu = _requires(
    lambda: _cuda() or _xpu(), "test requires a CUDA GPU or an XPU", "require_cuda_or_xpu"
)
require_cuda_or_hpu = _requires(
    lambda: _cuda() or _hpu(), "test requires a CUDA GPU or an HPU", "require_cuda_or_hpu"
)
require_xpu = _requires(_xpu, "test requires an XPU", "require_xpu")
require_non_xpu = _requires(lambda: torch_device != "xpu", "test must not run on an XPU", "require_non_xpu")
require_non_hpu = _requires(lambda: torch_device != "hpu", "test must not run on an HPU", "require_non_hpu")
require_npu = _requires(lambda: imports.is_npu_available(), "test requires an NPU", "require_npu")
require_mlu = _requires(lambda: family_count("mlu") > 0, "test requires an MLU", "require_mlu")
require_musa = _requires(lambda: family_count("musa") > 0, "test requires a MUSA device", "require_musa")
require_sdaa = _requires(lambda: family_count("sdaa") > 0, "test requires an SDAA device", "require_sdaa")
require_neuron = _requires(
    lambda: family_count("neuron") > 0, "test requires an AWS Neuron device", "require_neuron"
)
require_mps = _requires(lambda: imports.is_mps_available(), "test requires Apple MPS", "require_mps")
require_tpu = _requires(
    lambda: imports.is_torch_xla_available(check_is_tpu=True),
    "test requires a TPU (torch_xla)",
    "require_tpu",
)
require_non_torch_xla = _requires(
    lambda: not imports.is_torch_xla_available(), "test must run without torch_xla", "require_non_torch_xla"
)
require_single_device = _requires(
    lambda: torch_device != "cpu" and device_count == 1,
    "test requires exactly one hardware accelerator",
    "require_single_device",
)
require_single_gpu = _requires(
    lambda: family_count("cuda") == 1, "test requires exactly one CUDA GPU", "require_single_gpu"
)
require_single_xpu = _requires(
    lambda: family_count("xpu") == 1, "test requires exactly one XPU", "require_single_xpu"
)
require_multi_device = _requires(
    lambda: device_count > 1, "test requires several hardware accelerators", "require_multi_device"
)
require_multi_gpu = _requires(
    lambda: family_count("cuda") > 1, "test requires several CUDA GPUs", "require_multi_gpu"
)
require_multi_xpu = _requires(
    lambda: family_count("xpu") > 1, "test requires several XPUs", "require_multi_xpu"
)
require_multi_gpu_or_xpu = _requires(
    lambda: (_cuda() or _xpu()) and device_count > 1,
    "test requires several CUDA GPUs or XPUs",
    "require_multi_gpu_or_xpu",
)
require_fp16 = _requires(_fp16, "test requires fp16 support", "require_fp16")
require_fp8 = _requires(
    _fp8, "test requires an fp8 backend (transformer_engine, torchao or MS-AMP)", "require_fp8"
)

# libraries
require_huggingface_suite = _requires(
    lambda: (
        available("is_transformers_available", "transformers")
        and available("is_datasets_available", "datasets")
    ),
    "test requires transformers and datasets",
    "require_huggingface_suite",
)
require_transformers = _requires(
    _lib("is_transformers_available", "transformers"), "test requires transformers", "require_transformers"
)
require_datasets = _requires(
    _lib("is_datasets_available", "datasets"), "test requires datasets", "require_datasets"
)
require_peft = _requires(_lib("is_peft_available", "peft"), "test requires peft", "require_peft")
require_timm = _requires(_lib("is_timm_available", "timm"), "test requires timm", "require_timm")
require_torchvision = _requires(
    _lib("is_torchvision_available", "torchvision"), "test requires torchvision", "require_torchvision"
)
require_triton = _requires(_lib("is_triton_available", "triton"), "test requires triton", "require_triton")
require_schedulefree = _requires(
    _lib("is_schedulefree_available", "schedulefree"), "test requires schedulefree", "require_schedulefree"
)
require_pandas = _requires(_lib("is_pandas_available", "pandas"), "test requires pandas", "require_pandas")
require_matplotlib = _requires(
    _lib("is_matplotlib_available", "matplotlib"), "test requires matplotlib", "require_matplotlib"
)
require_bnb = _requires(_lib("is_bnb_available", "bitsandbytes"), "test requires bitsandbytes", "require_bnb")
require_torchao = _requires(
    _lib("is_torchao_available", "torchao"), "test requires torchao", "require_torchao"
)
require_deepspeed = _requires(
    _lib("is_deepspeed_available", "deepspeed"), "test requires DeepSpeed", "require_deepspeed"
)
require_import_timer = _requires(
    _lib("is_import_timer_available", "import_timer"), "test requires import-timer", "require_import_timer"
)
require_torchdata_stateful_dataloader = _requires(
    _lib("is_torchdata_stateful_dataloader_available", "torchdata.stateful_dataloader"),
    "test requires torchdata's StatefulDataLoader",
    "require_torchdata_stateful_dataloader",
)
require_transformer_engine = _requires(
    _lib("is_transformer_engine_available", "transformer_engine"),
    "test requires transformer_engine",
    "require_transformer_engine",
)
require_transformer_engine_mxfp8 = _requires(
    _lib("is_transformer_engine_mxfp8_available"),
    "test requires transformer_engine with MXFP8 support (a GPU of compute capability 10.0 or newer)",
    "require_transformer_engine_mxfp8",
)
require_pippy = _requires(
    lambda: (
        available("is_pippy_available")
        if hasattr(imports, "is_pippy_available")
        else imports.is_torch_version(">=", "2.4.0")
    ),
    "test requires pipeline parallelism (torch.distributed.pipelining, torch >= 2.4)",
    "require_pippy",
)
require_fsdp = _requires(
    lambda: imports.is_torch_version(">=", FSDP_PYTORCH_VERSION),
    f"test requires torch >= {FSDP_PYTORCH_VERSION}",
    "require_fsdp",
)
require_fsdp2 = _requires(
    lambda: imports.is_torch_version(">=", FSDP2_PYTORCH_VERSION),
    f"test requires torch >= {FSDP2_PYTORCH_VERSION} (FSDP2)",
    "require_fsdp2",
)
require_tp = _requires(
    _tp,
    f"test requires torch >= {BETA_TP_AVAILABLE_PYTORCH_VERSION} and transformers >= "
    f"{BETA_TP_AVAILABLE_TRANSFORMERS_VERSION} (tensor parallelism)",
    "require_tp",
)

# trackers
require_wandb = _requires(_lib("is_wandb_available", "wandb"), "test requires wandb", "require_wandb")
require_comet_ml = _requires(
    _lib("is_comet_ml_available", "comet_ml"), "test requires comet_ml", "require_comet_ml"
)
require_clearml = _requires(
    _lib("is_clearml_available", "clearml"), "test requires clearml", "require_clearml"
)
require_tensorboard = _requires(
    _lib("is_tensorboard_available", "tensorboard"), "test requires tensorboard", "require_tensorboard"
)
require_aim = _requires(_lib("is_aim_available", "aim"), "test requires aim", "require_aim")
require_mlflow = _requires(_lib("is_mlflow_available", "mlflow"), "test requires mlflow", "require_mlflow")
require_dvclive = _requires(
    _lib("is_dvclive_available", "dvclive"), "test requires dvclive", "require_dvclive"
)
require_swanlab = _requires(
    _lib("is_swanlab_available", "swanlab"), "test requires swanlab", "require_swanlab"
)
require_trackio = _requires(
    _lib("is_trackio_available", "trackio"), "test requires trackio", "require_trackio"
)
require_trackers = _requires(
    _any_tracker,
    "test requires wandb or tensorboard, and comet_ml not installed",
    "require_trackers",
)


# --- assertions and captures -----------------------------------------------------------------------


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Tell whether ``tensor`` holds the same values on every process (a collective: all must call).

    Raises:
        RuntimeError: the processes' tensors differ in shape (the gather cannot line them up).
    """
    from accelerando.state import AcceleratorState
    from accelerando.utils.operations import gather

    state = AcceleratorState()
    local = tensor[None].clone().to(state.device)
    everyone = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))


@contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """Context manager: the block must raise ``exception_class`` (with ``msg`` in its text, if given).

    Raises:
        AssertionError: the block raised nothing, another exception type, or a message without ``msg``.
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any exception is inspected, then judged
        if not isinstance(exc, exception_class):
            raise AssertionError(
                f"Expected exception of type {exception_class} but got {type(exc)}: {exc}"
            ) from exc
        if msg is not None and msg not in str(exc):
            raise AssertionError(f"Expected message '{msg}' to be in exception but got '{exc}'") from exc
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Call ``func(*args, **kwargs)`` and return what it printed to stdout.

    Raises:
        Exception: whatever ``func`` raises (stdout is restored first).
    """
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        func(*args, **kwargs)
    return buffer.getvalue()


__all__ = [
    "DEFAULT_LAUNCH_COMMAND",
    "AccelerateTestCase",
    "MockingTestCase",
    "SubprocessCallException",
    "TempDirTestCase",
    "are_the_same_tensors",
    "assert_exception",
    "capture_call_output",
    "device_count",
    "execute_subprocess_async",
    "get_backend",
    "get_launch_command",
    "get_torch_dist_unique_port",
    "memory_allocated_func",
    "parse_flag_from_env",
    "path_in_accelerate_package",
    "pytest_xdist_worker_id",
    "run_command",
    "run_first",
    "skip",
    "slow",
    "torch_device",
    *sorted(name for name in list(globals()) if name.startswith("require_")),
]
