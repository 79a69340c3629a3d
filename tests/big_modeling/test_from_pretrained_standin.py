"""transformers' ``from_pretrained(device_map=..., max_memory=..., offload_folder=...)`` placing and
offloading a tiny model through accelerando's big-model code, with accelerando standing in for
``accelerate`` (the real package is installed too; the stand-in must win).

Each scenario runs in a fresh interpreter: ``install_as_accelerate()`` is called before transformers is
imported. One child process runs every scenario (transformers' import is the expensive part) and
prints one JSON line the test checks. Logits are compared with ``torch.equal`` (bit-exact): the
offloaded model runs the same kernels on the same CPU tensors as the fully loaded one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

# transformers' import alone takes 30-100 s on a loaded 2-core machine, as for the other client tests.
pytestmark = pytest.mark.slow

_CHILD = r"""
import json, os, sys, tempfile
from accelerando.core.stand_in import install_as_accelerate
install_as_accelerate()
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

root = sys.argv[1]
out = {}
real_accelerate = [
    name for name, module in list(sys.modules.items())
    if name.split(".")[0] == "accelerate" and "site-packages/accelerate" in (getattr(module, "__file__", "") or "")
]
out["same_modules"] = all(
    sys.modules.get(f"accelerate.{name}") is sys.modules.get(f"accelerando.{name}")
    for name in ("big_modeling", "hooks", "utils.modeling")
    if f"accelerate.{name}" in sys.modules
)

def build(tied, safe):
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    folder = os.path.join(root, f"tied{int(tied)}_safe{int(safe)}")
    model.save_pretrained(folder)
    if not safe:
        # transformers 5 always writes safetensors; a pickled checkpoint is written by hand.
        from safetensors.torch import load_file
        weights = os.path.join(folder, "model.safetensors")
        torch.save(load_file(weights), os.path.join(folder, "pytorch_model.bin"))
        os.remove(weights)
    return model, folder

ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
explicit = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
            "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": "cpu",
            "model.rotary_emb": "cpu", "lm_head": "disk"}
scenarios = [
    ("auto_safetensors", False, True, "auto"),
    ("auto_tied", True, True, "auto"),
    ("auto_bin_resaved", False, False, "auto"),
    ("explicit_map", False, True, explicit),
]
for name, tied, safe, device_map in scenarios:
    plain, folder = build(tied, safe)
    with torch.no_grad():
        expected = plain(ids).logits
        expected_generate = plain.generate(ids[:1], max_new_tokens=4, do_sample=False)
    offload = os.path.join(root, f"offload_{name}")
    model = AutoModelForCausalLM.from_pretrained(
        folder, device_map=device_map, max_memory={"cpu": 110_000}, offload_folder=offload
    )
    with torch.no_grad():
        logits = model(ids).logits
        generated = model.generate(ids[:1], max_new_tokens=4, do_sample=False)
    placed = dict(model.hf_device_map)
    hook_classes = sorted({
        f"{type(m._hf_hook).__module__}.{type(m._hf_hook).__name__}"
        for m in model.modules() if hasattr(m, "_hf_hook")
    })
    devices = {}
    for param_name, param in model.named_parameters():
        probe = param_name
        while probe and probe not in placed:
            probe = probe.rpartition(".")[0]
        devices.setdefault(str(placed.get(probe, placed.get(""))), set()).add(param.device.type)
    out[name] = {
        "equal": torch.equal(logits, expected),
        "max_diff": (logits - expected).abs().max().item(),
        "generate_equal": torch.equal(generated, expected_generate),
        "map_values": sorted({str(v) for v in placed.values()}),
        "devices": {k: sorted(v) for k, v in devices.items()},
        "hook_classes": hook_classes,
        "offload_files": sorted(os.listdir(offload)) if os.path.isdir(offload) else [],
        "tied_after": (model.lm_head.weight is model.model.embed_tokens.weight) if tied else None,
    }

# transformers' DeepSpeed config classes are built on accelerate.utils.deepspeed.HfDeepSpeedConfig.
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
from accelerando.utils.deepspeed import HfDeepSpeedConfig
ds = HfTrainerDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
                               "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0})
ds.fill_match("train_micro_batch_size_per_gpu", 4, "per_device_train_batch_size")
ds.fill_match("gradient_clipping", 0.5, "max_grad_norm")
out["deepspeed"] = {
    "subclass": isinstance(ds, HfDeepSpeedConfig),
    "zero3": ds.is_zero3(), "offload": ds.is_offload(),
    "filled": ds.get_value("train_micro_batch_size_per_gpu"), "mismatches": len(ds.mismatches),
}
out["real_accelerate_imported"] = real_accelerate + [
    name for name, module in list(sys.modules.items())
    if name.split(".")[0] == "accelerate" and "site-packages/accelerate" in (getattr(module, "__file__", "") or "")
]
print("RESULT " + json.dumps(out))
"""


def _stand_in_available() -> bool:
    try:
        from accelerando.core.stand_in import install_as_accelerate  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    if not _stand_in_available():
        pytest.skip("accelerando.core.stand_in (install_as_accelerate) is not available")
    root = tmp_path_factory.mktemp("from_pretrained")
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=600, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


def test_transformers_used_accelerando_not_the_real_package(results):
    assert results["same_modules"] is True
    assert results["real_accelerate_imported"] == []
    for name in ("auto_safetensors", "auto_tied", "auto_bin_resaved", "explicit_map"):
        assert results[name]["hook_classes"] == ["accelerando.big_modeling.hooks.AlignDevicesHook"], name


@pytest.mark.parametrize("name", ["auto_safetensors", "auto_tied", "auto_bin_resaved", "explicit_map"])
def test_offloaded_model_gives_the_fully_loaded_logits(results, name):
    scenario = results[name]
    # Bit-exact: same kernels, same CPU tensors, only where the weights wait between forwards differs.
    assert scenario["equal"], scenario["max_diff"]
    assert scenario["generate_equal"]


@pytest.mark.parametrize("name", ["auto_safetensors", "auto_tied", "auto_bin_resaved", "explicit_map"])
def test_parameters_placed_per_device_map(results, name):
    scenario = results[name]
    # max_memory={"cpu": 110 kB} holds part of the ~180 kB model: the rest goes to disk.
    assert scenario["map_values"] == ["cpu", "disk"], scenario
    # CPU entries hold real CPU tensors; disk entries stay on meta, loaded by the hooks per forward.
    assert scenario["devices"] == {"cpu": ["cpu"], "disk": ["meta"]}, scenario


def test_tied_embeddings_stay_tied(results):
    assert results["auto_tied"]["tied_after"] is True


def test_disk_offload_reuses_safetensors_and_resaves_bin_weights(results):
    # Safetensors checkpoints are read in place: nothing is written to the offload folder.
    assert not any(f.endswith(".safetensors") for f in results["auto_safetensors"]["offload_files"])
    # A .bin checkpoint cannot be memory-mapped: its disk-offloaded weights are written there.
    assert any(f.startswith("model.layers.3.") for f in results["auto_bin_resaved"]["offload_files"])


def test_transformers_deepspeed_config_is_built_on_ours(results):
    assert results["deepspeed"] == {
        "subclass": True,
        "zero3": True,
        "offload": True,
        "filled": 4,
        "mismatches": 1,
    }
