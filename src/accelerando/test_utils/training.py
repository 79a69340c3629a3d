"""Training fixtures for tests.

* a tiny regression problem, ``y = a * x + b`` with noise (``RegressionDataset``, ``RegressionModel``);
* MRPC dataloaders built from small CSV samples, for testing example scripts without the Hub dataset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

if TYPE_CHECKING:
    from datasets import Dataset as HFDataset
    from datasets import DatasetDict
    from transformers import BatchEncoding, PreTrainedTokenizerBase

__all__ = [
    "RegressionDataset",
    "RegressionModel",
    "RegressionModel4XPU",
    "mocked_dataloaders",
    "mocked_dataloaders_for_autoregressive_models",
]


class RegressionDataset(torch.utils.data.Dataset):
    """Synthetic samples ``{"x": x, "y": a * x + b + noise}`` drawn from a seeded generator.

    Args:
        a: slope. b: intercept. length: number of samples. seed: generator seed (None = random).
    """

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        # float32 arithmetic throughout (the noise too), as the reference's values are computed
        self.y = a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.float32]:
        return {"x": self.x[index], "y": self.y[index]}


def _needed(x: torch.Tensor | None) -> torch.Tensor:
    # ``x`` defaults to None only to keep the reference's signature; the model needs it.
    if x is None:
        raise TypeError("RegressionModel.forward needs the input tensor x, got None.")
    return x


class RegressionModel(nn.Module):
    """``y = a * x + b`` with scalar parameters ``a`` and ``b``.

    As the reference's model: the first forward prints the parameters' and the input's dtypes and
    clears ``first_batch``; ``double_output`` is kept as an attribute, the output is one tensor.

    Args:
        a: initial slope. b: initial intercept. double_output: stored (the reference's forward does
            not read it).
    """

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.first_batch = True
        self.double_output = double_output

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``a * x + b``.

        Raises:
            TypeError: ``x`` is None.
        """
        x = _needed(x)
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


class RegressionModel4XPU(RegressionModel):
    """Same model with 2-element parameters (some devices dislike 0-d parameters)."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__(a, b, double_output)
        self.a = nn.Parameter(torch.tensor([float(a), float(a)]))
        self.b = nn.Parameter(torch.tensor([float(b), float(b)]))

    @override
    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        x = _needed(x)
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a[0] + self.b[0]


# --- GLUE/MRPC dataloaders for example-script tests -----------------------------------------------

#: The MRPC sample files (relative to the working directory, as in the reference's repository layout).
MRPC_DATA_FILES = {
    "train": "tests/test_samples/MRPC/train.csv",
    "validation": "tests/test_samples/MRPC/dev.csv",
}
#: Tokenizer of the sequence-classification examples.
SEQUENCE_TOKENIZER = "bert-base-cased"
#: Tokenizer used for the causal-LM variant (pad token set to its end-of-sequence token).
AUTOREGRESSIVE_TOKENIZER = "HuggingFaceTB/SmolLM-360M"
#: Rows per batch of the mocked training and evaluation loaders, whatever ``batch_size`` says (as the
#: reference's helpers: 6 sample rows give 3 training steps and 6 evaluation steps).
TRAIN_BATCH_SIZE, EVAL_BATCH_SIZE = 2, 1


def _load_mrpc(data_files: dict[str, str] | None) -> DatasetDict:
    from pathlib import Path

    files = dict(data_files or MRPC_DATA_FILES)
    missing = [path for path in files.values() if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(
            f"MRPC sample files not found: {missing}. Run from a folder holding tests/test_samples/MRPC "
            "(the reference repository's layout) or pass data_files={'train': ..., 'validation': ...}."
        )
    try:
        from datasets import DatasetDict, load_dataset
    except ImportError as err:
        raise ImportError("mocked dataloaders need the `datasets` package: pip install datasets") from err
    splits = load_dataset("csv", data_files=files)
    assert isinstance(splits, DatasetDict)  # CSV files by split name load as a DatasetDict
    return splits


def _tokenizer(tokenizer: PreTrainedTokenizerBase | str | None, default_name: str) -> PreTrainedTokenizerBase:
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(
            "mocked dataloaders need the `transformers` package: pip install transformers"
        ) from err
    return AutoTokenizer.from_pretrained(tokenizer or default_name)


def _map_style(split: HFDataset) -> Dataset[dict[str, object]]:
    # A Hugging Face Dataset is a map-style dataset (__getitem__ and __len__) without deriving from
    # torch's Dataset class, which is all DataLoader's annotation knows.
    return cast("Dataset[dict[str, object]]", split)


def _is_xla(accelerator: object) -> bool:
    return str(getattr(accelerator, "distributed_type", "")).upper().endswith("XLA")


def mocked_dataloaders(
    accelerator: object,
    batch_size: int = 16,
    *,
    tokenizer: PreTrainedTokenizerBase | str | None = None,
    data_files: dict[str, str] | None = None,
) -> tuple[DataLoader, DataLoader]:
    """Build MRPC train/validation dataloaders from the small CSV samples instead of the Hub dataset.

    Sentence pairs are tokenized (truncated to the model's maximum length), labels become ``labels``
    ids; batches are padded to their longest item (to 128 under XLA, whose graphs need fixed shapes).
    As the reference's helper: 2 rows per training batch (shuffled), 1 per evaluation batch.

    Args:
        accelerator: the Accelerator the loaders are for (its ``distributed_type`` picks the padding).
        batch_size: accepted for the reference's signature, which does not use it either
            (:data:`TRAIN_BATCH_SIZE`, :data:`EVAL_BATCH_SIZE`).
        tokenizer: a tokenizer object or Hub name (default: ``bert-base-cased``).
        data_files: ``{"train": csv, "validation": csv}`` (default: :data:`MRPC_DATA_FILES`).

    Returns:
        ``(train_dataloader, eval_dataloader)``.

    Raises:
        FileNotFoundError: the CSV files are not there.
        ImportError: ``datasets`` or ``transformers`` is not installed.
    """
    del batch_size  # the reference's helper ignores it too
    raw = _load_mrpc(data_files)
    tok = _tokenizer(tokenizer, SEQUENCE_TOKENIZER)
    label_ids = {label: index for index, label in enumerate(raw["train"].unique("label"))}

    def tokenize(examples: dict[str, list]) -> BatchEncoding:
        encoded = tok(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)
        if "label" in examples:
            encoded["labels"] = [label_ids[label] for label in examples["label"]]
        return encoded

    tokenized = raw.map(tokenize, batched=True, remove_columns=raw["train"].column_names)

    def collate(examples: list[dict]) -> BatchEncoding:
        if _is_xla(accelerator):
            return tok.pad(examples, padding="max_length", max_length=128, return_tensors="pt")
        return tok.pad(examples, padding="longest", return_tensors="pt")

    train = DataLoader(
        _map_style(tokenized["train"]), shuffle=True, collate_fn=collate, batch_size=TRAIN_BATCH_SIZE
    )
    evaluation = DataLoader(
        _map_style(tokenized["validation"]), shuffle=False, collate_fn=collate, batch_size=EVAL_BATCH_SIZE
    )
    return train, evaluation


def mocked_dataloaders_for_autoregressive_models(
    accelerator: object,
    batch_size: int = 16,
    *,
    tokenizer: PreTrainedTokenizerBase | str | None = None,
    data_files: dict[str, str] | None = None,
) -> tuple[DataLoader, DataLoader]:
    """Build causal-LM train/validation dataloaders from the MRPC CSV samples.

    Each item is the tokenized first sentence; a batch is padded (with the end-of-sequence token,
    which becomes the pad token) to one more than its longest item (to 129 under XLA), then shifted:
    ``input_ids`` and ``attention_mask`` drop the last position, ``labels`` are the next tokens with
    every pad token set to -100 so the loss ignores it (``token_type_ids`` keep the padded length).
    As the reference's helper: 2 rows per training batch, 1 per evaluation batch, neither shuffled.

    Args:
        accelerator: the Accelerator the loaders are for (its ``distributed_type`` picks the padding).
        batch_size: accepted for the reference's signature, which does not use it either.
        tokenizer: a tokenizer object or Hub name (default: :data:`AUTOREGRESSIVE_TOKENIZER`).
        data_files: ``{"train": csv, "validation": csv}`` (default: :data:`MRPC_DATA_FILES`).

    Returns:
        ``(train_dataloader, eval_dataloader)``.

    Raises:
        FileNotFoundError: the CSV files are not there.
        ImportError: ``datasets`` or ``transformers`` is not installed.
    """
    del batch_size  # the reference's helper ignores it too
    raw = _load_mrpc(data_files)
    tok = _tokenizer(tokenizer, AUTOREGRESSIVE_TOKENIZER)
    tok.pad_token = tok.eos_token

    def tokenize(examples: dict[str, list]) -> BatchEncoding:
        return tok(examples["sentence1"], truncation=False)

    tokenized = raw.map(tokenize, batched=True, remove_columns=raw["train"].column_names)

    def collate(examples: list[dict]) -> BatchEncoding:
        longest = 128 if _is_xla(accelerator) else max(len(example["input_ids"]) for example in examples)
        batch = tok.pad(examples, padding="max_length", max_length=longest + 1, return_tensors="pt")
        ids = batch["input_ids"]
        labels = ids[:, 1:].clone()
        labels[labels == tok.pad_token_id] = -100
        batch["input_ids"], batch["labels"] = ids[:, :-1], labels
        batch["attention_mask"] = batch["attention_mask"][:, :-1]
        return batch

    train = DataLoader(
        _map_style(tokenized["train"]), shuffle=False, collate_fn=collate, batch_size=TRAIN_BATCH_SIZE
    )
    evaluation = DataLoader(
        _map_style(tokenized["validation"]), shuffle=False, collate_fn=collate, batch_size=EVAL_BATCH_SIZE
    )
    return train, evaluation
