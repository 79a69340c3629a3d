"""DeepSpeed however the processes start: torchrun, ``accelerando launch``, the ``deepspeed`` launcher.

Slow (each launch imports torch and deepspeed in two fresh processes); run with
``python -m pytest -q -m slow tests/test_deepspeed_launch.py``.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Any

import pytest

from accelerando.common.imports import is_deepspeed_available, is_package_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_deepspeed_available(), reason="needs deepspeed"),
    pytest.mark.usefixtures("deepspeed_cpu_op"),
]

ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "DS_ACCELERATOR": "cpu"}

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from accelerando import Accelerator, DeepSpeedPlugin

    in_code = "code" in sys.argv[1:]
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2) if in_code else None
    acc = Accelerator(deepspeed_plugin=plugin)
    assert str(acc.distributed_type).endswith("DEEPSPEED"), acc.distributed_type
    assert acc.num_processes == 2, acc.num_processes
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(((model(x) - y) ** 2).mean())
            opt.step()
            opt.zero_grad()
    stage = model.zero_optimization_stage()
    config = model.config  # the engine's resolved config
    acc.print(f"OK stage={stage} gas={acc.gradient_accumulation_steps} train_batch={config['train_batch_size']}")
    """
)


def _script(tmp_path: Any) -> str:
    path = tmp_path / "ds_script.py"
    path.write_text(SCRIPT)
    return str(path)


def test_torchrun_with_plugin_in_code(tmp_path: Any) -> None:
    from accelerando.test_utils import launch_script

    proc = launch_script(_script(tmp_path), 2, args=("code",), env=ENV)
    # World size counted right: 4 per process x 2 accumulation x 2 processes.
    assert "OK stage=2 gas=2 train_batch=16" in proc.stdout, proc.stdout


def test_accelerando_launch_with_flags(tmp_path: Any) -> None:
    from accelerando.test_utils import execute_subprocess

    cmd = [
        sys.executable, "-m", "accelerando.commands.cli", "launch", "--use_deepspeed", "--zero_stage", "3",
        "--num_processes", "2", "--gradient_accumulation_steps", "2", "--cpu", _script(tmp_path), "launcher",
    ]  # fmt: skip
    proc = execute_subprocess(cmd, env=ENV)
    assert "OK stage=3 gas=2 train_batch=16" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("deepspeed") is None, reason="the deepspeed launcher is not on PATH")
def test_deepspeed_launcher_with_plugin_in_code(tmp_path: Any) -> None:
    from accelerando.test_utils import execute_subprocess, get_free_port

    cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(get_free_port()), _script(tmp_path), "code"]
    proc = execute_subprocess(cmd, env=ENV)
    assert "OK stage=2 gas=2 train_batch=16" in proc.stdout, proc.stdout + proc.stderr


TRANSFORMERS_SCRIPT = textwrap.dedent(
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from accelerando import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                  "stage3_prefetch_bucket_size": "auto",
                                  "stage3_param_persistence_threshold": "auto"},
        },
        zero3_init_flag=True,
    )
    acc = Accelerator(deepspeed_plugin=plugin)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)
    # Import-time code of a model module must not run under zero.Init's tensor patches; the class
    # is imported above, only construction happens inside.
    with acc.deepspeed_plugin.zero3_init_context_manager():
        model = LlamaForCausalLM(cfg)
    sharded = all(hasattr(p, "ds_id") for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (16, 8))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    for (x,) in loader:
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        opt.step()
    acc.print(f"OK sharded={sharded} bucket={model.config['zero_optimization']['reduce_bucket_size']}")
    """
)


@pytest.mark.skipif(not is_package_available("transformers"), reason="needs transformers")
def test_transformers_model_built_sharded_under_zero3_init(tmp_path: Any) -> None:
    from accelerando.test_utils import launch_script

    path = tmp_path / "hf_script.py"
    path.write_text(TRANSFORMERS_SCRIPT)
    proc = launch_script(str(path), 2, env=ENV)
    assert "OK sharded=True bucket=1024" in proc.stdout, proc.stdout
