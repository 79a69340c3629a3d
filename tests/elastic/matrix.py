"""The strategy conversion matrix of issue 44 (4): save under one (world, strategy), load under another.

A cell saves after ``SAVE_STEPS`` AdamW steps of a small model on deterministic global batches, then a
fresh process group of another size and strategy builds the model from a *different* seed, calls
``load_state`` and takes ``RESUME_STEPS`` more steps. The cell "continues" when the loaded weights and
optimizer state equal the saved ones exactly and the losses match an uninterrupted one-process run from
the saved state (max relative difference reported); it is "refused" when ``load_state`` raised before
applying anything (its one line is reported, and the live state must still equal the fresh one).

Run as a script to print the matrix as markdown::

    python tests/elastic/matrix.py                 # every cell (slow: about 60 launches)
    python tests/elastic/matrix.py --save ddp:2 --load single:1 fsdp2:2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:  # suite_support lives in tests/
    sys.path.insert(0, os.path.dirname(HERE))

GLOBAL_BATCH, SAVE_STEPS, RESUME_STEPS, LR = 8, 3, 4, 0.01
STRATEGIES = ("single", "ddp", "fsdp2", "fsdp1", "zero1", "zero2", "zero3")
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
TOLERANCE = 1e-6


def cells(worlds: Iterable[int] = (1, 2, 4)) -> list[tuple[str, int]]:
    """Every (strategy, world) that can run: single only on 1 process, DDP and FSDP on 2 or more."""
    out = []
    for world in worlds:
        for strategy in STRATEGIES:
            if (strategy == "single") != (world == 1) and not strategy.startswith("zero"):
                continue
            out.append((strategy, world))
    return out


def _model(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(7919 * step + 3)
    x = torch.randn(GLOBAL_BATCH, 6, generator=g)
    return x, torch.stack([x.sum(1), x[:, 0] * x[:, 1], x[:, 2].sin()], 1)


def _accelerator(strategy: str) -> Any:
    from accelerando import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from suite_support import fresh_accelerator

    if strategy.startswith("zero"):
        plugin = DeepSpeedPlugin(zero_stage=int(strategy[-1]), gradient_clipping=1e9)
        return fresh_accelerator(deepspeed_plugin=plugin)
    if strategy.startswith("fsdp"):
        version = int(strategy[-1])
        kind = "SHARDED_STATE_DICT" if version == 2 else "FULL_STATE_DICT"
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=version, state_dict_type=kind, use_orig_params=True
        )
        return fresh_accelerator(fsdp_plugin=plugin)
    return fresh_accelerator()


def _build(strategy: str, seed: int) -> tuple[Any, Any, Any]:
    import torch

    acc = _accelerator(strategy)
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    per_rank = GLOBAL_BATCH // acc.num_processes
    data = torch.utils.data.TensorDataset(torch.zeros(64, 6), torch.zeros(64, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=per_rank)
    model, opt, _ = acc.prepare(model, opt, loader)
    return acc, model, opt


def _train(acc: Any, model: Any, opt: Any, start: int, steps: int) -> list[float]:
    per_rank = GLOBAL_BATCH // acc.num_processes
    rows = slice(acc.process_index * per_rank, (acc.process_index + 1) * per_rank)
    losses = []
    for step in range(start, start + steps):
        x, y = _batch(step)
        loss = ((model(x[rows]) - y[rows]) ** 2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), reduction="mean")))
    return losses


def full_state(acc: Any, model: Any, opt: Any) -> dict[str, Any]:
    """Weights and AdamW state by parameter name, full (unsharded), on every process."""
    if "DEEPSPEED" in str(acc.distributed_type):
        return _deepspeed_state(model)
    if "FSDP" in str(acc.distributed_type):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        weights = get_model_state_dict(model, options=options)
        optim = get_optimizer_state_dict(model, opt.optimizer, options=options)
        return {"weights": _plain(weights), "optim": _plain(optim["state"])}
    inner = acc.unwrap_model(model)
    names = {id(p): n for n, p in inner.named_parameters()}
    torch_opt = opt.optimizer
    state = {names[id(p)]: dict(torch_opt.state[p]) for g in torch_opt.param_groups for p in g["params"]}
    return {"weights": _plain(inner.state_dict()), "optim": _plain(state)}


def _deepspeed_state(engine: Any) -> dict[str, Any]:
    import torch
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    weights, optim = {}, {}
    base = engine.optimizer.optimizer
    if not base.state:  # DeepSpeed creates the optimizer state at the first step
        return {
            "weights": {
                n: safe_get_full_fp32_param(p).detach().cpu().clone()
                for n, p in engine.module.named_parameters()
            },
            "optim": {},
        }
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if callable(link):  # ZeRO-1/2 map each parameter's optimizer-state pieces lazily (after a step or a load)
        engine.optimizer._hp_optimizer_states_linked = False
        link()
    step = next(iter(base.state.values()))["step"]
    for name, param in engine.module.named_parameters():
        weights[name] = safe_get_full_fp32_param(param).detach().cpu().clone()
        optim[name] = {
            key: safe_get_full_optimizer_state(param, key).detach().cpu().clone()
            for key in ("exp_avg", "exp_avg_sq")
        }
        optim[name]["step"] = torch.as_tensor(step, dtype=torch.float32).clone()
    return {"weights": weights, "optim": optim}


def _plain(tree: Any) -> Any:
    import torch

    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor):
        full = tree.full_tensor() if hasattr(tree, "full_tensor") else tree
        return full.detach().cpu().clone().float() if full.dim() == 0 else full.detach().cpu().clone()
    return tree


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between two ``full_state`` results (inf when their keys differ)."""
    worst = 0.0
    for part in ("weights", "optim"):
        flat_a, flat_b = _flatten(a[part]), _flatten(b[part])
        if set(flat_a) != set(flat_b):
            return float("inf")
        for key, value in flat_a.items():
            other = flat_b[key]
            if value.shape != other.shape:
                return float("inf")
            worst = max(worst, float((value.double() - other.double()).abs().max()) if value.numel() else 0.0)
    return worst


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def save_rank(strategy: str, folder: str) -> dict[str, Any]:
    """Train ``SAVE_STEPS`` steps under ``strategy``, save, and return the saved full state and losses."""
    acc, model, opt = _build(strategy, seed=0)
    losses = _train(acc, model, opt, 0, SAVE_STEPS)
    acc.save_state(folder)
    state = full_state(acc, model, opt)
    _release(acc)
    return {"losses": losses, "state": state}


def load_rank(strategy: str, folders: Sequence[str]) -> list[dict[str, Any]]:
    """Load each folder under ``strategy`` in this process group; per folder: outcome, state, losses."""
    out = []
    for folder in folders:
        acc, model, opt = _build(strategy, seed=123)
        fresh = full_state(acc, model, opt)
        try:
            acc.load_state(folder)
        except Exception as err:  # noqa: BLE001 - a refusal is an outcome of the cell
            line = f"{type(err).__name__}: {err}"
            try:
                untouched = max_difference(fresh, full_state(acc, model, opt))
            except Exception as other:  # noqa: BLE001 - the state cannot even be read back
                line, untouched = f"{line} (then reading the state back failed: {other!r})", float("inf")
            out.append({"refused": line, "untouched": untouched})
            _release(acc)
            continue
        state = full_state(acc, model, opt)
        losses = _train(acc, model, opt, SAVE_STEPS, RESUME_STEPS)
        out.append({"state": state, "losses": losses})
        _release(acc)
    return out


def _release(acc: Any) -> None:
    release = getattr(acc._strategy, "release", None)
    if callable(release):
        release()


def reference_losses(state: dict[str, Any]) -> list[float]:
    """Losses of an uninterrupted one-process plain-PyTorch run continued from ``state``."""
    import copy

    import torch

    state = copy.deepcopy(state)  # the optimizer adopts the tensors it is given and steps them in place
    model = _model(seed=5)
    model.load_state_dict(state["weights"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    names = [n for n, _ in model.named_parameters()]
    opt.load_state_dict(
        {
            "state": {i: dict(state["optim"][n]) for i, n in enumerate(names)},
            "param_groups": [
                {
                    **{k: v for k, v in opt.param_groups[0].items() if k != "params"},
                    "params": list(range(len(names))),
                }
            ],
        }
    )
    losses = []
    for step in range(SAVE_STEPS, SAVE_STEPS + RESUME_STEPS):
        x, y = _batch(step)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _launch(fn: Any, world: int, *args: object) -> list[Any]:
    import importlib

    from suite_support import run_distributed_preloaded

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    named = getattr(importlib.import_module("matrix"), fn.__name__)  # importable by the ranks
    return run_distributed_preloaded(named, world, *args, env=ENV, timeout=900.0)


def run_matrix(
    saves: Sequence[tuple[str, int]], loads: Sequence[tuple[str, int]], root: str
) -> dict[tuple[tuple[str, int], tuple[str, int]], dict[str, Any]]:
    """Every (save cell, load cell) pair's outcome: continues (exact, max rel diff) or refused (line)."""
    saved: dict[tuple[str, int], dict[str, Any]] = {}
    folders: dict[tuple[str, int], str] = {}
    for cell in saves:
        folder = os.path.join(root, f"{cell[0]}_{cell[1]}")
        saved[cell] = _launch(save_rank, cell[1], cell[0], folder)[0]
        saved[cell]["reference"] = reference_losses(saved[cell]["state"])
        folders[cell] = folder
    results = {}
    for target in loads:
        order = list(saves)
        try:
            got = _launch(load_rank, target[1], target[0], [folders[c] for c in order])
        except Exception as err:  # noqa: BLE001 - one crashed launch marks its column, the rest still run
            last = [line for line in str(err).splitlines() if line.strip()][-1]
            for cell in order:
                results[(cell, target)] = {"kind": "error", "line": last}
            continue
        for cell, outcome in zip(order, got[0], strict=True):
            results[(cell, target)] = _judge(saved[cell], outcome)
    return results


def _judge(saved: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    if "refused" in outcome:
        line = outcome["refused"]
        return {
            "kind": "refused",
            "line": line,
            "one_line": "\n" not in line,
            "untouched": outcome["untouched"] == 0,
        }
    exact = max_difference(saved["state"], outcome["state"])
    ref = saved["reference"]
    rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(outcome["losses"], ref, strict=True))
    return {"kind": "continues", "state_diff": exact, "max_rel": rel}


def markdown(results: dict[Any, dict[str, Any]], saves: Sequence[Any], loads: Sequence[Any]) -> str:
    """The matrix as a markdown table: rows saved under, columns loaded under."""
    head = "| saved \\ loaded | " + " | ".join(f"{s} x{w}" for s, w in loads) + " |"
    lines = [head, "|" + "---|" * (len(loads) + 1)]
    for cell in saves:
        row = [f"{cell[0]} x{cell[1]}"]
        for target in loads:
            r = results.get((cell, target))
            if r is None:
                row.append("")
            elif r["kind"] in ("refused", "error"):
                row.append(r["kind"])
            elif r["state_diff"] == 0 and r["max_rel"] <= TOLERANCE:
                row.append(f"ok {r['max_rel']:.1e}")
            else:
                row.append(f"WRONG state {r['state_diff']:.1e} loss {r['max_rel']:.1e}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _parse(values: Sequence[str]) -> list[tuple[str, int]]:
    return [(v.split(":")[0], int(v.split(":")[1])) for v in values]


def main(argv: Sequence[str] | None = None) -> None:
    """Print the matrix (and each refusal's line) as markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", nargs="*", help="strategy:world cells to save (default: every cell)")
    parser.add_argument("--load", nargs="*", help="strategy:world cells to load into (default: every cell)")
    parser.add_argument("--worlds", default="1,2,4")
    args = parser.parse_args(argv)
    every = cells(int(w) for w in args.worlds.split(","))
    saves = _parse(args.save) if args.save else every
    loads = _parse(args.load) if args.load else every
    from suite_support import deepspeed_extensions_folder

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(deepspeed_extensions_folder()))
    paths = [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="elastic_matrix_") as root:
        results = run_matrix(saves, loads, root)
    print(markdown(results, saves, loads))
    for kind in ("refused", "error"):
        for line in sorted({r["line"] for r in results.values() if r["kind"] == kind}):
            print(f"\n- {kind}: {line}")
    print(f"\n{len(results)} cells in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
