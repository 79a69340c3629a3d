"""The ``Example:`` blocks of the API reference: every public Accelerator method and every documented
top-level function has one, and they run (doctest, one CPU process; a ``+SKIP`` marks the lines that
need several processes, a GPU or an optional package).

Accelerator examples run against a fresh ``accelerator = Accelerator(cpu=True)`` with a ``model``
(``nn.Linear(4, 2)``), ``optimizer`` and ``dataloader`` (8 samples, batches of 2) it prepared, in a
temporary working folder, as docs/reference/api/accelerator.md tells the reader. Function examples
import what they use.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from accelerando import Accelerator

# The top-level functions the reference documents (shared/API.md, "accelerando (top level)"), by the
# public path the docs render them at.
DOCUMENTED_FUNCTIONS = [
    "accelerando.init_empty_weights",
    "accelerando.init_on_device",
    "accelerando.cpu_offload",
    "accelerando.cpu_offload_with_hook",
    "accelerando.disk_offload",
    "accelerando.dispatch_model",
    "accelerando.load_checkpoint_and_dispatch",
    "accelerando.load_checkpoint_in_model",
    "accelerando.infer_auto_device_map",
    "accelerando.skip_first_batches",
    "accelerando.prepare_pippy",
    "accelerando.notebook_launcher",
    "accelerando.debug_launcher",
    "accelerando.find_executable_batch_size",
    "accelerando.synchronize_rng_states",
    "accelerando.utils.set_seed",
    "accelerando.utils.compute_module_sizes",
    "accelerando.utils.get_balanced_memory",
    "accelerando.utils.find_tied_parameters",
    "accelerando.utils.check_tied_parameters_on_same_device",
    "accelerando.utils.retie_parameters",
    "accelerando.utils.convert_bytes",
    "accelerando.utils.write_basic_config",
    "accelerando.utils.release_memory",
    "accelerando.utils.send_to_device",
    "accelerando.utils.save_accelerator_state",
    "accelerando.utils.load_accelerator_state",
    "accelerando.utils.save_custom_state",
    "accelerando.utils.load_custom_state",
    "accelerando.logging.get_logger",
]


def _public_methods() -> list[str]:
    names = []
    for name in dir(Accelerator):
        if name.startswith("_") or isinstance(inspect.getattr_static(Accelerator, name), property):
            continue
        if callable(getattr(Accelerator, name)):
            names.append(name)
    return names


METHODS = _public_methods()


def _resolve(path: str) -> Callable[..., object]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _source(function: Callable[..., object]) -> Callable[..., object]:
    """The function whose docstring the reference page shows (a delegation's service method)."""
    return inspect.unwrap(function)


def _has_example(function: Callable[..., object]) -> bool:
    doc = inspect.getdoc(_source(function)) or ""
    return any(line.strip() in ("Example:", "Examples:") for line in doc.splitlines()) and ">>>" in doc


def test_there_are_methods_to_check():
    assert len(METHODS) >= 50


def test_every_public_accelerator_method_has_an_example():
    missing = [name for name in METHODS if not _has_example(getattr(Accelerator, name))]
    assert not missing, f"public Accelerator methods without an Example: block: {missing}"


def test_every_documented_function_has_an_example():
    missing = [path for path in DOCUMENTED_FUNCTIONS if not _has_example(_resolve(path))]
    assert not missing, f"documented functions without an Example: block: {missing}"


def _accelerator_globs() -> dict[str, object]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=2))
    return {
        "torch": torch,
        "accelerator": accelerator,
        "model": model,
        "optimizer": optimizer,
        "dataloader": dataloader,
    }


def _run(function: Callable[..., object], name: str, globs: dict[str, object]) -> None:
    source = _source(function)
    tests = doctest.DocTestFinder(recurse=False).find(source, name, globs=globs)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert sum(len(test.examples) for test in tests) > 0, f"{name}: no example found"
    assert failed == 0, f"{name}: {failed} of {attempted} example lines failed (doctest output above)"


@pytest.mark.parametrize("name", METHODS)
def test_accelerator_method_examples_run(
    name: str, fresh_state: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    _run(getattr(Accelerator, name), f"Accelerator.{name}", _accelerator_globs())


@pytest.mark.parametrize("path", DOCUMENTED_FUNCTIONS)
def test_documented_function_examples_run(
    path: str, fresh_state: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    _run(_resolve(path), path, {})
