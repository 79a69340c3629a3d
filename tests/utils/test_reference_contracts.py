"""Small behaviours of the reference's utilities that code written for it relies on."""

from __future__ import annotations

import os
import pickle
import unittest
import warnings
from types import SimpleNamespace

import pytest
import torch

from accelerando.test_utils.training import RegressionModel
from accelerando.utils import (
    CannotPadNestedTensorWarning,
    concatenate,
    convert_outputs_to_fp32,
    extract_model_from_parallel,
    get_model_tp_size,
    pad_across_processes,
    purge_accelerate_environment,
    recursively_apply,
)


def test_purge_reaches_test_methods_of_derived_classes() -> None:
    @purge_accelerate_environment
    class Base(unittest.TestCase):
        def test_base(self) -> None:
            os.environ["ACCELERATE_PURGE_PROBE"] = "base"

    class Derived(Base):
        def test_derived(self) -> None:
            os.environ["ACCELERATE_PURGE_PROBE"] = "derived"

    os.environ.pop("ACCELERATE_PURGE_PROBE", None)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Derived).run(result)
    assert result.wasSuccessful()
    assert "ACCELERATE_PURGE_PROBE" not in os.environ
    # wrapped once, even when both the base and the derived class list the method
    assert Derived.test_base is Base.test_base


def test_concatenate_returns_a_single_batch_as_is_and_refuses_to_merge_strings() -> None:
    assert concatenate(["text"]) == "text"
    with pytest.raises(TypeError):
        concatenate([{"a": torch.ones(1), "c": "x"}, {"a": torch.ones(1), "c": "y"}])
    assert concatenate([torch.ones(2, 3), torch.zeros(2, 3)]).shape == (4, 3)


def test_recursively_apply_names_the_unsupported_type_and_function() -> None:
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'int'>\) passed to `tensor`"):
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)


def test_pad_across_processes_warns_for_a_nested_tensor_in_one_process() -> None:
    nested = torch.nested.nested_tensor([[1.0, 2.0], [1.0]])
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested
    dense = torch.ones(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pad_across_processes(dense, dim=-4) is dense


def test_tensor_parallel_degree_from_the_config() -> None:
    model = RegressionModel()
    assert get_model_tp_size(model) is None
    model.tp_size = None
    model.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))
    assert get_model_tp_size(model) == 4
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})
    assert get_model_tp_size(model) == 8


def test_unwrapping_restores_a_forward_recorded_under_the_reference_name() -> None:
    model = RegressionModel()
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in vars(model)
    pickle.loads(pickle.dumps(model))
