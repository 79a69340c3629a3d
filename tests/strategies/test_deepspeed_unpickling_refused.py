"""Issue 27, hole 1 (other libraries): DeepSpeed loads that DeepSpeed itself would unpickle fully are refused.

A checkpoint engine whose ``load`` is not a plain ``torch.load`` (Nebula, DataStates, ...) and a
universal checkpoint (``load_universal``: DeepSpeed reads every parameter's file with
``torch.load(weights_only=False)``) cannot be made weights-only from outside: without the opt-in the
load is refused before DeepSpeed reads anything; with ``load_kwargs={"weights_only": False}`` it goes on.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from accelerando.backends.strategies.deepspeed.strategy import DeepSpeedStrategy
from accelerando.checkpointing import files as F


class NebulaCheckpointEngine:  # named as DeepSpeed's: only the class name is looked at
    pass


class TorchCheckpointEngine:
    pass


class FakeEngine:
    """Enough of a DeepSpeedEngine: ``load_checkpoint`` records that DeepSpeed would have read files."""

    def __init__(self, checkpoint_engine: Any, universal: bool) -> None:
        self.checkpoint_engine = checkpoint_engine
        self.universal = universal
        self.zero_optimization_stage = lambda: 1
        self.read = False

    def load_universal_checkpoint(self) -> bool:
        return self.universal

    def load_checkpoint(self, folder: str, **kwargs: Any) -> tuple[str, dict]:
        self.read = True
        return folder, {}


def _load(engine: FakeEngine, folder: str) -> bool:
    stub = SimpleNamespace(_tag=DeepSpeedStrategy._tag)
    return DeepSpeedStrategy.load_model_checkpoint(stub, engine, folder, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "engine, words",
    [
        (FakeEngine(NebulaCheckpointEngine(), False), "NebulaCheckpointEngine checkpoint engine"),
        (FakeEngine(TorchCheckpointEngine(), True), "universal checkpoint"),
    ],
    ids=["other-checkpoint-engine", "universal-checkpoint"],
)
def test_deepspeed_full_unpickling_needs_the_opt_in(tmp_path, engine: FakeEngine, words: str) -> None:
    folder = str(tmp_path)
    with pytest.raises(F.UnsafeCheckpointError) as info:
        _load(engine, folder)
    message = str(info.value)
    assert words in message and os.path.join(folder, "pytorch_model") in message, message
    assert F.OPT_IN in message and "\n" not in message
    assert not engine.read, "DeepSpeed was let read the files"
    with F.unpickling(False):  # the caller's opt-in
        assert _load(engine, folder)
    assert engine.read


def test_plain_engine_is_not_refused(tmp_path) -> None:
    engine = FakeEngine(TorchCheckpointEngine(), False)
    assert _load(engine, str(tmp_path)) and engine.read
