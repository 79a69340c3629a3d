"""Big-model inference: run a model larger than the memory you give it, spilling weights to disk.

Three steps. ``init_empty_weights()`` builds the model's skeleton on the "meta" device, so no memory
is spent on weights that will be overwritten. ``load_checkpoint_and_dispatch`` plans a device map
under ``max_memory`` (GPUs first, then CPU RAM, then disk), reads the checkpoint into that placement,
writes what does not fit into ``offload_folder``, and adds hooks that bring each block's weights in
just before it runs. ``no_split_module_classes`` keeps a block's layers together.

To be self-contained, the script first saves a randomly initialised model as a sharded safetensors
checkpoint, then reloads it under a small CPU budget and checks that the offloaded model gives the
same outputs as the one in memory. Launched on several processes, each one loads the model and
answers its own share of the inputs (``split_between_processes``).

    accelerando launch --cpu --num_processes 2 examples/by_feature/big_model_inference.py --tiny

The last line printed is ``METRICS {...}``: where the blocks were placed, the largest difference from
the in-memory model, and how many inputs each process answered.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import torch
from torch import nn
from tqdm.auto import tqdm

from accelerando import Accelerator, init_empty_weights, load_checkpoint_and_dispatch
from accelerando.utils import gather_object


class Block(nn.Module):
    """A residual MLP block: the unit placed on one device (never split)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def build_model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(nn.Linear(8, width), *[Block(width) for _ in range(depth)], nn.Linear(width, 4))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument(
        "--cpu_budget", default=None, help="RAM for weights, e.g. 20MB (default: 1/4 of them)"
    )
    parser.add_argument("--num_inputs", type=int, default=64)
    parser.add_argument("--output_dir", default="examples_output/big_model_inference")
    parser.add_argument("--tiny", action="store_true", help="a small model")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    width, depth = (32, 6) if args.tiny else (args.width, args.depth)
    accelerator = Accelerator()
    checkpoint = os.path.join(args.output_dir, "checkpoint")

    torch.manual_seed(0)
    reference = build_model(width, depth).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    # Sharded on purpose: the loader reads the index and one shard at a time.
    accelerator.save_model(reference, checkpoint, max_shard_size=max(weight_bytes // 4, 1))

    with init_empty_weights():
        model = build_model(width, depth)  # parameters on "meta": no memory used
    budget = args.cpu_budget or weight_bytes // 4
    model = load_checkpoint_and_dispatch(
        model,
        checkpoint,
        device_map="auto",
        max_memory={"cpu": budget},  # add GPU budgets, e.g. {0: "10GiB", "cpu": "30GiB"}
        no_split_module_classes=["Block"],
        offload_folder=os.path.join(args.output_dir, f"offload_rank{accelerator.process_index}"),
    )
    placement = collections.Counter(str(device) for device in model.hf_device_map.values())
    accelerator.print(f"device map: {dict(placement)} ({weight_bytes} bytes of weights, budget {budget})")

    inputs = torch.randn(args.num_inputs, 8, generator=torch.Generator().manual_seed(1))
    worst, answered = 0.0, 0
    with accelerator.split_between_processes(list(inputs)) as share, torch.no_grad():
        for x in tqdm(share, disable=not accelerator.is_local_main_process):
            difference = (model(x[None]) - reference(x[None])).abs().max().item()
            worst = max(worst, difference)
            answered += 1

    metrics = {
        "placement": dict(placement),
        "max_abs_diff": max(gather_object([worst])),
        "answered_per_process": gather_object([answered]),
        "checkpoint_files": sorted(os.listdir(checkpoint)),
    }
    accelerator.print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main()
