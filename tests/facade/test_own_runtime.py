"""Each Accelerator answers from its own Runtime; a second one agrees with the process's mixed precision.

As in the reference, a process has one mixed-precision mode until ``AcceleratorState._reset_state()``:
a second Accelerator that asks for another is refused with the reference's ValueError, and one that
leaves it unset takes the mode in effect. After a reset, an Accelerator built before it keeps answering
its own mode (the reference's answers follow the newest state: the ``own-runtime`` difference).
"""

from __future__ import annotations

import pytest
import torch

from accelerando import Accelerator
from accelerando.state import AcceleratorState

pytestmark = pytest.mark.usefixtures("fresh_state", "isolated_env")

# The reference's message (accelerate 1.15.0, AcceleratorState._check_initialized), observed with
# `Accelerator(cpu=True); Accelerator(cpu=True, mixed_precision="bf16")`.
REFERENCE_REFUSAL = (
    "AcceleratorState has already been initialized and cannot be changed, restart your runtime completely "
    "and pass `mixed_precision='bf16'` to `Accelerator()`."
)


def test_a_second_accelerator_asking_for_another_precision_is_refused_as_the_reference_does() -> None:
    first = Accelerator(cpu=True)
    with pytest.raises(ValueError) as refused:
        Accelerator(cpu=True, mixed_precision="bf16")
    assert str(refused.value).startswith(REFERENCE_REFUSAL)
    assert "mixed_precision='no'" in str(refused.value)  # the mode in effect, and the fix, follow
    assert first.mixed_precision == "no" and AcceleratorState().mixed_precision == "no"


def test_a_second_accelerator_with_the_same_or_no_precision_shares_the_mode_in_effect() -> None:
    first = Accelerator(cpu=True, mixed_precision="bf16")
    same = Accelerator(cpu=True, mixed_precision="bf16")
    unset = Accelerator(cpu=True)  # the reference's second Accelerator takes the state's mode too
    assert first.mixed_precision == same.mixed_precision == unset.mixed_precision == "bf16"
    with unset.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")


def test_after_a_reset_each_accelerator_answers_from_its_own_runtime() -> None:
    first = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    second = Accelerator(cpu=True, mixed_precision="bf16")
    assert (first.mixed_precision, second.mixed_precision) == ("no", "bf16")
    assert AcceleratorState().mixed_precision == "bf16"  # the process view follows the newest
    assert first.runtime is not second.runtime
    assert first.distributed_type == first.runtime.distributed_type
    assert first.torch_device_mesh is first.runtime.mesh and first.deepspeed_plugin is None
    assert first.is_fsdp2 is False
    with first.autocast():  # first's own numerics: no autocast, whatever the newest Accelerator says
        assert not torch.is_autocast_enabled("cpu")
