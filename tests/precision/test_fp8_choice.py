"""FP8 backend choice and recipes: settings fill the recipes, the choice is logged, and each bad
input (unknown backend, a backend that cannot run here, a wrong field type) is a clear error."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("torchao")


def _build_and_prepare(**kwargs):
    """Errors may come when the Accelerator is built or when the model is prepared."""
    from accelerando import Accelerator

    acc = Accelerator(**kwargs)
    return acc.prepare(torch.nn.Linear(16, 16))


def test_automatic_choice_is_torchao_here_and_logged(fresh_state, caplog):
    from accelerando.backends.precision.fp8 import choose_fp8_backend
    from accelerando.core.settings import process_settings

    backend, recipe, reason = choose_fp8_backend({}, process_settings(), "cpu")
    assert (backend, type(recipe).__name__) == ("ao", "AORecipeKwargs") and "automatic" in reason
    with caplog.at_level(logging.INFO):
        from accelerando import Accelerator

        acc = Accelerator(mixed_precision="fp8")
    assert "FP8 training with torchao (automatic choice" in caplog.text
    assert acc.mixed_precision == "fp8" and str(acc._precision.fp8_backend) == "AO"
    assert acc.fp8_backend == "AO"


def test_settings_choose_the_backend_and_fill_the_recipes(fresh_state, monkeypatch):
    from accelerando.backends.precision.fp8 import choose_fp8_backend
    from accelerando.core.settings import process_settings
    from accelerando.plugins.kwargs import AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs

    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "ao")
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    monkeypatch.setenv("ACCELERANDO_FP8_MARGIN", "2")
    monkeypatch.setenv("ACCELERATE_FP8_OVERRIDE_LINEAR_PRECISION", "false,false,true")
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    backend, recipe, reason = choose_fp8_backend({}, process_settings(), "cpu")
    assert backend == "ao" and reason == "fp8_backend from env:ACCELERATE_FP8_BACKEND"
    assert recipe.pad_inner_dim is False and recipe.config.pad_inner_dim is False
    assert AORecipeKwargs(pad_inner_dim=True).pad_inner_dim is True  # code wins over the environment
    te = TERecipeKwargs()
    assert te.margin == 2 and te.override_linear_precision == (False, False, True)
    assert te.fp8_format == "HYBRID" and te.amax_history_len == 1024 and te.amax_compute_algo == "most_recent"
    assert MSAMPRecipeKwargs().opt_level == "O1"


def test_backend_that_cannot_run_here_names_ao(fresh_state, monkeypatch):
    from accelerando.plugins.kwargs import MSAMPRecipeKwargs, TERecipeKwargs

    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "te")
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU.*'ao' \(torchao"):
        _build_and_prepare(mixed_precision="fp8")
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND")
    for handler in (TERecipeKwargs(), MSAMPRecipeKwargs()):
        with pytest.raises(RuntimeError, match="AORecipeKwargs"):
            _build_and_prepare(mixed_precision="fp8", kwargs_handlers=[handler])


def test_unknown_backend_two_recipes_wrong_types(fresh_state, monkeypatch):
    from accelerando.backends.precision.fp8 import choose_fp8_backend
    from accelerando.plugins.kwargs import AORecipeKwargs, FP8RecipeKwargs, TERecipeKwargs

    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "fp4")
    with pytest.raises(ValueError, match="fp8_backend"):
        _build_and_prepare(mixed_precision="fp8")
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="unknown FP8 backend 'fp4'.*'TE'"):
        FP8RecipeKwargs(backend="fp4")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="AORecipeKwargs"):
        FP8RecipeKwargs(backend="ao")
    with pytest.raises(ValueError, match="pass one FP8 recipe handler"):
        choose_fp8_backend({AORecipeKwargs: AORecipeKwargs(), TERecipeKwargs: TERecipeKwargs()}, None, "cpu")
    with pytest.raises(TypeError, match=r"TERecipeKwargs.margin must be an int.*margin=0"):
        TERecipeKwargs(margin="1")
    with pytest.raises(TypeError, match="use_autocast_during_eval must be a bool"):
        TERecipeKwargs(use_autocast_during_eval="yes")
    with pytest.raises(ValueError, match="amax_compute_algo"):
        TERecipeKwargs(amax_compute_algo="mean")
    with pytest.raises(TypeError, match="override_linear_precision"):
        TERecipeKwargs(override_linear_precision=(True, False))
    with pytest.raises(TypeError, match="Float8LinearConfig"):
        AORecipeKwargs(config={"emulate": True})
    with pytest.raises(TypeError, match="module_filter_func must be a callable"):
        AORecipeKwargs(module_filter_func="proj")
    with pytest.raises(TypeError, match="enable_fsdp_float8_all_gather must be a bool"):
        AORecipeKwargs(enable_fsdp_float8_all_gather=1)


def test_no_backend_installed(fresh_state, monkeypatch):
    from accelerando.backends.precision.fp8 import choose_fp8_backend
    from accelerando.common import imports

    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip install torchao"):
        choose_fp8_backend({}, None, "cpu")


def test_transformer_engine_helpers_without_it_name_ao():
    from accelerando.backends.precision.fp8 import transformer_engine

    model = torch.nn.Linear(16, 16)
    assert transformer_engine.has_transformer_engine_layers(model) is False
    for call in (
        lambda: transformer_engine.convert_model(model),
        lambda: transformer_engine.apply_fp8_autowrap(model, None),
        lambda: transformer_engine.contextual_fp8_autocast(model.forward, None),
    ):
        with pytest.raises(ImportError, match="AORecipeKwargs"):
            call()
