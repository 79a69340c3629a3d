"""Job files written by ``--emit`` carry hostile values as data: nothing the user typed runs, or expands.

The sbatch script is checked with ``bash -n`` and then RUN with stub ``srun``/``scontrol`` on PATH and a
stub ``accelerando`` that writes the argv and environment it got (NUL-separated): every value must
arrive byte for byte and a canary file that the payloads try to create must not appear. Its
``#SBATCH`` lines are read back with a transcription of sbatch's own directive parser (both the
current one and the older one). The PyTorchJob manifest is read back with ``yaml.safe_load`` and
its container args and env go through a transcription of Kubernetes' ``$(VAR)`` expansion.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerando.core.settings.fields import FIELDS_BY_NAME
from accelerando.launchers.emit import JobSpec
from accelerando.launchers.emit.kubernetes import render_manifest
from accelerando.launchers.emit.slurm import render_sbatch, setting_flags
from accelerando.launchers.plan import Command

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="runs bash and stub executables")

CANARY = "CANARY"
# Pieces that a shell, sbatch, YAML or Kubernetes would read as something other than text.
_PIECES = [
    f"$(touch {CANARY})", f"`touch {CANARY}`", f";touch {CANARY};", f"'$(touch {CANARY})'", f'";touch {CANARY};"',
    f"&& touch {CANARY}", f"| tee {CANARY}", f">{CANARY}", "$(MASTER_ADDR)", "$(RANK)", "$$(RANK)", "$$", "$",
    "${HOME}", "$((1+1))", "'", '"', "\\", "\\'", "#", "# comment", "%j", "*", "?", "~", "!", "&", "(", ")",
    "{", "}", "-", "--flag", " ", "é", "日本語", "\u2028", "\u0085", "\ufeff", "🙂", ": ", "- ", "---", "null",
    "true", "0x1F", "\\n",
]  # fmt: skip
_CONTROLS = ["\n", "\r", "\t", "\x01", "\x1b", "\x7f"]


def _text(*, controls: bool) -> st.SearchStrategy[str]:
    pieces = _PIECES + (_CONTROLS if controls else [])
    free = st.text(max_size=4).map(lambda s: s.replace("\x00", ""))
    if not controls:
        free = free.map(lambda s: "".join(c for c in s if ord(c) >= 0x20 and c != "\x7f"))
    return st.lists(st.one_of(st.sampled_from(pieces), free), max_size=5).map("".join)


ANY = _text(controls=True)  # what a command line and environment can carry (all but NUL)
LINE = _text(controls=False)  # what a one-line field can carry
_LIMITS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def _spec(target: str, args: tuple[str, ...], values: tuple[str, str], *, name: str = "train",
          backend: str = "static", machine_range: bool = False, module: bool = False) -> JobSpec:  # fmt: skip
    flag_value, env_value = values
    carried = (
        (FIELDS_BY_NAME["mixed_precision"], flag_value),  # a flag with a value
        (FIELDS_BY_NAME["cpu"], True),  # a switch
        (FIELDS_BY_NAME["main_training_function"], env_value),  # no flag: a variable
    )
    return JobSpec(
        name=name, num_machines=2 if machine_range else 1, nproc_per_node=2, gpus_per_node=0, cpus_per_node=None,
        main_port=29500, max_restarts=0, rdzv_backend=backend, command=Command(target, args, module=module),
        carried=carried, min_machines=1 if machine_range else None,
    )  # fmt: skip


# --- sbatch's directive parser, transcribed (src/sbatch/opt.c, _get_argument) ---------------------


def _sbatch_argument(line: bytes, *, old: bool = False) -> tuple[bytes, bytes]:
    """One argument of an ``#SBATCH`` line as sbatch reads it (C bytes, C ``isspace``), and the rest.

    ``old``: the parser of SLURM before 17.11, where only ``"`` quotes and ``#`` ends the line even
    inside quotes.
    """
    blank = b" \t\n\v\f\r"
    i, out, escape, quote = 0, bytearray(), False, 0
    while i < len(line) and line[i] in blank:
        i += 1
    while i < len(line) and (quote or line[i] not in blank) and line[i] != ord("\n"):
        char = line[i]
        if escape:
            escape = False
        elif char == ord("\\"):
            escape, i = True, i + 1
            continue
        elif old and char == ord('"'):
            quote, i = (0 if quote else char), i + 1
            continue
        elif old and char == ord("#"):
            break
        elif not old and quote:
            if char == quote:
                quote, i = 0, i + 1
                continue
        elif not old and char in b"\"'":
            quote, i = char, i + 1
            continue
        elif not old and char == ord("#"):
            break
        out.append(char)
        i += 1
    assert not quote, f"unmatched quote in {line!r}"
    return bytes(out), line[i:]


def _directives(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.encode("utf-8").split(b"\n"):
        if line.startswith(b"#SBATCH"):
            for old in (False, True):
                argument, rest = _sbatch_argument(line[len(b"#SBATCH") :], old=old)
                assert rest.strip(b" \t") == b"", (line, rest)
                option, _, value = argument.decode("utf-8").partition("=")
                assert found.setdefault(option, value) == value, (line, old)
    return found


# --- running the script --------------------------------------------------------------------------

_STUBS = {
    "scontrol": '#!/bin/bash\nif [ "$1" = show ]; then echo node-a; fi\n',
    # srun starts the command after its options on each node: here, once, in this shell's place.
    "srun": '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$STUB_OUT/srun.argv"\n'
    'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "accelerando": '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$STUB_OUT/accelerando.argv"\n'
    'env -0 > "$STUB_OUT/accelerando.env"\n',
}


def _run_sbatch(text: str) -> tuple[list[str], dict[str, str], list[str]]:
    """Run the script as SLURM would on one node; returns the launcher's argv and env, and what appeared."""
    with tempfile.TemporaryDirectory(prefix="emit-hostile-") as root:
        bin_dir, out, work = Path(root, "bin"), Path(root, "out"), Path(root, "work")
        for folder in (bin_dir, out, work):
            folder.mkdir()
        for name, body in _STUBS.items():
            stub = bin_dir / name
            stub.write_text(body)
            stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
        script = Path(root, "job.sh")
        script.write_bytes(text.encode("utf-8"))
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "node-a", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "LC_ALL": "C.UTF-8",
        }  # fmt: skip
        done = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        argv = (out / "accelerando.argv").read_bytes().decode("utf-8").split("\0")[:-1]
        pairs = (out / "accelerando.env").read_bytes().decode("utf-8").split("\0")[:-1]
        seen = dict(pair.partition("=")[::2] for pair in pairs)
        appeared = sorted(p.name for p in work.iterdir()) + sorted(
            p.name for p in Path(root).glob(f"**/{CANARY}")
        )
        return argv, seen, appeared


def _expected_argv(spec: JobSpec) -> list[str]:
    flags, _env = setting_flags(spec.carried)
    machines = ["--num_machines", "1:1", "--rdzv_backend", spec.rdzv_backend] if spec.machine_range else [
        "--num_machines", "1"]  # fmt: skip
    command = spec.command
    target = ["-m"] if command.module else []
    return [
        "launch", *machines, "--machine_rank", "0", "--main_process_ip", "node-a", "--main_process_port", "29500",
        "--num_processes", "2", *flags, *target, command.target, *command.args,
    ]  # fmt: skip


@_LIMITS
@given(
    target=ANY, args=st.lists(ANY, max_size=3), flag_value=ANY, env_value=ANY, name=LINE, workdir=LINE,
    backend=ANY, machine_range=st.booleans(), module=st.booleans(),
)  # fmt: skip
def test_every_sbatch_value_arrives_byte_exact_and_nothing_runs(
    target: str, args: list[str], flag_value: str, env_value: str, name: str, workdir: str, backend: str,
    machine_range: bool, module: bool,
) -> None:  # fmt: skip
    spec = _spec(target, tuple(args), (flag_value, env_value), name=name or "train", backend=backend,
                 machine_range=machine_range, module=module)  # fmt: skip
    text = render_sbatch(spec, workdir="/" + workdir)
    directives = _directives(text)
    assert directives["--chdir"] == "/" + workdir and directives["--job-name"] == (name or "train")
    argv, env, appeared = _run_sbatch(text)
    assert argv == _expected_argv(spec)
    assert env["ACCELERANDO_MAIN_TRAINING_FUNCTION"] == env_value
    assert appeared == []  # no canary, nothing else written where the job ran


def test_a_newline_in_the_working_directory_is_refused_not_run() -> None:
    spec = _spec("train.py", (), ("bf16", "main"))
    for folder, char in (("/tmp/x\ntouch CANARY", "a newline"), ("/tmp/x\rz", "a carriage return"),
                         ("/tmp/\x1b[0m", "'\\x1b'")):  # fmt: skip
        with pytest.raises(ValueError) as caught:
            render_sbatch(spec, workdir=folder)
        message = str(caught.value)
        assert "\n" not in message and char in message and "--chdir" in message and "Fix: " in message
    with pytest.raises(ValueError, match="job name .* a newline"):
        render_sbatch(_spec("train.py", (), ("bf16", "main"), name="a\nb"), workdir="/tmp")
    with pytest.raises(ValueError, match="script argument .* NUL byte"):
        render_sbatch(_spec("train.py", ("a\x00b",), ("bf16", "main")), workdir="/tmp")


def test_the_cli_refuses_to_emit_from_a_folder_with_a_newline(tmp_path: Path) -> None:
    folder = tmp_path / "run\ntouch CANARY"
    folder.mkdir()
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    done = subprocess.run([sys.executable, "-m", "accelerando.commands.launch", "--emit", "slurm", "--cpu", "t.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "a newline" in done.stderr and "Fix: " in done.stderr, done.stderr


def test_a_plain_folder_and_name_are_written_unquoted() -> None:
    directives = _directives(render_sbatch(_spec("train.py", (), ("bf16", "main")), workdir="/shared/run-1"))
    assert directives["--chdir"] == "/shared/run-1"
    text = render_sbatch(_spec("train.py", (), ("bf16", "main")), workdir="/shared/my run #2")
    assert '#SBATCH --chdir="/shared/my run \\#2"' in text


# --- Kubernetes ----------------------------------------------------------------------------------


def k8s_expand(text: str, mapping: Callable[[str], str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` (third_party/forked/golang/expansion), transcribed."""
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                read, advance = "$", 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                read, advance = (mapping(rest[1:close]), close + 1) if close > 0 else ("$(", 1)
            else:
                read, advance = "$" + rest[0], 1
            out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _visible(name: str) -> str:
    return f"<{name}>"  # every variable is defined: an unescaped $(X) anywhere would show


def _container(text: str) -> dict:
    manifest = yaml.safe_load(text)
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    return next(iter(replicas.values()))["template"]["spec"]["containers"][0]


@_LIMITS
@given(target=ANY, args=st.lists(ANY, max_size=3), flag_value=ANY, env_value=ANY, image=LINE,
       backend=ANY, elastic=st.booleans())  # fmt: skip
def test_every_pytorchjob_value_reads_back_after_kubernetes_expansion(
    target: str, args: list[str], flag_value: str, env_value: str, image: str, backend: str, elastic: bool
) -> None:
    image = "img/" + "".join(char for char in image if not char.isspace())  # a blank is refused
    spec = _spec(target, tuple(args), (flag_value, env_value), backend=backend if elastic else "static",
                 machine_range=elastic)  # fmt: skip
    container = _container(render_manifest(spec, image))
    assert container["image"] == image
    got = [k8s_expand(arg, _visible) for arg in container["args"]]
    assert got[-1 - len(args) :] == [target, *args]
    if elastic:
        assert got[got.index("--rdzv_backend") + 1] == backend
    else:
        assert got[got.index("--machine_rank") + 1] == "<RANK>"
        assert got[got.index("--main_process_ip") + 1] == "<MASTER_ADDR>"
    env = {item["name"]: k8s_expand(item["value"], _visible) for item in container["env"]}
    assert env == {"ACCELERANDO_MIXED_PRECISION": flag_value, "ACCELERANDO_USE_CPU": "true",
                   "ACCELERANDO_MAIN_TRAINING_FUNCTION": env_value}  # fmt: skip


def test_a_kubernetes_variable_in_an_argument_is_not_expanded() -> None:
    spec = _spec("train.py", ("--host", "$(MASTER_ADDR)", "$(RANK)x"), ("bf16", "$(HOME)"))
    container = _container(render_manifest(spec, "img:1"))
    args = [k8s_expand(arg, _visible) for arg in container["args"]]
    assert args[-3:] == ["--host", "$(MASTER_ADDR)", "$(RANK)x"]
    env = {item["name"]: k8s_expand(item["value"], _visible) for item in container["env"]}
    assert env["ACCELERANDO_MAIN_TRAINING_FUNCTION"] == "$(HOME)"


def test_an_image_or_name_that_is_not_one_line_is_refused() -> None:
    spec = _spec("train.py", (), ("bf16", "main"))
    for image, what in (("img:1\nkind: Pod", "a newline"), ("img\r", "a carriage return"), ("img\x00", "NUL"),
                        ("my image", "a blank")):  # fmt: skip
        with pytest.raises(ValueError) as caught:
            render_manifest(spec, image)
        message = str(caught.value)
        assert "\n" not in message and what in message and "--emit_image" in message and "Fix: " in message
    with pytest.raises(ValueError, match="not a Kubernetes name"):
        render_manifest(_spec("train.py", (), ("bf16", "main"), name="Train_1"), "img:1")
    with pytest.raises(ValueError, match="script argument .* NUL byte"):
        render_manifest(_spec("train.py", ("a\x00",), ("bf16", "main")), "img:1")
