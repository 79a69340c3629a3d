"""MS-AMP FP8 (fp8_backend "msamp"): the prepare hook and the DeepSpeed config block.

Real MS-AMP needs a CUDA GPU and cannot be installed on this machine, so these tests check what
accelerando itself does at the boundary with it:

* which ``opt_level`` reaches MS-AMP, from each place it can be given (``MSAMPRecipeKwargs``,
  ``FP8RecipeKwargs``, the config file's ``fp8_config``, ``ACCELERATE_FP8_OPT_LEVEL``);
* that prepare calls ``msamp.initialize(model, optimizer, opt_level=...)`` with the one model and
  optimizer of the call, and refuses anything else;
* that under DeepSpeed the config gets ``{"msamp": {"enabled": True, "opt_level": ...}}`` and the engine
  is built by ``msamp.deepspeed.initialize``.

For the call boundary a TEST DOUBLE of the ``msamp`` package (written to a temporary folder put on
``sys.path``; it records its calls and converts nothing) stands in for MS-AMP, and the CUDA check of the
backend choice is patched to accept this CPU. The real package is exercised by
``tests/devices/test_gpu.py`` on a GPU machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando.backends.precision.fp8 import choice as fp8_choice

# --------------------------------------------------------------------------------- test doubles
FAKE_MSAMP_INIT = '''\
"""TEST DOUBLE of MS-AMP (github.com/Azure/MS-AMP), written by tests/precision/test_msamp.py.

Real MS-AMP needs CUDA; this stand-in only records how accelerando calls it and returns its
arguments unchanged (no FP8 conversion happens).
"""
CALLS = []


def initialize(model, optimizer=None, opt_level="O1"):
    CALLS.append({"fn": "initialize", "model": model, "optimizer": optimizer, "opt_level": opt_level})
    return model, optimizer
'''

FAKE_MSAMP_DEEPSPEED = '''\
"""TEST DOUBLE of msamp.deepspeed: records the config, then builds a plain DeepSpeed engine."""
import json
import re
import os

from msamp import CALLS


def initialize(*args, **kwargs):
    config = kwargs["config"]
    CALLS.append({"fn": "deepspeed.initialize", "msamp": config.get("msamp")})
    if os.environ.get("FAKE_MSAMP_RECORD"):
        with open(os.environ["FAKE_MSAMP_RECORD"], "w") as f:
            json.dump(CALLS[-1], f)
    import deepspeed

    plain = {k: v for k, v in config.items() if k != "msamp"}
    return deepspeed.initialize(*args, **{**kwargs, "config": plain})
'''


def write_fake_msamp(folder: Path) -> Path:
    """Write the ``msamp`` test double under ``folder`` and return ``folder`` (to put on sys.path)."""
    package = folder / "msamp"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(FAKE_MSAMP_INIT)
    (package / "deepspeed.py").write_text(FAKE_MSAMP_DEEPSPEED)
    return folder


@pytest.fixture
def fake_msamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ``msamp`` test double importable for the test; forgotten afterwards."""
    from accelerando.common import imports

    monkeypatch.syspath_prepend(str(write_fake_msamp(tmp_path / "fake")))
    for name in ("msamp", "msamp.deepspeed"):
        sys.modules.pop(name, None)
    imports.is_package_available.cache_clear()  # an earlier test may have cached "msamp: absent"
    import msamp

    yield msamp
    for name in ("msamp", "msamp.deepspeed"):
        sys.modules.pop(name, None)
    imports.is_package_available.cache_clear()


@pytest.fixture
def msamp_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test double for "a CUDA GPU and MS-AMP are here": the backend check accepts msamp on CPU."""
    real = fp8_choice.fp8_backend_problem
    monkeypatch.setattr(fp8_choice, "fp8_backend_problem", lambda b, d: None if b == "msamp" else real(b, d))


@pytest.fixture(autouse=True)
def _no_fp8_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if "FP8" in name or "DEEPSPEED" in name or name.endswith("MIXED_PRECISION"):
            monkeypatch.delenv(name)


def _msamp_precision(handlers: dict[type, Any] | None = None) -> Any:
    from accelerando.backends.precision.fp8 import build_fp8_precision

    return build_fp8_precision("cuda", handlers or {})


def _ds_config(precision: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config resolved for one prepare call under ``precision``."""
    from accelerando import DeepSpeedPlugin
    from accelerando.backends.strategies.deepspeed.msamp import msamp_opt_level
    from accelerando.backends.strategies.deepspeed.resolve import PrepareInputs, resolve_config

    plugin = DeepSpeedPlugin(hf_ds_config=config) if config is not None else DeepSpeedPlugin(zero_stage=1)
    model = torch.nn.Linear(4, 2)
    inputs = PrepareInputs(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        scheduler=None,
        batch_sizes=[4],
        num_processes=1,
        gradient_accumulation_steps=1,
        mixed_precision="fp8",
        device=torch.device("cpu"),
        msamp_opt_level=msamp_opt_level(precision),
    )
    return resolve_config(plugin, inputs)[0]


# ------------------------------------------------------------------- the DeepSpeed config block
def test_deepspeed_config_block_from_each_recipe_source(
    fresh_state: Any, msamp_runs_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerando.plugins.kwargs import FP8RecipeKwargs, MSAMPRecipeKwargs

    def block(handlers: dict[type, Any] | None = None) -> Any:
        return _ds_config(_msamp_precision(handlers)).get("msamp")

    assert block({MSAMPRecipeKwargs: MSAMPRecipeKwargs()}) == {"enabled": True, "opt_level": "O2"}
    config = _ds_config(_msamp_precision({MSAMPRecipeKwargs: MSAMPRecipeKwargs()}))
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False  # as MS-AMP's own setup
    assert block({MSAMPRecipeKwargs: MSAMPRecipeKwargs(opt_level="O1")})["opt_level"] == "O1"
    with pytest.warns(FutureWarning):
        legacy = FP8RecipeKwargs(backend="msamp", opt_level="O1")
    assert block({FP8RecipeKwargs: legacy}) == {"enabled": True, "opt_level": "O1"}
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "msamp")
    assert block() == {"enabled": True, "opt_level": "O2"}  # the setting alone selects MS-AMP
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    assert block() == {"enabled": True, "opt_level": "O1"}
    assert block({MSAMPRecipeKwargs: MSAMPRecipeKwargs(opt_level="O2")})["opt_level"] == "O2"  # code wins


def test_config_file_fp8_config_reaches_the_deepspeed_block(
    fresh_state: Any, msamp_runs_here: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    """The launcher exports the config file's fp8_config; the process's recipe and config read it."""
    from accelerando.commands import launch

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\nmixed_precision: fp8\nnum_processes: 1\n"
        "fp8_config:\n  backend: MSAMP\n  opt_level: O1\n"
    )
    assert launch.main(["--dry-run", "--cpu", "--config_file", str(config), "t.py"]) == 0
    exported = dict(
        line.strip().split("=", 1)
        for line in capsys.readouterr().out.splitlines()
        if line.strip().startswith(("ACCELERATE_FP8", "ACCELERANDO_FP8"))
    )
    assert exported, "the launcher exported no fp8 setting"
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    assert _ds_config(_msamp_precision())["msamp"] == {"enabled": True, "opt_level": "O1"}


def test_a_block_in_the_deepspeed_config_wins(fresh_state: Any, msamp_runs_here: None, caplog: Any) -> None:
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs

    precision = _msamp_precision({MSAMPRecipeKwargs: MSAMPRecipeKwargs(opt_level="O2")})
    base = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 1}}
    with caplog.at_level("WARNING"):
        config = _ds_config(precision, {**base, "msamp": {"enabled": True, "opt_level": "O1"}})
    assert (
        config["msamp"] == {"enabled": True, "opt_level": "O1"} and "opt_level=O2 is ignored" in caplog.text
    )
    assert _ds_config(precision, {**base, "msamp": {"enabled": True}})["msamp"]["opt_level"] == "O2"
    with pytest.raises(ValueError, match=r'"enabled": false.*fp8_backend'):
        _ds_config(precision, {**base, "msamp": {"enabled": False}})


def test_deepspeed_plugin_enable_msamp_makes_the_engine_convert(
    fresh_state: Any, fake_msamp: Any, caplog: Any
) -> None:
    """DeepSpeedPlugin(enable_msamp=True) alone: its block is used and no precision converts the model."""
    from accelerando import DeepSpeedPlugin
    from accelerando.backends.precision import Precision
    from accelerando.backends.precision.fp8.ao import AOPrecision
    from accelerando.backends.strategies.deepspeed.msamp import converts_in_engine

    plugin = DeepSpeedPlugin(zero_stage=1, enable_msamp=True, msamp_opt_level="O1")
    assert plugin.deepspeed_config["msamp"] == {"enabled": True, "opt_level": "O1"}
    assert converts_in_engine(Precision(), plugin.deepspeed_config)
    with caplog.at_level("WARNING"):
        assert converts_in_engine(AOPrecision("cpu", None), plugin.deepspeed_config)
    assert "the FP8 backend 'ao' is not applied" in caplog.text
    assert not converts_in_engine(Precision(), DeepSpeedPlugin(zero_stage=1).deepspeed_config)


def test_no_block_without_msamp(fresh_state: Any) -> None:
    from accelerando.backends.precision import Precision
    from accelerando.backends.strategies.deepspeed.msamp import engine_initializer

    config = _ds_config(Precision())
    assert "msamp" not in config
    import deepspeed

    assert engine_initializer(config) is deepspeed.initialize


def test_engine_initializer_is_msamp_deepspeed_when_enabled(
    fake_msamp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerando.backends.strategies.deepspeed import msamp as ds_msamp
    from accelerando.common import imports

    config = {"msamp": {"enabled": True, "opt_level": "O2"}}
    import msamp.deepspeed

    assert ds_msamp.engine_initializer(config) is msamp.deepspeed.initialize
    monkeypatch.setattr(imports, "is_msamp_available", lambda: False)
    with pytest.raises(ImportError, match=r"needs the msamp package.*fp8_backend='ao'"):
        ds_msamp.engine_initializer(config)


# --------------------------------------------------------------------------- the prepare hook
def test_prepare_objects_calls_msamp_initialize_with_the_pair(
    fresh_state: Any, msamp_runs_here: None, fake_msamp: Any
) -> None:
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs

    precision = _msamp_precision({MSAMPRecipeKwargs: MSAMPRecipeKwargs(opt_level="O1")})
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(list(range(4)))
    objects = precision.prepare_objects(
        (loader, optimizer, model), [True] * 3, torch.device("cpu"), lambda o: False
    )
    assert objects == [loader, optimizer, model]
    (call,) = fake_msamp.CALLS
    assert (call["model"], call["optimizer"], call["opt_level"]) == (model, optimizer, "O1")
    assert precision.convert_module(model) is model
    # a call without models or optimizers passes through; already prepared objects are left alone
    assert precision.prepare_objects((loader,), [True], None, lambda o: False) == [loader]
    assert precision.prepare_objects((model, optimizer), [True] * 2, None, lambda o: True) == [
        model,
        optimizer,
    ]
    assert len(fake_msamp.CALLS) == 1


def test_prepare_objects_refuses_anything_but_one_pair(
    fresh_state: Any, msamp_runs_here: None, fake_msamp: Any
) -> None:
    precision = _msamp_precision()
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    for objects, counts in (
        ((a, b, opt_a), "2 model(s) and 1 optimizer"),
        ((a, opt_a, opt_b), "1 model(s) and 2 optimizer"),
        ((a,), "1 model(s) and 0 optimizer"),
        ((opt_a,), "0 model(s) and 1 optimizer"),
    ):
        with pytest.raises(ValueError, match=rf"MS-AMP converts one model together.*{re.escape(counts)}"):
            precision.prepare_objects(objects, [True] * len(objects), None, lambda o: False)
    assert fake_msamp.CALLS == []
    with pytest.raises(ValueError, match=r"pass both to one accelerator.prepare\(model, optimizer"):
        precision.convert_module(a)


def test_msamp_with_fsdp_is_refused(
    fresh_state: Any, msamp_runs_here: None, fake_msamp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import accelerando.core.runtime as rt

    precision = _msamp_precision()
    fsdp_runtime = types.SimpleNamespace(plugins=types.SimpleNamespace(fsdp=object()))
    monkeypatch.setattr(rt, "current", lambda: fsdp_runtime)
    model = torch.nn.Linear(4, 2)
    objects = (model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"not supported with FSDP.*fp8_backend='ao' with FSDP2"):
        precision.prepare_objects(objects, [True] * 2, None, lambda o: False)
    assert fake_msamp.CALLS == []


def test_msamp_on_this_cpu_is_refused_naming_ao(fresh_state: Any) -> None:
    from accelerando import Accelerator
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs

    with pytest.raises(RuntimeError, match=r"MS-AMP.*needs a CUDA GPU.*'ao'"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs()])


def test_accelerator_prepare_calls_msamp_initialize(
    fresh_state: Any, msamp_runs_here: None, fake_msamp: Any
) -> None:
    from accelerando import Accelerator
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs

    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level="O1")])
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    p_model, p_optimizer = acc.prepare(model, optimizer)
    (call,) = fake_msamp.CALLS
    assert call["model"] is model and call["optimizer"] is optimizer and call["opt_level"] == "O1"
    acc.backward(p_model(torch.ones(3, 4)).sum())
    p_optimizer.step()
    with pytest.raises(ValueError, match="2 model"):
        acc.prepare(torch.nn.Linear(4, 2), torch.nn.Linear(4, 2), torch.optim.SGD(model.parameters(), lr=0.1))


# ------------------------------------------------------------------------- DeepSpeed, for real
DS_SCRIPT = """
import torch

import accelerando.backends.precision.fp8.choice as choice
# Test double for "a CUDA GPU and MS-AMP are here": msamp (the stand-in on sys.path) passes the check.
choice.fp8_backend_problem = lambda backend, device: None

from accelerando import Accelerator, DeepSpeedPlugin
from accelerando.plugins.kwargs import MSAMPRecipeKwargs

acc = Accelerator(
    mixed_precision="fp8",
    deepspeed_plugin=DeepSpeedPlugin(zero_stage=1),
    kwargs_handlers=[MSAMPRecipeKwargs(opt_level="O1")],
)
torch.manual_seed(0)
# token ids in, as a language model: the engine runs in bf16 (as MS-AMP's DeepSpeed setup does)
model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randint(0, 16, (8, 3)), batch_size=4)
model, optimizer, loader = acc.prepare(model, optimizer, loader)
for batch in loader:
    acc.backward(model(batch).float().pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
print("TRAINED", type(model).__name__, next(model.parameters()).dtype)
"""


@pytest.mark.slow
@pytest.mark.usefixtures("deepspeed_cpu_op")
def test_deepspeed_engine_is_built_by_msamp_deepspeed(tmp_path: Path) -> None:
    """One real DeepSpeed process on CPU; its engine comes from the msamp test double's initialize."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = tmp_path / "record.json"
    (tmp_path / "train.py").write_text(DS_SCRIPT)
    fake = write_fake_msamp(tmp_path / "fake")
    env = {k: v for k, v in os.environ.items() if "FP8" not in k and "DEEPSPEED" not in k}
    env.update(
        PYTHONPATH=os.pathsep.join([str(fake), env.get("PYTHONPATH", "")]),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        FAKE_MSAMP_RECORD=str(record),
    )
    result = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "TRAINED DeepSpeedEngine torch.bfloat16" in result.stdout
    assert json.loads(record.read_text()) == {
        "fn": "deepspeed.initialize",
        "msamp": {"enabled": True, "opt_level": "O1"},
    }
