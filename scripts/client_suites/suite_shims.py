"""pytest plugin (``-p suite_shims``) adapting trl's GPU-CI test suite to an offline CPU machine.

Two shims, identical in the baseline and the candidate run:

* ``load_dataset("<org>/<name>", ...)`` reads the offline stand-in.
* ``TrainingArguments`` gets ``use_cpu=True`` when no GPU is present: trl's configs default to ``bf16=True`` and
  transformers refuses bf16 without a GPU unless ``use_cpu`` is set (the one line a CPU user adds), so without it
  every trainer test that leaves ``bf16`` at its default fails on both sides.

The dataset stand-ins written by ``build_standins.py`` lie under ``$CLIENT_SUITES_DATASETS/<org>/<name>`` in the Hub's
own file layout (parquet files and a README ``configs:`` block), so loading the folder behaves like loading the
repository: configs, splits and ``streaming=True`` included. Identical in the baseline and the candidate run.
"""

from __future__ import annotations

import functools
import os
import pathlib

import datasets
import datasets.load
import torch
import transformers

_ROOT = pathlib.Path(os.environ.get("CLIENT_SUITES_DATASETS", "/nonexistent"))
_original = datasets.load.load_dataset


@functools.wraps(_original)
def load_dataset(path, *args, **kwargs):
    """``datasets.load_dataset`` with stand-in repository ids mapped to their local folder."""
    if isinstance(path, str) and path.count("/") == 1 and (_ROOT / path / "README.md").is_file():
        path = str(_ROOT / path)
    return _original(path, *args, **kwargs)


datasets.load_dataset = load_dataset
datasets.load.load_dataset = load_dataset


_post_init = transformers.TrainingArguments.__post_init__


def _cpu_post_init(self) -> None:
    """``TrainingArguments.__post_init__`` with ``use_cpu=True`` on a machine without a GPU."""
    if not torch.cuda.is_available():
        self.use_cpu = True
    _post_init(self)


transformers.TrainingArguments.__post_init__ = _cpu_post_init
