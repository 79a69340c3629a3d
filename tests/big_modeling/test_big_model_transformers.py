"""Real architectures (tiny random GPT-2, Llama, T5, BERT): dispatched outputs equal the in-memory model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from accelerando.big_modeling import (  # noqa: E402
    cpu_offload,
    disk_offload,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accelerando.hooks import remove_hook_from_submodules  # noqa: E402
from accelerando.utils.modeling import (  # noqa: E402
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    find_tied_parameters,
    infer_auto_device_map,
)

ATOL = 1e-5


def _gpt2():
    return transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=96, n_positions=32, n_embd=32, n_layer=3, n_head=2
    )


def _llama(tied: bool = False):
    return transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=tied,
    )  # fmt: skip


def _t5():
    return transformers.T5ForConditionalGeneration, transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0,
    )  # fmt: skip


def _bert():
    return transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
        max_position_embeddings=32,
    )  # fmt: skip


ARCHITECTURES = {
    "gpt2": _gpt2,
    "llama": _llama,
    "t5": _t5,
    "bert": _bert,
}


def _inputs(name: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 96, (2, 7), generator=generator)
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    return {"input_ids": ids}


def _output(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def saved(request, tmp_path_factory):
    name = request.param
    cls, config = ARCHITECTURES[name]()
    torch.manual_seed(0)
    model = cls(config).eval()
    single = tmp_path_factory.mktemp(f"{name}_single")
    sharded = tmp_path_factory.mktemp(f"{name}_sharded")
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="20KB")
    expected = _output(model, _inputs(name))
    return name, cls, config, single, sharded, expected


def _empty(cls, config):
    with init_empty_weights():
        model = cls(config)
    return model.eval()


@pytest.mark.parametrize(
    "all_cpu_layout, offload_layout",
    [("single", "sharded"), pytest.param("sharded", "single", marks=pytest.mark.slow)],
)
def test_all_cpu_and_cpu_disk_maps_match(saved, all_cpu_layout, offload_layout, tmp_path):
    name, cls, config, single, sharded, expected = saved
    assert any(p.name.endswith(".index.json") for p in sharded.iterdir())
    folder = single if all_cpu_layout == "single" else sharded
    model = load_checkpoint_and_dispatch(_empty(cls, config), folder, device_map={"": "cpu"})
    torch.testing.assert_close(_output(model, _inputs(name)), expected, atol=ATOL, rtol=0)

    folder = single if offload_layout == "single" else sharded
    model = _empty(cls, config)
    total = compute_module_sizes(model)[""]
    no_split = list(model._no_split_modules or [])
    device_map = infer_auto_device_map(
        model, {"cpu": total * 3 // 4, "disk": "1GB"}, no_split_module_classes=no_split
    )
    assert {"cpu", "disk"} == set(device_map.values())
    assert check_tied_parameters_on_same_device(find_tied_parameters(model), device_map)
    model = load_checkpoint_and_dispatch(
        model, folder, device_map=device_map, offload_folder=tmp_path / "off"
    )
    torch.testing.assert_close(_output(model, _inputs(name)), expected, atol=ATOL, rtol=0)
    # Weights already in safetensors files are indexed in place: nothing was copied to the folder.
    assert [p.name for p in (tmp_path / "off").iterdir()] == ["index.json"]
    remove_hook_from_submodules(model)
    torch.testing.assert_close(_output(model.to("cpu"), _inputs(name)), expected, atol=ATOL, rtol=0)


def test_sequential_cpu_offload_and_disk_offload_match(saved, tmp_path):
    name, cls, config, single, _, expected = saved
    model = load_checkpoint_and_dispatch(_empty(cls, config), single)
    cpu_offload(model, execution_device="cpu")
    assert all(p.device.type == "meta" for p in model.parameters())
    torch.testing.assert_close(_output(model, _inputs(name)), expected, atol=ATOL, rtol=0)

    model = load_checkpoint_and_dispatch(_empty(cls, config), single)
    disk_offload(model, tmp_path / "disk", execution_device="cpu")
    assert all(p.device.type == "meta" for p in model.parameters())
    torch.testing.assert_close(_output(model, _inputs(name)), expected, atol=ATOL, rtol=0)
    remove_hook_from_submodules(model)
    assert all(p.device.type == "cpu" for p in model.parameters())
    torch.testing.assert_close(_output(model, _inputs(name)), expected, atol=ATOL, rtol=0)


def test_tied_embeddings_stay_tied_after_loading(saved):
    name, cls, config, single, _, _ = saved
    model = _empty(cls, config)
    tied_before = find_tied_parameters(model)
    missing, unexpected = _load(model, single)
    assert find_tied_parameters(model) == tied_before
    assert unexpected == []
    assert all(not key.endswith(("lm_head.weight", "decoder.weight")) for key in missing)


def _load(model, folder):
    from accelerando.utils.modeling import load_checkpoint_in_model

    return load_checkpoint_in_model(model, folder)
