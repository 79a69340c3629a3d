"""unwrap_model on a model whose repeated blocks were compiled with compile_regions."""

import torch

from accelerando.common.compilation import compile_regions
from accelerando.common.unwrap import unwrap_model


def test_unwrap_model_returns_the_original_of_a_regionally_compiled_model() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    compiled = compile_regions(model)
    assert compiled is not model
    assert unwrap_model(compiled, keep_torch_compile=False) is model
    assert unwrap_model(compiled) is compiled
