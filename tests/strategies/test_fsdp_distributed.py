"""FSDP in two real gloo processes: training equals DDP, sharded/full checkpoints resume exactly,
merged shards equal the full state dict, RAM-efficient loading, and the clear errors.

Each launch costs seconds (and transformers' import), so each one runs many checks and returns
numbers the parent compares. The full matrix over 10 steps is marked slow.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state, run_distributed_preloaded

pytest.importorskip("transformers")

LAYER = "LlamaDecoderLayer"


def _llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _fresh(**kwargs):
    from accelerando import Accelerator

    reset_accelerator_state(partial=False)
    return Accelerator(**kwargs)


def _plugin(**kwargs):
    from accelerando import FullyShardedDataParallelPlugin

    kwargs.setdefault("transformer_cls_names_to_wrap", [LAYER])
    return FullyShardedDataParallelPlugin(**kwargs)


def _batches(n: int, world: int = 2) -> torch.Tensor:
    return torch.randint(0, 64, (n * world, 2, 8), generator=torch.Generator().manual_seed(1))


def _train(acc, model, opt, data: torch.Tensor, first: int, count: int, clip: bool = True) -> list[float]:
    """Micro-batches ``first .. first+count`` (each rank its own), clipping on sync steps."""
    rank, world = acc.process_index, acc.num_processes
    losses = []
    for i in range(first, first + count):
        ids = data[i * world + rank]
        with acc.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            if acc.sync_gradients and clip:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def _run(fsdp: dict | None, steps: int, accum: int = 1, mp: str = "no") -> list[float]:
    """Losses of one run; the optimizer is built BEFORE prepare (FSDP2 must re-point it).

    bf16 runs do not clip: the sharded norm sums in another order than DDP's (last-bit fp32
    differences), and bf16 rounding of the weights turns those into 1e-4 loss differences.
    """
    acc = _fresh(
        fsdp_plugin=_plugin(**fsdp) if fsdp is not None else None,
        mixed_precision=mp,
        gradient_accumulation_steps=accum,
    )
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return _train(acc, model, opt, _batches(steps * accum), 0, steps * accum, clip=mp == "no")


def _errors() -> dict[str, str]:
    """Messages of the errors users must understand."""
    out = {}
    acc = _fresh(fsdp_plugin=_plugin())
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    try:
        acc.prepare(opt)  # the model was never prepared
    except ValueError as err:
        out["optimizer"] = str(err)
    acc = _fresh(fsdp_plugin=_plugin(transformer_cls_names_to_wrap=["GPT2Block"]))
    try:
        acc.prepare(_llama())
    except ValueError as err:
        out["layer"] = str(err)
    return out


def _bf16_policy(steps: int) -> dict:
    """FSDP2 with a bf16 parameter policy: parameters computed in bf16, shards stay fp32."""
    acc = _fresh(fsdp_plugin=_plugin(mixed_precision_policy="bf16"), mixed_precision="bf16")
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    seen = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_pre_hook(
        lambda m, args: seen.append(m.weight.dtype)
    )
    losses = _train(acc, model, opt, _batches(steps), 0, steps, clip=False)
    handle.remove()
    shard_dtype = next(model.parameters()).dtype
    return {"losses": losses, "compute": str(seen[0]), "shard": str(shard_dtype)}


def _training_checks(steps: int, full_matrix: bool) -> dict:
    res: dict = {"ddp": _run(None, steps), "fsdp2": _run({}, steps)}
    res["ddp_accum"] = _run(None, steps, accum=2)
    res["fsdp2_accum"] = _run({}, steps, accum=2)
    res["fsdp2_ac"] = _run({"activation_checkpointing": True}, steps)
    res["fsdp1"] = _run({"fsdp_version": 1}, steps)
    res["ddp_bf16"] = _run(None, steps, mp="bf16")
    res["fsdp2_bf16"] = _run({}, steps, mp="bf16")
    res["policy"] = _bf16_policy(steps)
    if full_matrix:
        res["fsdp1_accum"] = _run({"fsdp_version": 1}, steps, accum=2)
        res["fsdp1_ac"] = _run({"fsdp_version": 1, "activation_checkpointing": True}, steps)
        res["fsdp1_bf16"] = _run({"fsdp_version": 1}, steps, mp="bf16")
        res["fsdp2_ac_bf16_accum"] = _run({"activation_checkpointing": True}, steps, accum=2, mp="bf16")
        res["ddp_bf16_accum"] = _run(None, steps, accum=2, mp="bf16")
        res["fsdp2_shard_grad_op"] = _run({"sharding_strategy": "SHARD_GRAD_OP"}, steps)
        res["fsdp2_no_shard"] = _run({"sharding_strategy": "NO_SHARD"}, steps)
        res["fsdp2_size_wrap"] = _run({"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000}, steps)
    res["errors"] = _errors()
    res["auto"] = _auto_choice()
    res["helpers"] = _public_helpers()
    return res


def _public_helpers() -> bool:
    """fsdp2_prepare_model shards; fsdp2_load_full_state_dict spreads rank 0's weights to the shards."""
    from accelerando.utils import fsdp2_load_full_state_dict, fsdp2_prepare_model

    acc = _fresh(fsdp_plugin=_plugin())
    model = fsdp2_prepare_model(acc, _llama(seed=acc.process_index))  # ranks start different
    wanted = _llama(seed=7).state_dict()
    fsdp2_load_full_state_dict(acc, model, wanted if acc.is_main_process else {})
    full = acc.get_state_dict(model)
    return not acc.is_main_process or all(torch.equal(full[k], v) for k, v in wanted.items())


def _auto_choice() -> tuple:
    """sharding_strategy="AUTO" on a tiny model and ample memory: no sharding (a replicate mesh)."""
    acc = _fresh(fsdp_plugin=_plugin(sharding_strategy="AUTO"))
    model = acc.prepare(_llama())
    choice = acc._strategy.last_choice
    return choice.strategy, choice.reason, str(next(model.parameters()).placements), acc.is_fsdp2


def _assert_training(results: list[dict], full_matrix: bool) -> None:
    for rank, res in enumerate(results):
        pairs = [("fsdp2", "ddp"), ("fsdp2_accum", "ddp_accum"), ("fsdp2_ac", "ddp"), ("fsdp1", "ddp")]
        pairs.append(("fsdp2_bf16", "ddp_bf16"))
        if full_matrix:
            pairs += [("fsdp1_accum", "ddp_accum"), ("fsdp1_ac", "ddp"), ("fsdp1_bf16", "ddp_bf16")]
            pairs += [("fsdp2_ac_bf16_accum", "ddp_bf16_accum"), ("fsdp2_shard_grad_op", "ddp")]
            pairs += [("fsdp2_no_shard", "ddp"), ("fsdp2_size_wrap", "ddp")]
        for got, want in pairs:
            assert res[got] == pytest.approx(res[want], abs=1e-5), f"rank {rank}: {got} vs {want}"
        assert len(set(res["ddp"])) == len(res["ddp"])  # weights move (batches are random tokens)
        policy = res["policy"]
        assert (policy["compute"], policy["shard"]) == ("torch.bfloat16", "torch.float32")
        # bf16 parameters change the numerics: close to DDP's bf16 run, not equal.
        assert policy["losses"] == pytest.approx(res["ddp_bf16"], abs=5e-2)
        strategy, reason, placements, is_fsdp2 = res["auto"]
        assert (strategy, placements, is_fsdp2) == ("NO_SHARD", "(Replicate(), Shard(dim=0))", True)
        assert reason.startswith("NO_SHARD: needs") and reason.endswith("chosen")
        assert res["helpers"] is True
        errors = res["errors"]
        assert "no model prepared with FSDP" in errors["optimizer"] and "together with" in errors["optimizer"]
        assert "GPT2Block" in errors["layer"] and LAYER in errors["layer"]


def _training_worker(steps: int, full_matrix: bool) -> dict:
    return _training_checks(steps, full_matrix)


def test_fsdp_training_matches_ddp_and_errors(first_launch):
    _assert_training([rank["training"] for rank in first_launch["ranks"]], full_matrix=False)


@pytest.mark.slow
def test_fsdp_training_matches_ddp_full_matrix_10_steps():
    _assert_training(run_distributed(_training_worker, 2, 10, True, timeout=1200), full_matrix=True)


# -------------------------------------------------------------------------------- checkpoints
def _save(acc, model, opt, folder: str) -> None:
    acc.save_state(folder)


def _load(acc, model, opt, folder: str) -> None:
    acc.load_state(folder)


def _checkpoint_phase(root: str, phase: int, kind: str, version: int) -> dict:
    """Phase 0 trains 2 + 2 steps saving after 2; phase 1 (fresh processes) loads and trains 2."""
    folder = os.path.join(root, f"{kind}_{version}")
    acc = _fresh(fsdp_plugin=_plugin(state_dict_type=kind, fsdp_version=version))
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    data = _batches(4)
    out: dict = {}
    if phase == 0:
        _train(acc, model, opt, data, 0, 2)
        _save(acc, model, opt, folder)
        full = acc.get_state_dict(model)
        out["tail"] = _train(acc, model, opt, data, 2, 2)
        if acc.is_main_process and kind == "SHARDED_STATE_DICT":
            from accelerando.backends.strategies.fsdp.helpers import load_sharded_checkpoint

            merged = load_sharded_checkpoint(os.path.join(_checkpoint_dir(folder), "pytorch_model_fsdp_0"))
            out["merge_equal"] = set(merged) == set(full) and all(
                torch.equal(merged[k], full[k]) for k in full
            )
        if kind == "FULL_STATE_DICT":
            out.update(_save_model_check(acc, model, root))
        if kind == "SHARDED_STATE_DICT":
            out["mid_cycle_warnings"] = _save_mid_cycle(acc, os.path.join(root, f"mid_{kind}_{version}"))
    else:
        _load(acc, model, opt, _checkpoint_dir(folder))
        out["tail"] = _train(acc, model, opt, data, 2, 2)
    return out


def _save_mid_cycle(acc, folder: str) -> list[str]:
    """Save as if inside an accumulation cycle: FSDP keeps the pending gradients, so a warning must say
    the checkpoint cannot resume bit-exactly."""
    import warnings

    acc.gradient_state._set_sync_gradients(False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            acc.save_state(folder)
    finally:
        acc.gradient_state._set_sync_gradients(True)
    return [str(w.message) for w in caught if "accumulation cycle" in str(w.message)]


def _checkpoint_dir(folder: str) -> str:
    return folder


def _save_model_check(acc, model, root: str) -> dict:
    """``save_model`` writes a file a plain model loads and then computes the same outputs."""
    target = os.path.join(root, f"saved_{acc.distributed_type}")
    acc.save_model(model, target)
    ids = torch.arange(16).reshape(2, 8) % 64
    with torch.no_grad():
        sharded_logits = model(input_ids=ids).logits
    if not acc.is_main_process:
        return {}
    from safetensors.torch import load_file

    plain = _llama(seed=123)
    missing, unexpected = plain.load_state_dict(
        load_file(os.path.join(target, "model.safetensors")), strict=False
    )
    with torch.no_grad():
        plain_logits = plain(input_ids=ids).logits
    return {
        "save_model_equal": torch.equal(plain_logits, sharded_logits),
        "save_model_keys": (list(missing), list(unexpected)),
    }


def _checkpoint_worker(root: str, phase: int, variants: tuple) -> dict:
    # RAM-efficient loading first, while this process's memory is not yet used by other models.
    out: dict = {"ram": _ram_efficient_worker()} if phase == 0 else {}
    for kind, version in variants:
        out[f"{kind}_{version}"] = _checkpoint_phase(root, phase, kind, version)
    return out


def _rss_sampler(stop: threading.Event, peak: list[int]) -> None:
    import psutil

    proc = psutil.Process()
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        stop.wait(0.001)


def _ram_efficient_worker() -> dict:
    """Rank 1 builds its model on ``meta``; after prepare every rank holds rank 0's weights."""
    import psutil

    rank = int(os.environ["RANK"])
    acc = _fresh(
        fsdp_plugin=_plugin(
            cpu_ram_efficient_loading=True, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1
        )
    )
    width, depth = 1024, 16
    torch.manual_seed(0)
    device = torch.device("cpu" if rank == 0 else "meta")
    with device:
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    reference = (
        torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]) if rank == 0 else None
    )
    if reference is not None:
        reference.load_state_dict(model.state_dict())
    full_bytes = sum(p.numel() * 4 for p in (reference or model).parameters())
    # Warm-up on a tiny model first: library imports and mesh set-up are not the model's memory.
    acc.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
    baseline = psutil.Process().memory_info().rss
    stop, peak = threading.Event(), [baseline]
    sampler = threading.Thread(target=_rss_sampler, args=(stop, peak))
    sampler.start()
    model = acc.prepare(model)
    stop.set()
    sampler.join()
    state = acc.get_state_dict(model)
    equal = None
    if reference is not None:
        equal = all(torch.equal(state[k], v) for k, v in reference.state_dict().items())
    return {"growth": peak[0] - baseline, "full_bytes": full_bytes, "equal": equal}


def _check_resume(root: str, variants: tuple, first: list[dict] | None = None) -> list[dict]:
    """Phase 1 in fresh processes resumes each variant's checkpoint; ``first``: phase 0's results when
    they were already taken (by the shared first launch)."""
    if first is None:
        first = run_distributed(_checkpoint_worker, 2, root, 0, variants)
    # Phase 1 checks the resume, not memory: its fresh processes fork from the preloaded fork server.
    second = run_distributed_preloaded(_checkpoint_worker, 2, root, 1, variants)
    for rank in range(2):
        for key, phase0 in first[rank].items():
            if key != "ram":  # resumed training continues exactly where the uninterrupted run went
                assert second[rank][key]["tail"] == pytest.approx(phase0["tail"], abs=1e-6), (rank, key)
    return first


_FSDP2_VARIANTS = (("SHARDED_STATE_DICT", 2), ("FULL_STATE_DICT", 2))


def _first_launch_worker(root: str, variants: tuple, steps: int) -> dict:
    """Checkpoint phase 0 (RAM-efficient loading first, on a fresh process) then the training checks:
    one launch for both tests below (each launch costs its processes' torch and transformers imports)."""
    checkpoint = _checkpoint_worker(root, 0, variants)
    return {"checkpoint": checkpoint, "training": _training_checks(steps, full_matrix=False)}


@pytest.fixture(scope="module")
def first_launch(tmp_path_factory) -> dict:
    """The module's first 2-process launch: checkpoint phase 0 and the training checks, per rank."""
    root = str(tmp_path_factory.mktemp("fsdp_checkpoints"))
    # glibc keeps freed blocks above its (self-raising) mmap threshold in the heap, so resident memory
    # drifts with the allocation history; a fixed low threshold returns every large tensor's pages on
    # free, and resident growth then follows the live tensors (0.56-0.57 of the model here, 0.62-0.82
    # without it). The variable is read at process start, so the spawned ranks inherit it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
        ranks = run_distributed(_first_launch_worker, 2, root, _FSDP2_VARIANTS, 3)
    return {"root": root, "ranks": ranks}


def test_fsdp_checkpoints_resume_exactly_merge_and_ram_efficient_loading(first_launch, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # as phase 0 ran
    phase0 = [rank["checkpoint"] for rank in first_launch["ranks"]]
    first = _check_resume(first_launch["root"], _FSDP2_VARIANTS, first=phase0)
    main = first[0]
    assert main["SHARDED_STATE_DICT_2"]["merge_equal"]
    assert len(main["SHARDED_STATE_DICT_2"]["mid_cycle_warnings"]) == 1, main
    assert "fsdp" in main["SHARDED_STATE_DICT_2"]["mid_cycle_warnings"][0]
    assert first[1]["SHARDED_STATE_DICT_2"]["mid_cycle_warnings"] == []  # said once, by the main process
    assert main["FULL_STATE_DICT_2"]["save_model_equal"]
    assert main["FULL_STATE_DICT_2"]["save_model_keys"] == ([], [])
    # cpu_ram_efficient_loading: rank 1 built its model on meta; it ends with rank 0's weights and
    # never held the whole model: its shard (half) plus one tensor in flight.
    assert main["ram"]["equal"] is True
    ram = first[1]["ram"]
    assert ram["growth"] < 0.8 * ram["full_bytes"], first


@pytest.mark.slow
def test_fsdp1_sharded_checkpoint_resumes_and_merges(tmp_path):
    first = _check_resume(str(tmp_path), (("SHARDED_STATE_DICT", 1), ("FULL_STATE_DICT", 1)))
    assert first[0]["SHARDED_STATE_DICT_1"]["merge_equal"]


_LAUNCHED = """
import torch
from accelerando import Accelerator
acc = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
acc.backward(model(torch.randn(3, 4)).sum())
opt.step()
p = acc.state.fsdp_plugin
acc.print("RESULT", acc.distributed_type, p.fsdp_version, p.resolved_sharding(), p.state_dict_type)
"""

_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 10
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_state_dict_type: SHARDED_STATE_DICT
machine_rank: 0
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""


@pytest.mark.slow
def test_fsdp_from_config_file_launcher_and_plain_torchrun(tmp_path):
    import sys

    from accelerando.test_utils import execute_subprocess, launch_script

    script, config = tmp_path / "script.py", tmp_path / "config.yaml"
    script.write_text(_LAUNCHED)
    config.write_text(_CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "accelerando.commands.cli",
        "launch",
        "--config_file",
        str(config),
        str(script),
    ]
    out = execute_subprocess(cmd, env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path))
    assert "RESULT FSDP 2 SHARD_GRAD_OP SHARDED_STATE_DICT" in out.stdout
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "1"}
    out = launch_script(str(script), 2, env=env)
    assert "RESULT FSDP 1 FULL_SHARD FULL_STATE_DICT" in out.stdout
