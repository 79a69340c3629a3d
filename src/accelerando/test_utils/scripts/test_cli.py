"""The smallest script for ``accelerando launch`` tests: report the visible accelerators and exit 0."""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Print how many GPUs this process sees (0 without CUDA)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"Successfully ran on {count} GPUs")


if __name__ == "__main__":
    main()
