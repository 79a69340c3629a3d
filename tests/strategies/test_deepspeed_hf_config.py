"""DeepSpeedPlugin.hf_ds_config is always a queryable HfDeepSpeedConfig sharing its dict with the plugin.

transformers builds ``DeepSpeedPlugin(hf_ds_config=HfTrainerDeepSpeedConfig(...))`` and fills the
config's "auto" values in that object's ``.config`` afterwards, so the plugin must keep the object
(not a copy) and use its dict as ``deepspeed_config``. A dict, a JSON path, a base64 string or no
config at all end up as an ``HfDeepSpeedConfig`` too.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from accelerando.utils import DeepSpeedPlugin
from accelerando.utils.deepspeed import HfDeepSpeedConfig


class _TrainerStyleConfig(HfDeepSpeedConfig):
    """Stands for transformers' HfTrainerDeepSpeedConfig: a subclass that fills "auto" values later."""

    def dtype(self) -> str:
        return "float32"


def test_an_hf_config_object_is_kept_and_its_dict_shared() -> None:
    hf = _TrainerStyleConfig(
        {
            "zero_optimization": {"stage": 3},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_clipping": "auto",
        }
    )
    plugin = DeepSpeedPlugin(hf_ds_config=hf)
    assert plugin.hf_ds_config is hf
    assert plugin.deepspeed_config is hf.config
    assert plugin.zero_stage == 3 and hf.is_zero3() and plugin.hf_ds_config.dtype() == "float32"
    # What transformers' trainer_config_finalize does: fill "auto" in the object's dict.
    hf.config["train_micro_batch_size_per_gpu"] = 4
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    # What transformers' propagate_args_to_deepspeed does: swap the object, then the dict.
    plugin.hf_ds_config = _TrainerStyleConfig(plugin.hf_ds_config.config)
    plugin.deepspeed_config = plugin.hf_ds_config.config
    assert plugin.get_value("train_micro_batch_size_per_gpu") == 4


def test_fields_fill_auto_in_the_shared_dict_and_stage_is_reread() -> None:
    hf = HfDeepSpeedConfig({"zero_optimization": {"stage": "auto"}, "gradient_clipping": "auto"})
    DeepSpeedPlugin(hf_ds_config=hf, zero_stage=2, gradient_clipping=1.0)
    assert hf.config["zero_optimization"]["stage"] == 2 and hf.config["gradient_clipping"] == 1.0
    assert hf.is_zero2()


@pytest.mark.parametrize("form", ["dict", "path", "base64", "fields"])
def test_every_config_form_becomes_an_hf_config(tmp_path: Path, form: str) -> None:
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    if form == "dict":
        plugin = DeepSpeedPlugin(hf_ds_config=config)
    elif form == "path":
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    elif form == "base64":
        plugin = DeepSpeedPlugin(hf_ds_config=base64.urlsafe_b64encode(json.dumps(config).encode()).decode())
    else:
        plugin = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu")
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert plugin.deepspeed_config is plugin.hf_ds_config.config
    assert plugin.hf_ds_config.is_zero2() and plugin.hf_ds_config.is_offload()
    if form == "dict":
        assert plugin.deepspeed_config is not config  # a dict given by the caller is copied


def test_bad_config_forms_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    with pytest.raises(TypeError, match="JSON file path or a dict"):
        DeepSpeedPlugin(hf_ds_config=42)
