"""``accelerando.test_utils`` gives the reference's data and shapes (issue 40, item 3).

The same helpers of both libraries run in fresh interpreters (``helpers_dump.py``) on the same MRPC-like
sample files and the same offline tokenizer: the mocked dataloaders (batch counts, shapes, values,
shuffle), ``RegressionDataset`` / ``RegressionModel`` (values, dtypes, what the first forward prints)
and whether each testing decorator skips on this machine must be equal, so a test suite written
against the reference's helpers counts the same steps here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("datasets")
pytest.importorskip("transformers")

DUMP = Path(__file__).with_name("helpers_dump.py")

_SENTENCES = [
    ("equivalent", "He said the pie business doesn 't fit the company 's growth strategy .", '" The pie business does not fit our growth strategy ."'),
    ("not_equivalent", "Magnarelli said Racicot hated the regime and looked forward to the war .", "His wife said he was 100 percent behind the plan ."),
    ("equivalent", "The dollar was at 116.92 yen against the yen , flat on the session .", "The dollar was at 116.78 yen , virtually flat on the session ."),
    ("not_equivalent", "The AFL-CIO is waiting until October to decide if it will endorse a candidate .", "The AFL-CIO announced Wednesday that it will decide in October ."),
    ("equivalent", "No dates have been set for the civil or the criminal trial .", "No dates have been set for the criminal or civil cases , but Shanley has pleaded not guilty ."),
    ("equivalent", "Wal-Mart said it would check all of its million-plus domestic workers .", "Wal-Mart said it would check the immigration status of all its workers ."),
]  # fmt: skip


def _write_samples(folder: Path) -> None:
    import csv

    samples = folder / "tests" / "test_samples" / "MRPC"
    samples.mkdir(parents=True)
    for name, rows in (("train.csv", _SENTENCES), ("dev.csv", _SENTENCES[::-1])):
        with (samples / name).open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["label", "sentence1", "sentence2"])
            writer.writerows(rows)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("helpers")
    _write_samples(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    env.update(HF_DATASETS_CACHE=str(folder / "datasets-cache"), PYTHONWARNINGS="ignore")
    runs = {
        lib: subprocess.Popen(
            [sys.executable, str(DUMP), lib, str(folder / f"{lib}.json")],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for lib in ("accelerate", "accelerando")
    }
    for lib, run in runs.items():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{lib}:\n{err[-4000:]}"
    return {lib: json.loads((folder / f"{lib}.json").read_text()) for lib in runs}


@pytest.mark.parametrize(
    "loader",
    [
        "mocked_dataloaders/train",
        "mocked_dataloaders/eval",
        "mocked_dataloaders_for_autoregressive_models/train",
        "mocked_dataloaders_for_autoregressive_models/eval",
    ],
)
def test_mocked_dataloaders_give_the_references_batches(dumps: dict[str, dict], loader: str) -> None:
    ours, reference = dumps["accelerando"][loader], dumps["accelerate"][loader]
    print(f"{loader}: {len(reference)} batches on the reference, {len(ours)} here")
    assert [{k: v[1] for k, v in b.items()} for b in ours] == [
        {k: v[1] for k, v in b.items()} for b in reference
    ]
    assert ours == reference


def test_the_same_tokenizers_are_asked_for(dumps: dict[str, dict]) -> None:
    assert dumps["accelerando"]["tokenizers asked for"] == dumps["accelerate"]["tokenizers asked for"]


def test_regression_dataset_and_model_match(dumps: dict[str, dict]) -> None:
    keys = [k for k in dumps["accelerate"] if k.startswith(("dataset", "model"))]
    assert keys
    assert {k: dumps["accelerando"][k] for k in keys} == {k: dumps["accelerate"][k] for k in keys}


def test_testing_decorators_skip_as_the_reference_does(dumps: dict[str, dict]) -> None:
    reference, ours = dumps["accelerate"]["decorators"], dumps["accelerando"]["decorators"]
    assert reference.keys() <= ours.keys(), sorted(reference.keys() - ours.keys())
    assert {k: ours[k] for k in reference} == reference
