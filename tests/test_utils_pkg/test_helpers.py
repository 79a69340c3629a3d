"""Test-case bases, assertions, example comparison and training fixtures of accelerando.test_utils."""

from __future__ import annotations

import os
import unittest
from unittest import mock

import pytest
import torch

from accelerando.test_utils import examples, testing, training


def _run(case: type[unittest.TestCase], *names: str) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.TestSuite([case(name) for name in names]).run(result)
    return result


def test_assert_exception():
    with testing.assert_exception(ValueError, "bad value"):
        raise ValueError("a bad value here")
    with pytest.raises(AssertionError, match="ran without issue"), testing.assert_exception(ValueError):
        pass
    with (
        pytest.raises(AssertionError, match="Expected exception of type"),
        testing.assert_exception(ValueError),
    ):
        raise KeyError("other")
    with (
        pytest.raises(AssertionError, match="to be in exception"),
        testing.assert_exception(ValueError, "needle"),
    ):
        raise ValueError("haystack")


def test_capture_call_output():
    def talk(word, times=1):
        print(word * times)

    assert testing.capture_call_output(talk, "ab", times=2) == "abab\n"
    with pytest.raises(ZeroDivisionError):
        testing.capture_call_output(lambda: 1 / 0)
    assert testing.capture_call_output(print, "stdout is back") == "stdout is back\n"


def test_temp_dir_test_case_clears_between_tests():
    seen: list[list[str]] = []

    class Case(testing.TempDirTestCase):
        def test_a(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))
            (self.tmpdir / "file.txt").write_text("x")
            (self.tmpdir / "sub").mkdir()

        def test_b(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))

    result = _run(Case, "test_a", "test_b")
    assert result.wasSuccessful(), result.errors
    assert seen == [[], []]
    assert not Case.tmpdir.exists()

    class Keeping(Case):
        clear_on_setup = False

    seen.clear()
    _run(Keeping, "test_a", "test_b")
    assert seen == [[], ["file.txt", "sub"]]


def test_mocking_test_case_starts_and_stops_patchers():
    inside: list[str | None] = []

    class Case(testing.MockingTestCase):
        def setUp(self):
            self.add_mocks([mock.patch.dict(os.environ, {"H3_MOCKED": "on"})])

        def test_x(self):
            inside.append(os.environ.get("H3_MOCKED"))

    assert _run(Case, "test_x").wasSuccessful()
    assert inside == ["on"] and "H3_MOCKED" not in os.environ


def test_accelerate_test_case_resets_the_state():
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, PartialState

    class Case(testing.AccelerateTestCase):
        def test_x(self):
            Accelerator(cpu=True)
            assert AcceleratorState._shared_state

    assert _run(Case, "test_x").wasSuccessful()
    assert not AcceleratorState._shared_state and not PartialState._shared_state


def test_are_the_same_tensors_single_process(fresh_state):
    from accelerando import Accelerator

    Accelerator(cpu=True)
    assert testing.are_the_same_tensors(torch.tensor([1.0, 2.0]))


_BASE = """import os

def training_function(config, args):
    lr = config["lr"]
    model = build()
    for epoch in range(3):
        train(model)

def main():
    parser = argparse.ArgumentParser()
    args = parser.parse_args()

if __name__ == "__main__":
    main()
"""


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_get_function_contents_by_name_and_clean_lines():
    lines = _BASE.splitlines(keepends=True)
    body = examples.get_function_contents_by_name(lines, "training_function")
    assert body[0].startswith("def training_function") and body[-1].strip() == ""
    assert examples.clean_lines(body)[-1] == "train(model)\n"
    assert (
        examples.clean_lines(examples.get_function_contents_by_name(lines, "main"))[-1]
        == "args = parser.parse_args()\n"
    )
    with pytest.raises(ValueError, match="nowhere"):
        examples.get_function_contents_by_name(lines, "nowhere")


def test_compare_against_test(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "examples" / "nlp_example.py", _BASE)
    feature = _BASE.replace("    model = build()\n", "    model = build()\n    tracker = start_tracking()\n")
    feature = feature.replace(
        "    args = parser.parse_args()\n",
        '    parser.add_argument("--track")\n    args = parser.parse_args()\n',
    )
    feature_file = _write(tmp_path / "examples" / "by_feature" / "tracking.py", feature)
    stale = _write(tmp_path / "examples" / "complete.py", _BASE)
    assert examples.compare_against_test(stale, feature_file, parser_only=False) == [
        "tracker = start_tracking()\n"
    ]
    assert examples.compare_against_test(stale, feature_file, parser_only=True) == [
        'parser.add_argument("--track")\n'
    ]
    up_to_date = _write(tmp_path / "examples" / "complete2.py", feature)
    assert examples.compare_against_test(up_to_date, feature_file, parser_only=False) == []
    assert examples.compare_against_test(stale, feature_file, False, secondary_filename=up_to_date) == []


def test_compare_against_test_needs_the_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="nlp_example"):
        examples.compare_against_test("a.py", "b.py", parser_only=False)


def test_regression_fixtures():
    data = training.RegressionDataset(length=8, seed=0)
    assert len(data) == 8 and set(data[0]) == {"x", "y"}
    model = training.RegressionModel(a=2, b=1, double_output=True)
    out = model(torch.tensor([1.0, 2.0]))  # one tensor, as the reference's (double_output is only stored)
    assert torch.equal(out, torch.tensor([3.0, 5.0])) and model.double_output and not model.first_batch


def test_mocked_dataloaders_need_the_sample_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="MRPC"):
        training.mocked_dataloaders(accelerator=None)


def test_mocked_dataloaders_from_local_csv(tmp_path):
    pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "a", "dog", "ran"]
    vocab.write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab), model_max_length=16)
    rows = "label,sentence1,sentence2\n" + "".join(
        f"{i % 2},the cat sat,a dog ran {'the ' * i}\n" for i in range(6)
    )
    files = {"train": _write(tmp_path / "train.csv", rows), "validation": _write(tmp_path / "dev.csv", rows)}
    accelerator = mock.Mock(distributed_type="MULTI_CPU")
    train, evaluation = training.mocked_dataloaders(
        accelerator, batch_size=4, tokenizer=tokenizer, data_files=files
    )
    # As the reference's helper: batch_size is not used; 2 rows per training batch, 1 per evaluation one.
    assert [len(b["labels"]) for b in evaluation] == [1] * 6
    assert [len(b["labels"]) for b in train] == [2, 2, 2]
    assert {int(b["labels"]) for b in evaluation} == {0, 1}


def test_check_scripts_are_modules_of_the_package():
    """``from accelerate.test_utils import test_sync`` as in the reference: the scripts, as modules."""
    import accelerando.test_utils as test_utils
    from accelerando.test_utils import test_ops, test_script, test_sync

    for module in (test_ops, test_script, test_sync):
        assert module.__name__.startswith("accelerando.test_utils.scripts.")
        assert callable(module.main)
    assert {"test_ops", "test_script", "test_sync"} <= set(test_utils.__all__)
    with pytest.raises(AttributeError):
        test_utils.test_nothing_such  # noqa: B018
