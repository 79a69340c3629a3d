"""Dump what ``<lib>.test_utils`` helpers give, for ``test_helpers_vs_reference.py``.

Run as ``python helpers_dump.py accelerate|accelerando OUT.json`` in a folder holding
``tests/test_samples/MRPC/{train,dev}.csv`` (the layout both libraries read). Nothing is downloaded:
``transformers.AutoTokenizer.from_pretrained`` is replaced by a word-level BERT tokenizer built from
the CSV's words, whatever name is asked for (the names are recorded).
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import sys
import unittest
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from tokenizers.pre_tokenizers import BertPreTokenizer

warnings.simplefilter("ignore")
REQUESTED: list[str] = []


def _tokenizer_from_samples() -> Any:
    folder = Path("tests/test_samples/MRPC")
    texts = [cell for f in sorted(folder.glob("*.csv")) for row in csv.reader(f.open()) for cell in row[1:]]
    words = sorted({w for text in texts for w, _ in BertPreTokenizer().pre_tokenize_str(text.lower())})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}

    def from_pretrained(name: str, *args: object, **kwargs: object) -> Any:
        REQUESTED.append(name)
        return transformers.BertTokenizerFast(vocab=vocab, eos_token="[SEP]")

    return from_pretrained


def _loaders(training: Any, accelerator: Any) -> dict[str, Any]:
    seen = {}
    for name in ("mocked_dataloaders", "mocked_dataloaders_for_autoregressive_models"):
        train, evaluation = getattr(training, name)(accelerator, batch_size=16)
        for split, loader in (("train", train), ("eval", evaluation)):
            torch.manual_seed(0)  # the same shuffle on both sides
            seen[f"{name}/{split}"] = [
                {key: [str(v.dtype), list(v.shape), v.tolist()] for key, v in batch.items()}
                for batch in loader
            ]
    return seen


def _regression(training: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for kwargs in ({"seed": 42}, {"a": 1, "b": -1, "length": 5, "seed": 0}, {"length": 3, "seed": 7}):
        data = training.RegressionDataset(**kwargs)
        items = [
            {k: [str(np.asarray(v).dtype), np.asarray(v).tolist()] for k, v in data[i].items()}
            for i in range(3)
        ]
        seen[f"dataset{kwargs}"] = [len(data), items, data.x.tolist(), data.y.tolist()]
    for kwargs in ({}, {"a": 2, "b": 1}, {"a": 1, "b": 2, "double_output": True}):
        model = training.RegressionModel(**kwargs)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            first, second = model(torch.tensor([1.0, -2.0])), model(torch.tensor([3.0]))
        state = {k: [str(v.dtype), v.tolist()] for k, v in model.state_dict().items()}
        seen[f"model{kwargs}"] = [
            type(first).__name__,
            first.tolist(),
            second.tolist(),
            printed.getvalue(),
            state,
        ]
        seen[f"model{kwargs}/first_batch"] = model.first_batch
    return seen


def _decorators(testing: Any) -> dict[str, Any]:
    """Whether each ``require_*`` / ``slow`` decorator skips a test on this machine."""
    seen = {}
    for name in sorted(dir(testing)):
        if name.startswith("require_") and name != "require_torch_min_version" or name == "slow":

            def test(self: unittest.TestCase) -> None: ...

            seen[name] = bool(getattr(getattr(testing, name)(test), "__unittest_skip__", False))
    return seen


def main() -> None:
    """Import the library's helpers, run them, write the JSON."""
    lib, out = sys.argv[1], Path(sys.argv[2])
    transformers.AutoTokenizer.from_pretrained = _tokenizer_from_samples()  # type: ignore[method-assign]
    module = importlib.import_module(lib)
    training = importlib.import_module(f"{lib}.test_utils.training")
    testing = importlib.import_module(f"{lib}.test_utils.testing")
    accelerator = module.Accelerator(cpu=True)
    seen = {**_loaders(training, accelerator), **_regression(training), "decorators": _decorators(testing)}
    seen["tokenizers asked for"] = REQUESTED
    out.write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
