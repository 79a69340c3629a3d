"""NLP example: fine-tune a tiny transformers classifier on generated sentences, on any hardware.

The model is built from a config (nothing is downloaded): a 2-layer BERT, or a 2-layer Llama with
``--model llama``, hidden size 32. The data set is made up on the spot: sentences of filler words with
a few "positive" or "negative" words mixed in; the label is which kind they contain. A word-level
tokenizer written below turns them into ``input_ids`` and ``attention_mask``.

    python examples/nlp_example.py --tiny
    accelerando launch --cpu --num_processes 2 examples/nlp_example.py --tiny
    accelerando launch --num_processes 8 --mixed_precision bf16 examples/nlp_example.py --model llama

The last line printed is ``METRICS {...}`` (JSON): first and last training loss, evaluation accuracy.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import set_seed

POSITIVE = ["good", "great", "lovely", "fine", "superb", "happy", "bright", "calm"]
NEGATIVE = ["bad", "awful", "poor", "sad", "grim", "broken", "dull", "angry"]
FILLER = ["the", "a", "day", "was", "film", "and", "very", "it", "we", "saw", "of", "with", "this", "then"]
SPECIAL = ["[PAD]", "[CLS]"]


class WordTokenizer:
    """Maps words to ids and pads a batch to its longest sentence (``[CLS]`` first, ``[PAD]`` = 0)."""

    def __init__(self, words: list[str]) -> None:
        self.vocab = {word: index for index, word in enumerate(SPECIAL + words)}

    def __len__(self) -> int:
        return len(self.vocab)

    def __call__(self, sentences: list[str]) -> dict[str, torch.Tensor]:
        ids = [[self.vocab["[CLS]"]] + [self.vocab[w] for w in s.split()] for s in sentences]
        width = max(len(row) for row in ids)
        input_ids = torch.zeros(len(ids), width, dtype=torch.long)
        attention_mask = torch.zeros(len(ids), width, dtype=torch.long)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = torch.tensor(tokens)
            attention_mask[row, : len(tokens)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class SentimentSentences(Dataset):
    """``n`` generated (sentence, label) pairs; label 1 when the sentence holds positive words."""

    def __init__(self, n: int, seed: int) -> None:
        rng = random.Random(seed)
        self.items: list[tuple[str, int]] = []
        for _ in range(n):
            label = rng.randint(0, 1)
            words = rng.choices(FILLER, k=rng.randint(3, 10))
            for _ in range(rng.randint(1, 3)):
                words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
            self.items.append((" ".join(words), label))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.items[index]


def build_model(kind: str, vocab_size: int) -> torch.nn.Module:
    """A 2-layer, hidden-32 sequence classifier from a transformers config (random weights)."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForSequenceClassification,
    )

    if kind == "bert":
        bert = BertConfig(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64,
        )  # fmt: skip
        bert.num_labels = 2
        return BertForSequenceClassification(bert)
    # Llama classifies from the last non-padding token, so it must know the padding id.
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    config.num_labels = 2
    return LlamaForSequenceClassification(config)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=["bert", "llama"], default="bert")
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tiny", action="store_true", help="a few seconds on a CPU: small data, 3 epochs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    train_size, eval_size = (512, 128) if args.tiny else (4000, 1000)
    epochs = 3 if args.tiny else args.epochs
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)

    tokenizer = WordTokenizer(POSITIVE + NEGATIVE + FILLER)

    def collate(batch: list[tuple[str, int]]) -> dict[str, torch.Tensor]:
        sentences, labels = zip(*batch, strict=True)
        return {**tokenizer(list(sentences)), "labels": torch.tensor(labels)}

    train = DataLoader(
        SentimentSentences(train_size, args.seed),
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=collate,
    )
    evaluation = DataLoader(SentimentSentences(eval_size, args.seed + 1), batch_size=64, collate_fn=collate)
    model = build_model(args.model, len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total_steps = epochs * len(train)
    # Linear decay to zero; the scheduler is stepped once per optimizer step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / (total_steps + 1))
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )

    losses: list[float] = []
    accuracy = 0.0
    progress = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for epoch in range(epochs):
        model.train()
        for batch in train:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
            progress.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3f}")
            progress.update()
        model.eval()
        correct = total = 0
        for batch in evaluation:
            with torch.no_grad():
                predictions = model(**batch).logits.argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, batch["labels"]))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        accuracy = correct / total
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f} on {total} sentences")
    progress.close()

    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    metrics = {"first_loss": first, "last_loss": last, "accuracy": accuracy, "eval_samples": total}
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
