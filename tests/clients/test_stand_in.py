"""accelerando standing in for ``accelerate`` (install_as_accelerate), each check in a fresh interpreter.

The interpreters are independent: a module fixture starts them together (``ConcurrentProbes``) and each
test checks its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from suite_support import ConcurrentProbes

# The probes: each runs in its own fresh interpreter.
NAMES_AND_PATCHING = """
        import importlib.metadata, importlib.util, sys
        from unittest import mock
        from accelerando.core.stand_in import ACCELERATE_COMPAT_VERSION, install_as_accelerate

        install_as_accelerate()
        install_as_accelerate()  # idempotent
        assert sum(type(f).__name__ == "_StandInFinder" for f in sys.meta_path) == 1
        assert importlib.util.find_spec("accelerate") is not None
        assert importlib.metadata.version("accelerate") == ACCELERATE_COMPAT_VERSION == "1.15.0"
        assert importlib.metadata.distribution("accelerate").metadata["Name"] == "accelerate"

        import accelerate
        import accelerate.utils
        import accelerando
        import accelerando.utils

        assert accelerate.__version__ == ACCELERATE_COMPAT_VERSION
        assert accelerando.__version__ != ACCELERATE_COMPAT_VERSION
        assert accelerate.Accelerator is accelerando.Accelerator
        assert sys.modules["accelerate.utils"] is sys.modules["accelerando.utils"]
        assert accelerando.utils.__spec__.name == "accelerando.utils"  # the real spec is kept
        from accelerate.state import PartialState
        from accelerando.state import PartialState as Own
        assert PartialState is Own

        with mock.patch("accelerate.utils.set_seed") as fake:
            accelerando.utils.set_seed(3)
        assert fake.called and not isinstance(accelerando.utils.set_seed, mock.MagicMock)
        with mock.patch("accelerate.Accelerator") as fake:
            assert accelerando.Accelerator is fake
        assert accelerate.Accelerator is accelerando.accelerator.Accelerator

        try:
            import accelerate.no_such_module  # noqa: F401
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("missing module imported")
        assert importlib.util.find_spec("accelerate.no_such_module") is None
        assert "accelerate.no_such_module" not in sys.modules
        print("ok")
        """

REFUSES_AFTER_THE_REAL_ONE = """
        import accelerate
        from accelerando.core.stand_in import AccelerateAlreadyImportedError, install_as_accelerate
        try:
            install_as_accelerate()
        except AccelerateAlreadyImportedError as error:
            assert isinstance(error, ImportError)
            print(error)
        """

WINS_FOR_TRANSFORMERS = """
        from accelerando.core.stand_in import install_as_accelerate
        install_as_accelerate()
        from transformers.utils import is_accelerate_available
        assert is_accelerate_available("1.12.0")
        import accelerate
        assert type(accelerate).__module__ == "accelerando.core.stand_in"
        print("ok")
        """

CONSOLE_LAUNCH = """
        import sys
        from accelerando.commands.accelerate_cli import accelerate_console_main
        sys.exit(accelerate_console_main(["launch", "--num_processes", "1", {script!r}]))
        """

LOGGER_NAMES = """
        import logging
        from accelerando.core.stand_in import install_as_accelerate

        install_as_accelerate()
        assert logging.getLogger("accelerate.utils.environment") is logging.getLogger("accelerando.utils.environment")
        assert logging.getLogger("accelerate") is logging.getLogger("accelerando")
        assert logging.getLogger("accelerated").name == "accelerated"  # only the package's own names
        from accelerate.utils import convert_dict_to_env_variables

        seen = []
        handler = logging.Handler()
        handler.emit = seen.append
        logging.getLogger("accelerate.utils.environment").addHandler(handler)
        convert_dict_to_env_variables({"BAD": "<x"})
        assert len(seen) == 1 and seen[0].levelno == logging.WARNING
        print("ok")
        """


def _command(code: str) -> dict:
    return {"args": [sys.executable, "-c", textwrap.dedent(code)]}


@pytest.fixture(scope="module")
def probes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConcurrentProbes]:
    script = tmp_path_factory.mktemp("console") / "child.py"
    script.write_text(
        "import accelerate\n"
        "print('CHILD', type(accelerate).__module__, accelerate.__version__, accelerate.Accelerator.__module__)\n"
    )
    commands = {
        "test_import_names_metadata_and_patching_resolve_to_accelerando": _command(NAMES_AND_PATCHING),
        "test_refuses_after_real_accelerate_was_imported": _command(REFUSES_AFTER_THE_REAL_ONE),
        "test_stand_in_wins_over_installed_accelerate_for_transformers": _command(WINS_FOR_TRANSFORMERS),
        "test_accelerate_console_command_launches_scripts_on_the_stand_in": _command(
            CONSOLE_LAUNCH.format(script=str(script))
        ),
        "test_reference_logger_names_are_accelerandos_loggers": _command(LOGGER_NAMES),
    }
    running = ConcurrentProbes(request, commands)
    try:
        yield running
    finally:
        running.close()


def _run(probes: ConcurrentProbes, test: str) -> subprocess.CompletedProcess[str]:
    return probes.result(test, timeout=120)


def _ok(probes: ConcurrentProbes, test: str) -> str:
    result = _run(probes, test)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_names_metadata_and_patching_resolve_to_accelerando(probes: ConcurrentProbes) -> None:
    out = _ok(probes, "test_import_names_metadata_and_patching_resolve_to_accelerando")
    assert out.strip() == "ok"


def test_refuses_after_real_accelerate_was_imported(probes: ConcurrentProbes) -> None:
    pytest.importorskip("accelerate")  # the reference, installed here for comparisons
    result = _run(probes, "test_refuses_after_real_accelerate_was_imported")
    assert result.returncode == 0, result.stderr
    assert "before" in result.stdout and "install_as_accelerate" in result.stdout


def test_stand_in_wins_over_installed_accelerate_for_transformers(probes: ConcurrentProbes) -> None:
    pytest.importorskip("transformers")
    out = _ok(probes, "test_stand_in_wins_over_installed_accelerate_for_transformers")
    assert out.strip() == "ok"


def test_accelerate_console_command_launches_scripts_on_the_stand_in(probes: ConcurrentProbes) -> None:
    """`accelerate launch script.py` (the console entry) runs a script that imports accelerate on accelerando."""
    out = _ok(probes, "test_accelerate_console_command_launches_scripts_on_the_stand_in")
    assert "CHILD accelerando.core.stand_in 1.15.0 accelerando.accelerator" in out


def test_reference_logger_names_are_accelerandos_loggers(probes: ConcurrentProbes) -> None:
    out = _ok(probes, "test_reference_logger_names_are_accelerandos_loggers")
    assert out.strip() == "ok"
