"""Distributed inference: each process answers its own share of the inputs, results come back in order.

``split_between_processes(inputs)`` gives every process a contiguous slice (lists, tuples, dicts of
them, or tensors). With ``apply_padding=True`` every slice has the same length, the short ones repeating
their last item, so the results can be gathered with ``gather_object``; dropping the items past the
input count then leaves exactly one answer per input, in input order. No training, no ``prepare``:
the model only needs to be on ``accelerator.device``.

    accelerando launch --cpu --num_processes 2 examples/by_feature/distributed_inference.py --tiny

The results go to ``<output_dir>/predictions.jsonl`` (written by the main process). The last line
printed is ``METRICS {...}``: inputs, results, how many each process answered, whether order held.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import gather_object

LABELS = ["north", "east", "south", "west"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--num_inputs", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--output_dir", default="examples_output/distributed_inference")
    parser.add_argument("--tiny", action="store_true", help="few inputs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    num_inputs = 37 if args.tiny else args.num_inputs  # not a multiple of the process count on purpose
    accelerator = Accelerator()
    torch.manual_seed(0)  # the same weights on every process
    model = (
        nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, len(LABELS))).to(accelerator.device).eval()
    )
    # Each input carries its id, so the order of the gathered results can be checked.
    inputs = [
        {"id": i, "features": torch.randn(8, generator=torch.Generator().manual_seed(i))}
        for i in range(num_inputs)
    ]

    results = []
    with accelerator.split_between_processes(inputs, apply_padding=True) as share:
        answered = len(share)
        for start in tqdm(
            range(0, len(share), args.batch_size), disable=not accelerator.is_local_main_process
        ):
            batch = share[start : start + args.batch_size]
            features = torch.stack([item["features"] for item in batch]).to(accelerator.device)
            with torch.no_grad():
                probabilities = model(features).softmax(dim=-1)
            for item, row in zip(batch, probabilities.cpu(), strict=True):
                results.append(
                    {"id": item["id"], "label": LABELS[int(row.argmax())], "score": float(row.max())}
                )

    gathered = gather_object(results)[:num_inputs]  # drop the padding repeats at the end
    answered_per_process = gather_object([answered])
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "predictions.jsonl"), "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in gathered)
    metrics = {
        "inputs": num_inputs,
        "results": len(gathered),
        "answered_per_process": answered_per_process,
        "in_order": [row["id"] for row in gathered] == list(range(num_inputs)),
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
