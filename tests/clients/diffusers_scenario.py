"""A diffusers model loaded the three ways that go through ``accelerate``, then trained a few steps.

Run as a script by ``test_diffusers_parity.py``, once with the reference and once on accelerando
(``--accelerate accelerando`` installs the stand-in before diffusers is imported). It builds a tiny
``UNet2DModel`` and ``AutoencoderKL`` from configs (seeded), saves them under ``--out/saved``, then loads
each with ``from_pretrained(low_cpu_mem_usage=True)``, with ``from_pretrained(device_map="cpu")`` and
through ``init_empty_weights`` + ``load_checkpoint_and_dispatch``; it trains the loaded UNet for a
few denoising steps with an ``Accelerator`` and saves what it saw to ``--out/out.pt``: each loaded
model's weights and outputs on a fixed input, and the training losses and final weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--accelerate", choices=["accelerando", "reference"], default="accelerando")
    p.add_argument("--steps", type=int, default=4)
    return p.parse_args()


def _unet() -> Any:
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=4,
    )


def _vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    )


def _outputs(name: str, model: Any) -> Any:
    import torch

    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if name == "unet":
            return model(x, torch.tensor([3, 7])).sample
        return model(x, sample_posterior=False).sample


def _loaded(name: str, cls: Any, folder: str) -> dict[str, Any]:
    """The model at ``folder`` loaded three ways: weights (CPU, fp32) and outputs of each."""
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch

    ways: dict[str, Any] = {
        "low_cpu_mem_usage": cls.from_pretrained(folder, low_cpu_mem_usage=True),
        "device_map": cls.from_pretrained(folder, device_map="cpu"),
    }
    with init_empty_weights():
        empty = cls.from_config(cls.load_config(folder))
    ways["dispatch"] = load_checkpoint_and_dispatch(
        empty, os.path.join(folder, "diffusion_pytorch_model.safetensors"), device_map={"": "cpu"}
    )
    return {
        way: {
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "output": _outputs(name, model),
        }
        for way, model in ways.items()
    }


def _train(folder: str, steps: int) -> dict[str, Any]:
    """A few denoising steps of the loaded UNet with an Accelerator (batch 3: an uneven last batch)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from diffusers import UNet2DModel

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = UNet2DModel.from_pretrained(folder, low_cpu_mem_usage=True)
    images = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    loader = torch.utils.data.DataLoader(images, batch_size=3, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    while len(losses) < steps:
        for clean in loader:
            noise = torch.randn_like(clean)
            t = torch.randint(0, 10, (clean.shape[0],))
            loss = torch.nn.functional.mse_loss(model(clean + noise, t).sample, noise)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(accelerator.gather_for_metrics(loss.detach()).mean()))
            if len(losses) == steps:
                break
    state = accelerator.unwrap_model(model).state_dict()
    return {"losses": losses, "weights": {k: v.detach().clone() for k, v in state.items()}}


def main() -> int:
    """Build, save, load, train; write out.pt."""
    args = _parse()
    if args.accelerate == "accelerando":
        import accelerando

        accelerando.install_as_accelerate()
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    saved = os.path.join(args.out, "saved")
    result: dict[str, Any] = {}
    for name, build in (("unet", _unet), ("vae", _vae)):
        torch.manual_seed(0)
        model = build()
        model.save_pretrained(os.path.join(saved, name))
        result[name] = {"built": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        result[name]["loaded"] = _loaded(name, type(model), os.path.join(saved, name))
    result["train"] = _train(os.path.join(saved, "unet"), args.steps)
    import accelerate

    result["accelerator_module"] = accelerate.Accelerator.__module__
    result["seconds"] = time.perf_counter() - start
    torch.save(result, os.path.join(args.out, "out.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
