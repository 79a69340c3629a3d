"""`accelerando estimate-memory` for Hub names: read from the local HF cache when offline, clear error
when neither the cache nor the Hub has the model; and the reference's helper functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from accelerando.commands import estimate

TINY_BERT = {
    "model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 32, "type_vocab_size": 2,
}  # fmt: skip


def _fake_hub_cache(root: Path, repo: str, config: dict) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123abcd")
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return snapshot


def _args(model_name: str, *dtypes: str) -> Namespace:
    return Namespace(model_name=model_name, dtypes=list(dtypes), library_name=None, trust_remote_code=False)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF_HUB_CACHE with HF_HUB_OFFLINE=1, as huggingface_hub sees them."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads both variables when first imported: set its copies too.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_offline_hub_name_from_the_local_cache(
    offline_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    _fake_hub_cache(offline_cache, "tiny-org/tiny-bert", TINY_BERT)
    assert estimate.estimate_command(_args("tiny-org/tiny-bert", "float32", "float16", "int4")) == 0
    out = capsys.readouterr().out
    assert "Memory Usage for loading `tiny-org/tiny-bert`" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") == 5}
    assert set(rows) == {"dtype", "float32", "float16", "int4"}
    assert "N/A" in rows["int4"] and "N/A" not in rows["float32"]  # int4 is not trained
    data = estimate.gather_data(_args("tiny-org/tiny-bert", "float32", "float16"))
    assert data[0][2] == 2 * data[1][2] > data[0][1] > 0  # total float32 = 2 x float16 > largest layer
    assert data[0][3]["step"] == 4 * data[0][2]


def test_unknown_model_is_a_clear_error(offline_cache: Path) -> None:
    with pytest.raises(estimate.EstimateError) as info:
        estimate.create_empty_model("nobody/no-such-model", None)
    message = str(info.value)
    assert "nobody/no-such-model" in message and "not in the local Hugging Face cache" in message
    assert str(offline_cache) in message and "HF_HUB_OFFLINE=1" in message and "Fix:" in message


def test_unknown_model_through_the_command_line(tmp_path: Path) -> None:
    """A fresh process: huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    command = [sys.executable, "-m", "accelerando.commands.cli", "estimate-memory", "nobody/no-such-model"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1
    assert "not in the local Hugging Face cache" in result.stderr and "HF_HUB_OFFLINE=1" in result.stderr
    # One line, no traceback: the Hub cannot be reached, and what to pass instead.
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "cannot be reached" in result.stderr and "local model folder or its config.json" in result.stderr


def test_the_function_raises_the_references_oserror(offline_cache: Path) -> None:
    with pytest.raises(OSError, match="Repo for model `somebrokenname`"):
        estimate.estimate_command(_args("somebrokenname", "float32"))
    from unittest.mock import patch

    with patch.object(estimate, "verify_on_hub", return_value="gated"), pytest.raises(OSError, match="gated"):
        estimate.estimate_command(_args("org/gated-model", "float32"))


def test_verify_on_hub_turns_a_connection_error_into_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(estimate, "_hub_offline", lambda: False)

    class ConnectError(Exception):  # what an HTTP client raises without network (not an OSError)
        pass

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(hub, "model_info", unreachable)
    assert estimate.verify_on_hub("bert-base-cased") == "repo"


def test_table_training_usage_and_helpers() -> None:
    table = estimate.create_ascii_table(["a", "bb"], [["1", "22222"], ["333", "4"]], "Title")
    lines = table.splitlines()
    assert "Title" in lines[1] and len({len(line) for line in lines}) == 1  # a closed rectangle
    assert "22222" in table and "333" in table

    fp32 = estimate.estimate_training_usage(1000, "float32")
    assert fp32 == {"model": 1000, "gradients": 1000, "optimizer": 2000, "step": 4000}
    mixed = estimate.estimate_training_usage(1000, "float16")
    assert mixed == {"model": 1000, "gradients": 1500, "optimizer": 2000, "step": 2000}
    assert estimate.estimate_training_usage(1000, "int8") == dict.fromkeys(fp32, -1)
    with pytest.raises(ValueError, match="MS-AMP"):
        estimate.estimate_training_usage(1000, "fp8", msamp_config="O2")

    assert estimate.add_timm_hub_prefix("org/m") == "hf-hub:org/m"
    assert estimate.add_timm_hub_prefix("hf-hub:org/m") == "hf-hub:org/m"
    assert estimate.add_timm_hub_prefix("resnet50.a1_in1k") == "resnet50.a1_in1k"  # timm's own registry
    assert estimate.add_timm_hub_prefix("local-dir:/m") == "local-dir:/m"
    assert estimate.check_has_model(RuntimeError("Unknown model (x)")) == "timm"
    assert (
        estimate.check_has_model(OSError("repo does not appear to have a file named config.json"))
        == "transformers"
    )
    assert estimate.check_has_model(ValueError("other")) == "unknown"


def test_gather_data_for_a_local_folder_and_a_missing_path(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"layers.0.w": torch.zeros(4, 4), "head": torch.zeros(4)}, tmp_path / "m.safetensors")
    args = Namespace(
        model_name=str(tmp_path), dtypes=["float32", "int8"], library_name=None, trust_remote_code=False
    )
    rows = estimate.gather_data(args)
    assert [row[0] for row in rows] == ["float32", "int8"]
    assert rows[0][2] == 20 * 4 and rows[1][2] == 20 and rows[0][1] == 16 * 4
    assert rows[0][3]["step"] == 4 * 80 and rows[1][3]["step"] == -1
    with pytest.raises(estimate.EstimateError, match="does not exist"):
        estimate.gather_data(Namespace(**{**vars(args), "model_name": str(tmp_path / "gone" / "x")}))
