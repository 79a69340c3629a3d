"""Regional compilation: TorchDynamoPlugin(use_regional_compilation=True) compiles each repeated
block once (the number of graphs does not grow with the number of blocks) and gives eager outputs."""

from __future__ import annotations

import pytest
import torch
from _fp8_common import TinyTransformer, batches, loss_of  # noqa: E402


def _graphs(model: torch.nn.Module, plugin) -> tuple[int, int, torch.Tensor]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = plugin.compile(model)
    out = compiled(batches(1)[0])
    wrappers = (
        sum(type(m).__name__ == "OptimizedModule" for m in compiled.blocks)
        if hasattr(compiled, "blocks")
        else 0
    )
    return counters["stats"]["unique_graphs"], wrappers, out


def test_each_repeated_block_is_compiled_once_and_outputs_equal_eager():
    from accelerando.plugins.dynamo import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    counts = {}
    for n in (2, 5):
        torch.manual_seed(0)
        model = TinyTransformer(blocks=n)
        eager = model(batches(1)[0])
        graphs, wrappers, out = _graphs(model, plugin)
        assert wrappers == n  # every block is a compiled region ...
        assert torch.equal(out, eager)
        counts[n] = graphs
        assert type(model.blocks[0]).__name__ == "Block"  # the user's module is left as it was
    # ... but dynamo compiles the block once: 5 blocks make no more graphs than 2. The other graphs
    # are the non-repeated children (embedding, entry projection, final norm, head).
    assert counts[2] == counts[5] == 5

    whole, wrappers, out = _graphs(TinyTransformer(blocks=2), TorchDynamoPlugin(backend="eager"))
    assert whole == 1 and wrappers == 0


def test_options_flow_from_settings(monkeypatch):
    from accelerando.plugins.dynamo import TorchDynamoPlugin

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERANDO_DYNAMO_USE_DYNAMIC", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "True")
    plugin = TorchDynamoPlugin()
    assert plugin.use_regional_compilation is True and plugin.enabled
    assert plugin.compile_kwargs() == {
        "backend": "aot_eager",
        "mode": "max-autotune",
        "fullgraph": True,
        "dynamic": True,
    }
    assert "use_regional_compilation" not in plugin.to_kwargs()
    assert TorchDynamoPlugin(use_regional_compilation=False).use_regional_compilation is False  # code wins
    with pytest.raises(TypeError, match="use_regional_compilation must be a bool"):
        TorchDynamoPlugin(use_regional_compilation="yes")


def test_prepare_compiles_regions(fresh_state):
    from accelerando import Accelerator
    from accelerando.plugins.dynamo import TorchDynamoPlugin

    torch.manual_seed(0)
    model = TinyTransformer(blocks=3)
    ids = batches(1)[0]
    eager = loss_of(model, ids)
    acc = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    prepared = acc.prepare(model)
    assert type(prepared).__name__ == "TinyTransformer"  # not one compiled wrapper around the model
    assert all(type(block).__name__ == "OptimizedModule" for block in prepared.blocks)
    assert torch.equal(loss_of(prepared, ids), eager)
    assert acc.unwrap_model(prepared, keep_torch_compile=False) is model
