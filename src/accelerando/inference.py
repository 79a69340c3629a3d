"""Pipeline-parallel inference (``prepare_pippy``).

Not implemented yet: splitting a model into pipeline stages needs ``torch.distributed.pipelining`` on
several GPUs, which this project cannot test. Calling it fails clearly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prepare_pippy"]


def prepare_pippy(
    model: Any,
    split_points: Any = "auto",
    no_split_module_classes: Any = None,
    example_args: tuple = (),
    example_kwargs: dict | None = None,
    num_chunks: int | None = None,
    gather_output: bool = False,
) -> Any:
    """Split ``model`` into pipeline stages across processes for inference.

    Raises:
        NotImplementedError: always, for now; use ``dispatch_model`` / ``load_checkpoint_and_dispatch``
            (big-model inference over several devices) or ``split_between_processes`` instead.
    """
    raise NotImplementedError(
        "prepare_pippy (pipeline-parallel inference) is not supported by accelerando yet; use "
        "load_checkpoint_and_dispatch(device_map='auto') or Accelerator.split_between_processes"
    )
