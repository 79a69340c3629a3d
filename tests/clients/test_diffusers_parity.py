"""diffusers models load through accelerando as through the reference, and train to the same weights.

``diffusers_scenario.py`` builds a tiny UNet2DModel and AutoencoderKL from configs, saves them, loads
each with ``low_cpu_mem_usage=True``, with ``device_map="cpu"`` and through ``init_empty_weights`` +
``load_checkpoint_and_dispatch``, then trains the UNet a few steps with an ``Accelerator``. It runs
once on the reference and once on accelerando; every loaded weight and output must equal the saved
model's, and the training losses and weights must equal the reference's (fp32 reassociation).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference_pair import compare_weights, max_relative, run_side

pytest.importorskip("diffusers")
pytest.importorskip("accelerate")

SCRIPT = Path(__file__).with_name("diffusers_scenario.py")


@pytest.mark.slow
def test_diffusers_loading_and_training_match_the_reference(tmp_path: Path) -> None:
    seconds = {side: run_side(SCRIPT, tmp_path / side, side, (), 1) for side in ("reference", "accelerando")}
    ours, theirs = (
        torch.load(tmp_path / side / "out.pt", weights_only=True) for side in ("accelerando", "reference")
    )
    assert ours["accelerator_module"].startswith("accelerando") and theirs["accelerator_module"].startswith(
        "accelerate."
    )
    for name in ("unet", "vae"):
        built = ours[name]["built"]
        compare_weights(built, theirs[name]["built"])  # the same seeded model on both sides
        for way, loaded in ours[name]["loaded"].items():
            assert loaded["weights"].keys() == built.keys(), (name, way)
            for key, value in loaded["weights"].items():
                assert torch.equal(value, built[key]), (name, way, key)
            assert torch.equal(loaded["output"], theirs[name]["loaded"][way]["output"]), (name, way)
    losses, reference_losses = ours["train"]["losses"], theirs["train"]["losses"]
    loss_rel = max_relative(dict(enumerate(losses)), dict(enumerate(reference_losses)))
    weight_diff = compare_weights(ours["train"]["weights"], theirs["train"]["weights"])
    print(
        f"diffusers: losses {losses} | max rel loss diff {loss_rel:.2e}, max weight diff {weight_diff:.2e}, "
        f"wall {seconds['accelerando']:.1f} s / {seconds['reference']:.1f} s = "
        f"{seconds['accelerando'] / seconds['reference']:.3f}"
    )
    assert loss_rel <= 1e-5
