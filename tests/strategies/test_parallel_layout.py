"""The automatic parallel layout (issue 17, item 6): a table over model sizes and machine shapes, invariants
checked with hypothesis, the ParallelismConfig hook-up, and what ``launch --dry-run`` / ``env`` show.

Models are given as facts or configs only: no weights are built. Memory sizes are GiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accelerando.core.parallelism_layout import (
    MachineShape,
    ModelFacts,
    choose_layout,
    estimate_memory,
    model_facts_from_config,
    model_facts_from_module,
    parse_memory,
)
from accelerando.parallelism_config import ParallelismConfig

G = 1024**3
MODELS = {
    "125M": ModelFacts(125_000_000, 12, 12, 12, 768, name="gpt-125m"),
    "1B": ModelFacts(1_100_000_000, 22, 32, 4, 2048, name="llama-1b"),
    "7B": ModelFacts(6_738_000_000, 32, 32, 32, 4096, name="llama-7b"),
    "70B": ModelFacts(68_977_000_000, 80, 64, 8, 8192, name="llama-70b"),
}
MACHINES = {
    "1x8x80": MachineShape(1, 8, 80 * G),
    "2x8x80": MachineShape(2, 8, 80 * G),
    "1x2x24": MachineShape(1, 2, 24 * G),
    "4x4x40": MachineShape(4, 4, 40 * G),
    "cpu16": MachineShape(1, 1, 16 * G, "cpu"),
    "8x8x80": MachineShape(8, 8, 80 * G),
    "2x4x40": MachineShape(2, 4, 40 * G),
    "4x2x24": MachineShape(4, 2, 24 * G),
}
PLAIN = "plain data parallelism"
# (model, machine, options, expected (tp, pp, dp_shard, dp_replicate) or None = nothing fits, phrase in the reason)
TABLE = [
    ("125M", "1x8x80", {}, (1, 1, 1, 8), PLAIN),
    ("125M", "2x8x80", {}, (1, 1, 1, 16), PLAIN),
    ("125M", "1x2x24", {}, (1, 1, 1, 2), PLAIN),
    ("125M", "4x4x40", {}, (1, 1, 1, 16), PLAIN),
    ("125M", "cpu16", {"mixed_precision": "no"}, (1, 1, 1, 1), PLAIN),
    ("1B", "1x8x80", {}, (1, 1, 1, 8), PLAIN),
    ("1B", "2x8x80", {}, (1, 1, 1, 16), PLAIN),
    ("1B", "1x2x24", {}, (2, 1, 1, 1), "sharding alone does not fit, so tensor parallelism over 2 devices"),
    ("1B", "4x4x40", {}, (1, 1, 1, 16), PLAIN),
    ("1B", "cpu16", {}, None, "16.0 GiB each"),
    ("7B", "1x8x80", {}, (1, 1, 4, 2), "FSDP sharding over 4 devices is enough"),
    ("7B", "2x8x80", {}, (1, 1, 4, 4), "4 data-parallel replicas use the rest"),
    ("7B", "1x2x24", {}, None, "24.0 GiB each"),
    ("7B", "4x4x40", {}, (1, 1, 16, 1), "FSDP sharding over 16 devices"),
    ("7B", "4x4x40", {"seq_length": 4096}, (4, 1, 4, 1), "tensor parallelism over 4 devices inside a node"),
    ("7B", "2x4x40", {"seq_length": 4096}, (4, 2, 1, 1), "2 pipeline stages across nodes (16 layers each)"),
    ("7B", "cpu16", {}, None, "16.0 GiB each"),
    ("1B", "4x2x24", {"seq_length": 4096}, (2, 2, 2, 1), "2 pipeline stages across nodes (11 layers each)"),
    ("70B", "1x8x80", {}, None, "1 node(s) x 8 device(s)"),
    ("70B", "2x8x80", {}, None, "tp=8 pp=2 dp_shard=1"),
    ("70B", "2x8x80", {"activation_checkpointing": True}, (1, 1, 16, 1), "FSDP sharding over 16 devices"),
    ("70B", "4x4x40", {}, None, "4 node(s) x 4 device(s)"),
    ("70B", "8x8x80", {}, (4, 1, 8, 2), "tensor parallelism over 4 devices inside a node, FSDP over 8"),
    ("70B", "1x8x80", {"training": False}, (1, 1, 2, 4), "FSDP sharding over 2 devices"),
]


@pytest.mark.parametrize(("model", "machine", "options", "expected", "phrase"), TABLE)
def test_layout_table(model: str, machine: str, options: dict, expected: tuple | None, phrase: str) -> None:
    facts, shape = MODELS[model], MACHINES[machine]
    if expected is None:
        with pytest.raises(ValueError) as err:
            choose_layout(facts, shape, **options)
        text = str(err.value)
        assert phrase in text
        assert "the smallest estimate is" in text and "GiB per device" in text and "usable" in text
        assert "Fix: more devices" in text and "offload" in text and "smaller micro-batch" in text
        return
    layout = choose_layout(facts, shape, **options)
    assert layout.sizes == expected, layout.reason
    assert layout.world_size == shape.world_size
    assert layout.memory_per_device <= layout.memory_budget <= shape.memory_per_device
    assert phrase in layout.reason[-1], layout.reason
    assert layout.reason[0].startswith(facts.name) and layout.reason[1].startswith("machine:")
    assert "bytes/parameter" in layout.reason[2] and "activations" in layout.reason[3]


def test_rejected_levels_are_named_with_their_numbers() -> None:
    layout = choose_layout(MODELS["7B"], MACHINES["4x4x40"], seq_length=4096)
    rejected = [line for line in layout.reason if "does not fit" in line]
    assert rejected[0].startswith("tp=1 pp=1 does not fit:") and "dp_shard=16" in rejected[0]
    assert any(line.startswith("tp=2 pp=1 does not fit:") for line in rejected)


def test_tp_excluded_when_it_does_not_divide_the_heads() -> None:
    twelve = ModelFacts(1_500_000_000, 24, 12, 12, 1536, name="twelve-heads")
    layout = choose_layout(twelve, MACHINES["1x8x80"], seq_length=16384)
    assert "tp=8 excluded: does not divide 12 attention heads" in layout.reason
    assert layout.sizes == (4, 2, 1, 1)  # tp stops at 4, so two pipeline stages inside the node
    assert "2 pipeline stages in a node (12 layers each)" in layout.reason[-1]
    gqa = ModelFacts(1_000_000_000, 16, 16, 2, 2048, name="gqa")
    layout = choose_layout(gqa, MACHINES["1x8x80"])
    assert "tp=4 excluded: does not divide 2 key/value heads" in layout.reason
    assert "tp=8 excluded: does not divide 2 key/value heads" in layout.reason


def test_unknown_heads_and_layers_keep_tp_and_pp_at_one() -> None:
    facts = ModelFacts(20_000_000_000)
    layout = choose_layout(facts, MACHINES["2x8x80"])
    assert layout.sizes == (1, 1, 16, 1)
    assert "tp=2 excluded: the model's attention head count is unknown" in layout.reason
    assert "pp > 1 excluded: the model's layer count is unknown" in layout.reason
    assert "activations not estimated" in layout.reason[3]


def test_memory_formula_terms() -> None:
    facts = ModelFacts(1_000_000_000, 10, 8, 8, 1024)
    sbh = 2048 * 1 * 1024
    act = sbh * (34 + 5 * 8 * 2048 / 1024)  # bf16: 2-byte elements, the formula's unit
    assert estimate_memory(facts) == int(16e9 + 10 * act)
    assert estimate_memory(facts, tp=2, pp=1, dp_shard=4) == int(16e9 / 8 + 1e8 * 2 / 2 + 10 * act / 2)
    assert estimate_memory(facts, mixed_precision="no") == int(16e9 + 2 * 10 * act)  # fp32: 4+4+8
    assert estimate_memory(facts, optimizer="sgd", mixed_precision="no") == int(8e9 + 2 * 10 * act)
    assert estimate_memory(facts, training=False) == int(2e9 + act)
    assert estimate_memory(facts, activation_checkpointing=True) == int(16e9 + 10 * 2 * sbh + act)


# --------------------------------------------------------------------------------- invariants
@st.composite
def _cases(draw):
    heads = draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32, 64]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64) if heads % d == 0]))
    facts = ModelFacts(
        num_parameters=draw(st.integers(1_000_000, 200_000_000_000)),
        num_layers=draw(st.integers(1, 96)),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        hidden_size=heads * draw(st.sampled_from([32, 64, 128])),
    )
    machine = MachineShape(
        draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 3, 4, 6, 8])), draw(st.integers(1, 96)) * G
    )
    options = {
        "batch_size": draw(st.integers(1, 8)),
        "seq_length": draw(st.sampled_from([128, 512, 2048, 8192])),
        "mixed_precision": draw(st.sampled_from(["no", "bf16"])),
        "activation_checkpointing": draw(st.booleans()),
    }
    return facts, machine, options


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_layout_invariants(case) -> None:
    facts, machine, options = case
    try:
        layout = choose_layout(facts, machine, **options)
    except ValueError as err:
        assert "GiB per device" in str(err) and "Fix:" in str(err)
        return
    tp, pp, dp_shard, dp_replicate = layout.sizes
    assert tp * pp * dp_shard * dp_replicate == machine.world_size
    assert machine.devices_per_node % tp == 0
    assert facts.num_attention_heads % tp == 0 and facts.kv_heads % tp == 0
    assert facts.num_layers % pp == 0
    assert layout.memory_per_device <= machine.memory_per_device * 0.9
    assert layout.memory_per_device == estimate_memory(facts, tp=tp, pp=pp, dp_shard=dp_shard, **options)
    assert not (tp > 1 and dp_replicate > 1 and dp_shard == 1)  # ParallelismConfig's rule
    # The least model parallelism: with tp or pp, sharding over every device alone would not fit;
    # with sharding, one device fewer in the shard group would not either.
    if tp * pp > 1:
        assert estimate_memory(facts, dp_shard=machine.world_size, **options) > layout.memory_budget
    elif dp_shard > 1:
        assert estimate_memory(facts, dp_shard=1, **options) > layout.memory_budget


# --------------------------------------------------------------------------------- model facts
LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def test_facts_from_a_config_dict_path_and_transformers_config(tmp_path: Path) -> None:
    facts = model_facts_from_config(LLAMA_7B)
    assert abs(facts.num_parameters - 6_738_415_616) / 6_738_415_616 < 1e-3
    assert (facts.num_layers, facts.num_attention_heads, facts.kv_heads, facts.hidden_size) == (
        32,
        32,
        32,
        4096,
    )
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))
    assert model_facts_from_config(tmp_path) == facts
    gpt2 = model_facts_from_config({"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257})
    assert abs(gpt2.num_parameters - 124_439_808) / 124_439_808 < 0.01
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )
    small = model_facts_from_config(config)
    assert (small.num_layers, small.num_attention_heads, small.kv_heads, small.hidden_size) == (2, 4, 2, 64)
    with pytest.raises(ValueError, match="no model config at"):
        model_facts_from_config(tmp_path / "missing")
    with pytest.raises(ValueError, match="pass num_parameters"):
        model_facts_from_config({"vocab_size": 10})


def test_facts_from_a_module_count_parameters_on_meta_once() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    model[1].weight = model[0].weight  # shared: counted once
    model.config = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)
    facts = model_facts_from_module(model)
    assert facts.num_parameters == 64 * 64 + 64 + 64
    assert (facts.num_layers, facts.num_attention_heads, facts.hidden_size) == (2, 4, 64)
    with pytest.raises(ValueError, match="no parameters"):
        model_facts_from_module(torch.nn.ReLU())


def test_parse_memory_and_bad_inputs() -> None:
    assert parse_memory("80GB") == 80 * 10**9
    assert parse_memory("80GiB") == parse_memory("80G") == 80 * G
    assert parse_memory("512MB") == 512 * 10**6 and parse_memory(1234) == 1234
    for bad in ("lots", "80 iB", ""):
        with pytest.raises(ValueError, match="not a memory size"):
            parse_memory(bad)
    with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
        ModelFacts(10, num_layers=0)
    with pytest.raises(ValueError, match="memory_per_device"):
        MachineShape(1, 1, 0)
    with pytest.raises(ValueError, match="mixed_precision='int3'"):
        choose_layout(MODELS["125M"], MACHINES["cpu16"], mixed_precision="int3")


# --------------------------------------------------------------------------------- ParallelismConfig
def test_parallelism_config_auto_resolves_from_the_model(caplog) -> None:
    config = ParallelismConfig(tp_size="auto")
    assert config.auto_axes == ["dp_replicate", "dp_shard", "tp"]
    with pytest.raises(ValueError, match=r"not resolved yet: call parallelism_config.resolve_auto"):
        config.validate(8)
    with caplog.at_level("INFO", logger="accelerando.parallelism_config"):
        layout = config.resolve_auto(LLAMA_7B, num_processes=8, memory_per_device="80GiB", seq_length=8192)
    assert layout.sizes == (8, 1, 1, 1) and config.layout is layout
    assert (config.tp_size, config.dp_shard_size, config.dp_replicate_size) == (8, 1, 1)
    assert config.tp_handler is not None  # the default TP options, as for a size given by hand
    config.validate(8)
    assert "automatic parallel layout: chosen tp=8" in caplog.text


def test_parallelism_config_auto_refusals(monkeypatch) -> None:
    facts = MODELS["7B"]
    fixed = ParallelismConfig(dp_shard_size="auto", dp_replicate_size=1)
    with pytest.raises(ValueError, match="chose dp_replicate_size=2 .* but dp_replicate_size=1 was given"):
        fixed.resolve_auto(model_facts=facts, num_processes=8, memory_per_device=80 * G)
    pipeline = ParallelismConfig(tp_size="auto")
    with pytest.raises(ValueError, match="needs 2 pipeline stages .* PipelineParallelPlugin"):
        pipeline.resolve_auto(model_facts=facts, machine=MACHINES["2x4x40"], seq_length=4096)
    with pytest.raises(ValueError, match=r"no parallel layout fits .* Fix: more devices"):
        ParallelismConfig(tp_size="auto").resolve_auto(model_facts=MODELS["70B"], machine=MACHINES["1x8x80"])
    with pytest.raises(ValueError, match="cp_size must be an integer >= 1, got 'auto'"):
        ParallelismConfig(cp_size="auto")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "auto")
    from_env = ParallelismConfig()
    assert from_env.tp_size == "auto" and "tp" in from_env.auto_axes
    from_env.resolve_auto(torch.nn.Linear(4, 4), num_processes=2, memory_per_device="1GB")
    assert (from_env.tp_size, from_env.dp_shard_size, from_env.dp_replicate_size) == (1, 1, 2)


# --------------------------------------------------------------------------------- command line
def _cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERANDO_", "ACCELERATE_", "PARALLELISM_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "accelerando", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "XDG_CACHE_HOME": str(home), "HOME": str(home), **(env or {})},
    )


def test_launch_dry_run_shows_the_layout_and_refuses_what_fits_nowhere(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    common = ["--num_processes", "8", "--parallelism", "auto", "--parallelism_model", str(tmp_path)]
    done = _cli(
        "launch", "--dry-run", *common,
        "--parallelism_device_memory", "80GiB", "--mixed_precision", "bf16", "--use_fsdp", "--fsdp_version", "2",
        str(script), home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        "automatic layout (parallelism (from cli:--parallelism)): tp=1 pp=1 dp_shard=4 dp_replicate=2" in out
    )
    assert "FSDP sharding over 4 devices is enough" in out and "llama: 6.74B parameters" in out
    assert "PARALLELISM_CONFIG_DP_SHARD_SIZE=4" in out and "PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2" in out
    assert "ACCELERATE_USE_PARALLELISM_CONFIG=true" in out
    bad = _cli(
        "launch", "--dry-run", *common,
        "--parallelism_device_memory", "16GiB", str(script), home=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "no parallel layout fits" in bad.stderr and "16.0 GiB each" in bad.stderr
    assert "the smallest estimate is" in bad.stderr and "Fix: more devices" in bad.stderr


def test_env_command_shows_the_layout(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))
    done = _cli(
        "env",
        home=tmp_path,
        env={
            "ACCELERANDO_PARALLELISM": "auto",
            "ACCELERANDO_PARALLELISM_MODEL": str(tmp_path),
            "ACCELERANDO_NUM_PROCESSES": "8",
            "ACCELERANDO_PARALLELISM_DEVICE_MEMORY": "80GiB",
            "ACCELERANDO_MIXED_PRECISION": "bf16",
        },
    )
    assert done.returncode == 0, done.stderr
    assert "Automatic parallel layout for 8 process(es): tp=1 pp=1 dp_shard=4 dp_replicate=2" in done.stdout
    assert "FSDP sharding over 4 devices is enough" in done.stdout
