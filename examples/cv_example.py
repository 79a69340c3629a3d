"""CV example: train a small CNN on generated images, on any hardware.

The images are drawn on the spot (no download, no torchvision): 3x16x16 pictures of one of four
shapes (horizontal bar, vertical bar, hollow square, cross) at a random place and colour, on noise.
The data pipeline mirrors torchvision's: a ``Dataset`` returning (image, label) with a composed
``transform`` (random horizontal flip, per-channel normalisation), and a ResNet-like CNN.

    python examples/cv_example.py --tiny
    accelerando launch --cpu --num_processes 2 examples/cv_example.py --tiny
    accelerando launch --num_processes 4 --mixed_precision bf16 examples/cv_example.py --epochs 10

The last line printed is ``METRICS {...}`` (JSON): first and last training loss, evaluation accuracy.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import set_seed

CLASSES = ["horizontal bar", "vertical bar", "square", "cross"]
SIZE = 16
MEAN, STD = torch.tensor([0.3, 0.3, 0.3]), torch.tensor([0.3, 0.3, 0.3])


def draw(kind: int, generator: torch.Generator) -> torch.Tensor:
    """One 3xSIZExSIZE image in [0, 1] showing shape ``kind`` on uniform noise."""
    image = torch.rand(3, SIZE, SIZE, generator=generator) * 0.3
    colour = 0.5 + 0.5 * torch.rand(3, 1, generator=generator)
    top, left = (int(v) for v in torch.randint(2, SIZE - 8, (2,), generator=generator))
    mask = torch.zeros(SIZE, SIZE, dtype=torch.bool)
    if kind == 0:
        mask[top + 3 : top + 5, left : left + 7] = True
    elif kind == 1:
        mask[top : top + 7, left + 3 : left + 5] = True
    elif kind == 2:
        mask[top : top + 7, left : left + 7] = True
        mask[top + 1 : top + 6, left + 1 : left + 6] = False
    else:
        mask[top + 3, left : left + 7] = True
        mask[top : top + 7, left + 3] = True
    image[:, mask] = colour.expand(3, int(mask.sum()))
    return image


class Compose:
    """Apply transforms one after the other (as ``torchvision.transforms.Compose`` does)."""

    def __init__(self, transforms: list[Callable[[torch.Tensor], torch.Tensor]]) -> None:
        self.transforms = transforms

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            image = transform(image)
        return image


def random_horizontal_flip(image: torch.Tensor) -> torch.Tensor:
    """Mirror the image left-right with probability 1/2 (every shape here is flip-invariant)."""
    return image.flip(-1) if torch.rand(()) < 0.5 else image


def normalize(image: torch.Tensor) -> torch.Tensor:
    """Per-channel standardisation with the data set's mean and deviation."""
    return (image - MEAN[:, None, None]) / STD[:, None, None]


class Shapes(Dataset):
    """``n`` generated (image, label) pairs, drawn once; ``transform`` is applied on every read."""

    def __init__(self, n: int, seed: int, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, len(CLASSES), (n,), generator=generator)
        self.images = torch.stack([draw(int(k), generator) for k in self.labels])
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[index]), self.labels[index]


class Block(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def small_resnet(width: int, num_classes: int) -> nn.Module:
    """Stem convolution, two residual stages with downsampling, global pooling, linear head."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        Block(width),
        nn.MaxPool2d(2),
        Block(width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, num_classes),
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--width", type=int, default=32, help="channels of the CNN")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tiny", action="store_true", help="a few seconds on a CPU: small data and CNN")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    train_size, eval_size = (512, 128) if args.tiny else (8000, 2000)
    epochs, width = (3, 8) if args.tiny else (args.epochs, args.width)
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)

    train = DataLoader(
        Shapes(train_size, args.seed, Compose([random_horizontal_flip, normalize])),
        batch_size=args.batch_size,
        shuffle=True,
    )
    evaluation = DataLoader(Shapes(eval_size, args.seed + 1, normalize), batch_size=128)
    model = small_resnet(width, len(CLASSES))
    if accelerator.num_processes > 1 and accelerator.device.type == "cuda":
        # Batch statistics over the global batch, not each process's slice (PyTorch's SyncBatchNorm
        # runs on GPUs only; on CPU each process normalises its own slice).
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=epochs * len(train), pct_start=0.2
    )
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )

    losses: list[float] = []
    accuracy, total = 0.0, 0
    progress = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for epoch in range(epochs):
        model.train()
        for images, labels in train:
            loss = nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
            progress.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3f}")
            progress.update()
        model.eval()
        correct = total = 0
        for images, labels in evaluation:
            with torch.no_grad():
                predictions = model(images).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        accuracy = correct / total
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f} on {total} images")
    progress.close()

    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    metrics = {"first_loss": first, "last_loss": last, "accuracy": accuracy, "eval_samples": total}
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
