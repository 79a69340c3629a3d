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
from typing import TypeVar, overload

import torch

import accelerando
from accelerando.common import imports
from accelerando.common.constants import (
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_PYTORCH_VERSION,
)

# The reference's testing module imports these helpers, and test suites import them from it
# (`from accelerate.test_utils.testing import is_xpu_available`): the same objects, from their owners.
from accelerando.common.environment import check_cuda_fp8_capability, parse_flag_from_env, str_to_bool  # noqa: F401
from accelerando.common.imports import (  # noqa: F401
    compare_versions,
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_habana_gaudi1,
    is_hpu_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pytest_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_version,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)
from accelerando.common.operations import gather
from accelerando.state import AcceleratorState, GradientState  # noqa: F401 (GradientState: as the reference's module)
from accelerando.test_utils._backend import available, family_count, get_backend
from accelerando.test_utils._cases import AccelerateTestCase, MockingTestCase, TempDirTestCase
from accelerando.test_utils._subprocess import SubprocessCallException, execute_subprocess_async, run_command

# A test: a test function or a TestCase class.
T = TypeVar("T", bound=Callable[..., object])

torch_device, device_count, memory_allocated_func = get_backend()


# --- launching -------------------------------------------------------------------------------------


def get_launch_command(**kwargs: object) -> list[str]:
    """Build an ``accelerando launch`` command line from keyword arguments.

    ``True`` adds ``--name``; ``False`` and ``None`` add nothing; any other value adds ``--name=value``.
    The script and its arguments are appended by the caller. When this process runs accelerando as
    ``accelerate`` (``accelerando.core.stand_in.install_as_accelerate()``), ``--install_as_accelerate`` is
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
    stand_in = sys.modules.get("accelerando.core.stand_in")  # never imported here: only asked if in use
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
    return Path(inspect.getfile(accelerando)).parent.joinpath(*components)


# --- skip decorators -------------------------------------------------------------------------------


def _requires(condition: Callable[[], bool], reason: str, name: str) -> Callable[[T], T]:
    """Build the skip decorator ``name``: it skips a test (function or TestCase class) unless ``condition()``.

    The condition is asked when the decorator is applied, i.e. when the test module is imported.
    """

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


@overload
def require_torch_min_version(test_case: None = None, version: str | None = None) -> Callable[[T], T]: ...


@overload
def require_torch_min_version(test_case: T, version: str | None = None) -> T: ...


def require_torch_min_version(test_case: T | None = None, version: str | None = None) -> T | Callable[[T], T]:
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


# Conditions read the module's globals (torch_device, device_count, family_count, imports.*) at each
# call, so a test that monkeypatches them sees its decorators follow.


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


# decorator name: (condition, why the test is skipped when the condition fails)
_CONDITIONS: dict[str, tuple[Callable[[], bool], str]] = {
    # hardware
    "require_cpu": (lambda: torch_device == "cpu", "test requires only a CPU"),
    "require_non_cpu": (lambda: torch_device != "cpu", "test requires a hardware accelerator"),
    "require_cuda": (_cuda, "test requires a CUDA GPU (and no torch_xla)"),
    "require_cuda_or_xpu": (lambda: _cuda() or _xpu(), "test requires a CUDA GPU or an XPU"),
    "require_cuda_or_hpu": (lambda: _cuda() or _hpu(), "test requires a CUDA GPU or an HPU"),
    "require_xpu": (_xpu, "test requires an XPU"),
    "require_non_xpu": (lambda: torch_device != "xpu", "test must not run on an XPU"),
    "require_non_hpu": (lambda: torch_device != "hpu", "test must not run on an HPU"),
    "require_npu": (lambda: imports.is_npu_available(), "test requires an NPU"),
    "require_mlu": (lambda: family_count("mlu") > 0, "test requires an MLU"),
    "require_musa": (lambda: family_count("musa") > 0, "test requires a MUSA device"),
    "require_sdaa": (lambda: family_count("sdaa") > 0, "test requires an SDAA device"),
    "require_neuron": (lambda: family_count("neuron") > 0, "test requires an AWS Neuron device"),
    "require_mps": (lambda: imports.is_mps_available(), "test requires Apple MPS"),
    "require_tpu": (
        lambda: imports.is_torch_xla_available(check_is_tpu=True),
        "test requires a TPU (torch_xla)",
    ),
    "require_non_torch_xla": (
        lambda: not imports.is_torch_xla_available(),
        "test must run without torch_xla",
    ),
    "require_single_device": (
        lambda: torch_device != "cpu" and device_count == 1,
        "test requires exactly one hardware accelerator",
    ),
    "require_single_gpu": (lambda: family_count("cuda") == 1, "test requires exactly one CUDA GPU"),
    "require_single_xpu": (lambda: family_count("xpu") == 1, "test requires exactly one XPU"),
    "require_multi_device": (lambda: device_count > 1, "test requires several hardware accelerators"),
    "require_multi_gpu": (lambda: family_count("cuda") > 1, "test requires several CUDA GPUs"),
    "require_multi_xpu": (lambda: family_count("xpu") > 1, "test requires several XPUs"),
    "require_multi_gpu_or_xpu": (
        lambda: (_cuda() or _xpu()) and device_count > 1,
        "test requires several CUDA GPUs or XPUs",
    ),
    "require_fp16": (lambda: imports.is_fp16_available(), "test requires fp16 support"),
    "require_fp8": (
        lambda: imports.is_fp8_available(),
        "test requires an fp8 backend (transformer_engine, torchao or MS-AMP)",
    ),
    # torch features and library combinations
    "require_huggingface_suite": (
        lambda: (
            available("is_transformers_available", "transformers")
            and available("is_datasets_available", "datasets")
        ),
        "test requires transformers and datasets",
    ),
    "require_pippy": (
        lambda: imports.is_pippy_available(),
        "test requires pipeline parallelism (torch.distributed.pipelining, torch >= 2.4)",
    ),
    "require_fsdp": (
        lambda: imports.is_torch_version(">=", FSDP_PYTORCH_VERSION),
        f"test requires torch >= {FSDP_PYTORCH_VERSION}",
    ),
    "require_fsdp2": (
        lambda: imports.is_torch_version(">=", FSDP2_PYTORCH_VERSION),
        f"test requires torch >= {FSDP2_PYTORCH_VERSION} (FSDP2)",
    ),
    "require_tp": (
        _tp,
        f"test requires torch >= {BETA_TP_AVAILABLE_PYTORCH_VERSION} and transformers >= "
        f"{BETA_TP_AVAILABLE_TRANSFORMERS_VERSION} (tensor parallelism)",
    ),
    "require_trackers": (_any_tracker, "test requires wandb or tensorboard, and comet_ml not installed"),
}

# One library each: require_<key> skips unless imports.is_<key>_available() holds (or, where that
# check does not exist, the modules import). key: (what the skip reason names, modules).
_LIBRARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "transformers": ("transformers", ("transformers",)),
    "datasets": ("datasets", ("datasets",)),
    "peft": ("peft", ("peft",)),
    "timm": ("timm", ("timm",)),
    "torchvision": ("torchvision", ("torchvision",)),
    "triton": ("triton", ("triton",)),
    "schedulefree": ("schedulefree", ("schedulefree",)),
    "pandas": ("pandas", ("pandas",)),
    "matplotlib": ("matplotlib", ("matplotlib",)),
    "bnb": ("bitsandbytes", ("bitsandbytes",)),
    "torchao": ("torchao", ("torchao",)),
    "deepspeed": ("DeepSpeed", ("deepspeed",)),
    "import_timer": ("import-timer", ("import_timer",)),
    "torchdata_stateful_dataloader": ("torchdata's StatefulDataLoader", ("torchdata.stateful_dataloader",)),
    "transformer_engine": ("transformer_engine", ("transformer_engine",)),
    "transformer_engine_mxfp8": (
        "transformer_engine with MXFP8 support (a GPU of compute capability 10.0 or newer)",
        (),
    ),
    # trackers
    "wandb": ("wandb", ("wandb",)),
    "comet_ml": ("comet_ml", ("comet_ml",)),
    "clearml": ("clearml", ("clearml",)),
    "tensorboard": ("tensorboard", ("tensorboard",)),
    "aim": ("aim", ("aim",)),
    "mlflow": ("mlflow", ("mlflow",)),
    "dvclive": ("dvclive", ("dvclive",)),
    "swanlab": ("swanlab", ("swanlab",)),
    "trackio": ("trackio", ("trackio",)),
}


def _library_condition(key: str, modules: tuple[str, ...]) -> Callable[[], bool]:
    return lambda: available(f"is_{key}_available", *modules)


_CONDITIONS.update(
    {
        f"require_{key}": (_library_condition(key, modules), f"test requires {label}")
        for key, (label, modules) in _LIBRARIES.items()
    }
)
globals().update(
    {name: _requires(condition, reason, name) for name, (condition, reason) in _CONDITIONS.items()}
)


# --- assertions and captures -----------------------------------------------------------------------


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Tell whether ``tensor`` holds the same values on every process (a collective: all must call).

    Raises:
        RuntimeError: the processes' tensors differ in shape (the gather cannot line them up).
    """
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


def capture_call_output(func: Callable[..., object], *args: object, **kwargs: object) -> str:
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
    "require_torch_min_version",
    *sorted(_CONDITIONS),
]
