"""Availability checks (accelerando.common.imports) and environment helpers (accelerando.common.environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

import pytest
import torch

from accelerando.common import imports
from accelerando.common.environment import (
    clear_environment,
    get_int_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    set_numa_affinity,
    str_to_bool,
)

_OPTIONAL = [
    "transformers",
    "deepspeed",
    "wandb",
    "tensorboard",
    "comet_ml",
    "mlflow",
    "datasets",
    "bitsandbytes",
    "rich",
    "tqdm",
    "matplotlib",
    "pynvml",
    "megatron",
    "torchdata",
    "habana_frameworks",
    "transformer_engine",
]

# torch itself may import some of these (e.g. tqdm, pynvml); only what the checks add counts.
_PROBE = """
import json, sys
import torch
baseline = set(sys.modules)
from accelerando import utils
# bitsandbytes advertises its multi-backend build only as a runtime attribute, so that one check
# imports it (where it is installed), as documented; every other check reads metadata only.
RUNTIME = {"is_bitsandbytes_multi_backend_available"}
names = [n for n in utils.__all__ if n.startswith("is_") and n.endswith("_available") and n not in RUNTIME]
answers = {n: bool(getattr(utils, n)()) for n in names}
print(json.dumps({"answers": answers, "loaded": [m for m in OPTIONAL if m in sys.modules and m not in baseline],
                  "cuda_initialized": torch.cuda.is_initialized()}))
"""


def test_every_check_answers_without_importing_packages_or_initialising_cuda():
    code = f"OPTIONAL = {_OPTIONAL!r}\n" + _PROBE
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["cuda_initialized"] is False
    assert len(report["answers"]) >= 30
    assert report["answers"]["is_transformers_available"] is True  # installed in the dev environment
    import importlib.util

    expected = importlib.util.find_spec("deepspeed") is not None
    assert report["answers"]["is_deepspeed_available"] is expected


def test_package_checks_and_dotted_names(monkeypatch):
    assert imports.is_package_available("torch")
    assert imports.is_package_available("torch.nn.functional")
    assert not imports.is_package_available("definitely_not_a_package_xyz")
    assert not imports.is_package_available("definitely_not_a_package_xyz.sub")
    assert not imports.is_package_available("json", "definitely-not-a-distribution-xyz")
    assert imports.is_cuda_available() == (torch.cuda.device_count() > 0)


def test_is_torch_version():
    assert imports.is_torch_version(">=", "2.0.0")
    assert imports.is_torch_version("<", "99.0")
    assert not imports.is_torch_version("==", "1.0")
    assert imports.compare_versions("torch", ">", "1.0")
    assert not imports.compare_versions("definitely-not-a-distribution-xyz", ">", "1.0")
    with pytest.raises(ValueError, match="comparison"):
        imports.is_torch_version("=>", "2.0")


def test_str_to_bool_and_flags(monkeypatch):
    assert str_to_bool("YES") == 1 and str_to_bool(" off ") == 0
    assert str_to_bool("true", to_bool=True) is True and str_to_bool(False, to_bool=True) is False
    with pytest.raises(ValueError, match="true"):
        str_to_bool("maybe")
    monkeypatch.setenv("UTILS_TEST_FLAG", "1")
    assert parse_flag_from_env("UTILS_TEST_FLAG") is True
    monkeypatch.setenv("UTILS_TEST_FLAG", "")
    assert parse_flag_from_env("UTILS_TEST_FLAG", default=True) is True
    monkeypatch.setenv("UTILS_TEST_FLAG", "perhaps")
    with pytest.raises(ValueError, match="UTILS_TEST_FLAG"):
        parse_flag_from_env("UTILS_TEST_FLAG")
    monkeypatch.setenv("UTILS_TEST_INT", "3")
    assert get_int_from_env(["UTILS_TEST_MISSING", "UTILS_TEST_INT"], 7) == 3
    assert get_int_from_env(["UTILS_TEST_MISSING"], 7) == 7


def test_patch_environment_restores_even_on_error(monkeypatch):
    monkeypatch.setenv("UTILS_TEST_EXISTING", "old")
    monkeypatch.delenv("UTILS_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with patch_environment(utils_test_existing="new", utils_test_new=5):
            assert os.environ["UTILS_TEST_EXISTING"] == "new"
            assert os.environ["UTILS_TEST_NEW"] == "5"
            raise RuntimeError("boom")
    assert os.environ["UTILS_TEST_EXISTING"] == "old"
    assert "UTILS_TEST_NEW" not in os.environ


def test_clear_environment(monkeypatch):
    monkeypatch.setenv("UTILS_TEST_KEEP", "1")
    before = dict(os.environ)
    with clear_environment():
        assert "UTILS_TEST_KEEP" not in os.environ and len(os.environ) == 0
        os.environ["UTILS_TEST_INSIDE"] = "x"
    assert dict(os.environ) == before


def test_purge_accelerate_environment_function_and_class(monkeypatch):
    monkeypatch.setenv("ACCELERATE_UTILS_TEST_KEPT", "original")
    monkeypatch.delenv("ACCELERATE_UTILS_TEST_ADDED", raising=False)

    @purge_accelerate_environment
    def sets_variables():
        os.environ["ACCELERATE_UTILS_TEST_ADDED"] = "1"
        os.environ["ACCELERATE_UTILS_TEST_KEPT"] = "changed"
        os.environ["ACCELERANDO_UTILS_TEST_ADDED"] = "1"
        return "done"

    assert sets_variables() == "done"
    assert "ACCELERATE_UTILS_TEST_ADDED" not in os.environ
    assert "ACCELERANDO_UTILS_TEST_ADDED" not in os.environ
    assert os.environ["ACCELERATE_UTILS_TEST_KEPT"] == "original"

    @purge_accelerate_environment
    class Case(unittest.TestCase):
        def test_sets(self):
            os.environ["ACCELERATE_UTILS_TEST_ADDED"] = "1"

    Case("test_sets").test_sets()
    assert "ACCELERATE_UTILS_TEST_ADDED" not in os.environ
    with pytest.raises(TypeError):
        purge_accelerate_environment(42)


def test_set_numa_affinity_is_a_safe_no_op_without_gpu():
    if imports.is_cuda_available() and imports.is_pynvml_available():
        pytest.skip("a GPU with NVML is present; the no-op path does not apply")
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert set_numa_affinity(0) is False
    if before is not None:
        assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError):
        set_numa_affinity(-1)
