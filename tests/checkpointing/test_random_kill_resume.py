"""20 random SIGKILLs of a 2-process CPU training, each followed by a fresh ``--auto_resume`` launch,
all bitwise equal to an uninterrupted run (issue 27, item 7).

Each trial is drawn from ``random.Random(SEED + trial)`` (print the seed of a failing trial to reproduce
it; a kill "at a random moment" is a random delay, so its exact landing point varies between runs):

- saves: synchronous in even trials, asynchronous (background writes) in odd ones, every 3 steps;
- the kill, one of: ``write`` (a rank SIGKILLs itself inside a checkpoint file write, after tearing that
  file in half: the save's k-th file of its n-th save, k and n drawn), ``worker`` (one rank SIGKILLed
  from outside after a random delay) or ``job`` (the launcher's whole process group SIGKILLed at once
  after a random delay, as a lost machine);
- then a fresh ``accelerando launch --auto_resume`` finishes the run.

Every loss logged by either rank in either launch, and the final weights' hash, must equal the
uninterrupted run's: a step re-run after the resume computes bit for bit what it computed before.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # 20 trials of two 2-process launches each
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc are Linux's"),
]

SEED = 2027
TRIALS = 20

# argv: project folder, output folder, "sync" | "async".
# Environment KILL_WRITE="<rank>:<save number>:<file number>": that rank tears that file and SIGKILLs itself.
TRAIN = """\
import hashlib, os, signal, sys, time
import torch
import accelerando.checkpointing.files as F
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration, set_seed

project, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
EPOCHS, EVERY = 2, 3
set_seed(0)
acc = Accelerator(project_config=ProjectConfiguration(
    project_dir=project, automatic_checkpoint_naming=True, total_limit=2, async_save=mode == "async"))
rank = acc.process_index
kill = os.environ.get("KILL_WRITE")
if kill:
    who, save_at, file_at = (int(v) for v in kill.split(":"))
    if who == rank:
        original, folders = F.torch_save, {}  # staging folder -> [save number, files written in it]

        def tearing_save(obj, path):
            original(obj, path)
            seen = folders.setdefault(os.path.dirname(path), [len(folders) + 1, 0])
            seen[1] += 1
            if seen == [save_at, file_at]:  # the file_at-th file of this rank's save_at-th save
                size = os.path.getsize(path)
                with open(path, "r+b") as handle:
                    handle.truncate(size // 2)  # a torn file, then the process dies mid-save
                os.kill(os.getpid(), signal.SIGKILL)

        F.torch_save = tearing_save
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 16, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
dl = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
point = acc.resume_point
start_epoch = point.epoch if point else 0
step = start_epoch * len(dl) + (point.dataloaders[0][1] if point else 0)
with open(os.path.join(out, f"start_{rank}"), "a") as f:
    f.write(f"{os.getpid()} {step} {time.time()!r}\\n")
losses = open(os.path.join(out, f"losses_{rank}"), "a")
for epoch in range(start_epoch, EPOCHS):
    for xb, yb in dl:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        losses.write(f"{step} {loss.item().hex()};\\n")
        losses.flush()
        if step % EVERY == 0:
            acc.save_state()
acc.wait_for_everyone()
if acc.is_main_process:
    weights = acc.unwrap_model(model).state_dict()
    digest = hashlib.sha256(b"".join(weights[k].detach().cpu().numpy().tobytes() for k in sorted(weights)))
    with open(os.path.join(out, "final"), "w") as f:
        f.write(f"{step} {digest.hexdigest()} {time.time()!r}\\n")
"""


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "KILL_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    return env


def _argv(script, project, out, mode: str) -> list[str]:
    exe = shutil.which("accelerando")
    cli = [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]
    return [
        *cli,
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "--auto_resume",
        str(script),
        str(project),
        str(out),
        mode,
    ]


def _losses(out) -> list[tuple[int, str]]:
    """Every complete ``step loss`` line of both ranks (a line torn by the kill has no ``;``)."""
    pairs = []
    for rank in (0, 1):
        path = out / f"losses_{rank}"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.endswith(";"):
                    step, value = line[:-1].split()
                    pairs.append((rank, int(step), value))
    return pairs


def _pids(out) -> list[int]:
    pids = []
    for rank in (0, 1):
        path = out / f"start_{rank}"
        lines = path.read_text().splitlines() if path.exists() else []
        if lines and len(lines[-1].split()) == 3:
            pids.append(int(lines[-1].split()[0]))
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(tmp_path, name: str, mode: str, kill: str | None = None, delay: float = 0.0, rank: int = 0):
    """One launch: uninterrupted, or killed (``write``/``worker``/``job``). Returns (returncode, out)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    project, out = tmp_path / name / "project", tmp_path / name / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = _env(tmp_path)
    if kill is not None and kill.startswith("write:"):
        env["KILL_WRITE"] = kill.split(":", 1)[1]
    before = len((out / "start_0").read_text().splitlines()) if (out / "start_0").exists() else 0
    proc = subprocess.Popen(_argv(script, project, out, mode), env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    if kill in ("worker", "job"):
        deadline = time.monotonic() + 180
        while len(_pids(out)) < 2 or len((out / "start_0").read_text().splitlines()) <= before:
            assert proc.poll() is None and time.monotonic() < deadline, "the training never started"
            time.sleep(0.05)
        time.sleep(delay)
        target = _pids(out)[rank]
        try:
            if kill == "job":  # the launcher, its agent and both workers at once
                os.killpg(proc.pid, signal.SIGKILL)
                for pid in _pids(out):
                    _kill(pid)
            else:
                os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it finished first: the resume then has nothing left to do
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"launch {name} ({kill}) hung:\n{output[-3000:]}") from None
    for pid in _pids(out):  # nothing of this launch may still write when the next one starts
        deadline = time.monotonic() + 60
        while _alive(pid):
            assert time.monotonic() < deadline, f"process {pid} outlived its launch"
            time.sleep(0.05)
    return proc.returncode, out, output


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    code, out, output = _run(tmp_path, "plain", "sync")
    assert code == 0, output[-3000:]
    final = (out / "final").read_text().split()
    start = float((out / "start_0").read_text().split()[2])
    losses = {(rank, step): value for rank, step, value in _losses(out)}
    assert final[0] == "32" and len(losses) == 64
    return {"hash": final[1], "losses": losses, "seconds": float(final[2]) - start}


def test_20_random_sigkills_then_auto_resume_all_end_bitwise_equal(tmp_path, uninterrupted) -> None:
    began = time.monotonic()
    kinds: dict[str, int] = {}
    for trial in range(TRIALS):
        rng = random.Random(SEED + trial)
        mode = "async" if trial % 2 else "sync"
        kind = rng.choice(["write", "worker", "job"])
        rank = rng.randrange(2)
        if kind == "write":
            # 10 saves; torch.save files per save: 3 or more on rank 0 (optimizer, scheduler, random
            # states...; the model is safetensors), 1 on rank 1 (its random states)
            kill = f"write:{rank}:{rng.randint(1, 10)}:{rng.randint(1, 3 if rank == 0 else 1)}"
        else:
            kill = kind
        delay = rng.uniform(0.0, 0.9 * uninterrupted["seconds"])
        label = f"trial {trial} (seed {SEED + trial}: {mode} saves, kill {kill}, rank {rank}, delay {delay:.2f} s)"
        name = f"t{trial}"
        code, out, output = _run(tmp_path, name, mode, kill, delay, rank)
        killed = code != 0
        assert killed or kind != "write", f"{label}: the tearing write never ran\n{output[-3000:]}"
        code, out, output = _run(tmp_path, name, mode)
        assert code == 0, f"{label}: the resumed launch failed\n{output[-3000:]}"
        final = (out / "final").read_text().splitlines()[-1].split()
        assert final[0] == "32", f"{label}: ended at step {final[0]}"
        assert final[1] == uninterrupted["hash"], f"{label}: final weights differ"
        for rank_, step, value in _losses(out):
            assert value == uninterrupted["losses"][(rank_, step)], (
                f"{label}: rank {rank_} step {step} loss differs"
            )
        kinds[kind] = kinds.get(kind, 0) + killed
        shutil.rmtree(tmp_path / name / "project", ignore_errors=True)
    print(f"\n{TRIALS} trials, kills landed: {kinds}; {time.monotonic() - began:.0f} s")
