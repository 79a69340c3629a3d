"""Tied weights under tensor parallelism: the tie survives the split, trains like one process, saves once.

The 2-process launch trains a tiny Llama with ``tie_word_embeddings=True`` (``lm_head.weight`` IS
``model.embed_tokens.weight``) at ``tp_size=2`` beside the same model trained plainly (the
single-process run), and in the same launch prepares small tied modules whose plans split the
shared weight in different ways (refused) or alike (re-tied). The unit tests need no processes.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from parallel_support import VOCAB, tiny_llama
from parallel_support import fresh_accelerator as _fresh
from parallel_support import sgd_optimizer as _optimizer

from accelerando.test_utils import run_distributed
from suite_support import run_distributed_preloaded

STEPS = 6  # optimizer steps
ACCUM = 2  # micro-batches per optimizer step
RESUME_AT = 3  # optimizer steps before save_state
TIED = ("model.embed_tokens.weight", "lm_head.weight")


class _TiedToy(torch.nn.Module):
    """An embedding and an output head sharing one weight, with a plan given as ``tp_plan``."""

    def __init__(self, plan: dict[str, str]) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.tp_plan = plan

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


# ----------------------------------------------------------------------------- unit tests
def test_find_ties_lists_each_shared_parameter_once_in_module_order() -> None:
    from accelerando.backends.strategies.ties import find_ties

    toy = _TiedToy({})
    assert find_ties(toy) == [["embed.weight", "head.weight"]]
    assert find_ties(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == []


def test_fsdp_units_holding_part_of_a_tie_are_left_to_the_enclosing_unit() -> None:
    from accelerando.backends.strategies.ties import units_keeping_ties

    inner = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(torch.nn.Embedding(4, 4), torch.nn.Sequential(inner), torch.nn.Linear(4, 4))
    model[2].weight = model[0].weight
    kept, dropped = units_keeping_ties(model, [model[0], model[1], model[2]])
    assert kept == [model[1]] and dropped == [model[0], model[2]]
    untied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert units_keeping_ties(untied, list(untied)) == (list(untied), [])


def test_check_ties_refuses_a_split_and_a_whole_half_naming_both_and_the_fix() -> None:
    from accelerando.backends.strategies.ties import check_ties

    toy = _TiedToy({})
    assert check_ties(toy, [["embed.weight", "head.weight"]]) == []  # still one object: nothing to do
    toy.head.weight = torch.nn.Parameter(toy.embed.weight.detach().clone())  # what a split leaves
    with pytest.raises(ValueError, match="embed.weight: a whole") as info:
        check_ties(toy, [["embed.weight", "head.weight"]], {"head": "colwise"})
    assert "head.weight" in str(info.value) and "'colwise'" in str(info.value)
    assert "tie_word_embeddings=False" in str(info.value)


def test_tied_state_dict_entries_are_shared_and_filled() -> None:
    from accelerando.backends.strategies.ties import fill_tied_entries, share_tied_entries

    ties = [["a", "b", "c"]]
    gathered = {"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2), "d": torch.zeros(1)}
    shared = share_tied_entries(gathered, ties)
    assert shared["b"] is shared["a"] and shared["c"] is shared["a"] and shared["d"] is gathered["d"]
    assert share_tied_entries({}, ties) == {}  # other ranks get nothing
    stored = {"a": torch.ones(2), "d": torch.zeros(1)}
    filled = fill_tied_entries(stored, ties)
    assert filled["b"] is stored["a"] and filled["c"] is stored["a"] and set(stored) == {"a", "d"}
    assert fill_tied_entries({"d": stored["d"]}, ties) == {"d": stored["d"]}


class _Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bool] = []

    def set_requires_gradient_sync(self, value: bool) -> None:
        self.calls.append(value)


def test_shared_fsdp2_sync_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerando.backends.strategies.fsdp.sync as sync_module
    from accelerando.backends.strategies.composable.strategy import ComposableStrategy
    from accelerando.backends.strategies.fsdp.strategy import FSDPStrategy

    # one implementation serves both strategies
    for cls in (FSDPStrategy, ComposableStrategy):
        assert "set_requires_gradient_sync" not in cls.no_sync.__code__.co_names
    monkeypatch.setattr(sync_module, "is_fsdp2", lambda m: isinstance(m, _Recorder))
    sync = sync_module.FSDP2GradientSync()
    model = _Recorder()
    with sync.no_sync(model):
        with sync.trigger_sync_in_backward(model):
            pass
    assert model.calls == [False, True, False, True]
    model.calls.clear()
    with sync.trigger_sync_in_backward(model):  # outside no_sync: stays on afterwards
        pass
    assert model.calls == [True]
    with contextlib.suppress(RuntimeError), sync.no_sync(model):
        raise RuntimeError("boom")
    assert model.calls[-1] is True and not sync._unsynced
    plain = torch.nn.Linear(2, 2)  # not FSDP2: untouched
    with sync.no_sync(plain), sync.trigger_sync_in_backward(plain):
        pass


# ----------------------------------------------------------------------------- 2 processes
def _llama(seed: int = 0) -> torch.nn.Module:
    return tiny_llama(seed, tied=True)


def _reference(data: torch.Tensor, batch: int) -> tuple[list[float], dict]:
    model = _llama()
    opt = _optimizer(model)
    losses = []
    for step in range(STEPS * ACCUM):
        ids = data[step * batch : (step + 1) * batch]
        loss = model(input_ids=ids, labels=ids).loss
        (loss / ACCUM).backward()
        losses.append(loss.item())
        if (step + 1) % ACCUM == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(acc, model, opt, loader, steps: int) -> list[float]:
    """Mean losses over the data-parallel ranks (equal to the whole batch's: equal token counts)."""
    losses = []
    batches = iter(loader)
    for _ in range(steps * ACCUM):
        ids = next(batches)
        with acc.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    return losses


def _tie_facts(model, opt) -> dict:
    from torch.distributed.tensor import DTensor, Shard

    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    held = [p for g in opt.param_groups for p in g["params"]]
    return {
        "same_object": head is embed,
        "dtensor": isinstance(embed, DTensor),
        "vocab_split": isinstance(embed, DTensor)
        and embed.placements[embed.device_mesh.mesh_dim_names.index("tp")] == Shard(0),
        "held_once": sum(p is embed for p in held) == 1 and len({id(p) for p in held}) == len(held),
        "held_all": {id(p) for p in held} == {id(p) for p in model.parameters()},
    }


def _toy_outcome(acc, plan: dict[str, str]) -> str:
    toy = _TiedToy(plan)
    try:
        toy = acc.prepare(toy)
    except ValueError as error:
        return f"ValueError: {error}"
    return "tied" if toy.head.weight is toy.embed.weight else "untied"


def _tied_worker(root: str, sizes: dict, phase: int) -> dict:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from accelerando import ParallelismConfig

    acc = _fresh(parallelism_config=ParallelismConfig(**sizes), gradient_accumulation_steps=ACCUM)
    per_rank = 2
    batch = per_rank * sizes.get("dp_shard_size", 1)  # the single-process run's batch
    data = torch.randint(0, VOCAB, (STEPS * ACCUM * batch, 8), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(data, batch_size=per_rank, shuffle=False)
    model = _llama(seed=dist.get_rank())  # different per rank: prepare takes rank 0's weights
    opt = _optimizer(model)
    model, opt, loader = acc.prepare(model, opt, loader)
    out: dict = {"applied": list(acc._strategy.applied), "after_prepare": _tie_facts(model, opt)}
    ckpt = os.path.join(root, "ckpt")
    if phase == 1:
        acc.load_state(ckpt)
        out["tail"] = _train(
            acc, model, opt, acc.skip_first_batches(loader, RESUME_AT * ACCUM), STEPS - RESUME_AT
        )
        out["after_resume"] = _tie_facts(model, opt)
        return out
    ref_losses, ref_state = _reference(data, batch)
    losses = _train(acc, model, opt, loader, RESUME_AT)
    acc.save_state(ckpt)
    out["tail"] = _train(
        acc, model, opt, acc.skip_first_batches(loader, RESUME_AT * ACCUM), STEPS - RESUME_AT
    )
    out["loss_diff"] = max(abs(a - b) for a, b in zip(losses + out["tail"], ref_losses, strict=True))
    out["after_training"] = _tie_facts(model, opt)
    full = acc.get_state_dict(model)
    saved = os.path.join(root, "saved")
    acc.save_model(model, saved)
    probe = data[:3]
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    if acc.is_main_process:
        from safetensors.torch import load_file

        out["weight_diff"] = max(float((full[k] - ref_state[k]).abs().max()) for k in ref_state)
        out["full_keys_equal"] = set(full) == set(ref_state)
        out["full_shared"] = full[TIED[1]] is full[TIED[0]]
        weights = load_file(os.path.join(saved, "model.safetensors"))
        out["saved_keys"] = sorted(k for k in weights if k in TIED)
        plain = _llama(seed=5)
        out["load"] = plain.load_state_dict(weights, strict=False)
        out["plain_tied"] = plain.lm_head.weight is plain.model.embed_tokens.weight
        with torch.no_grad():
            out["output_diff"] = float((plain(input_ids=probe).logits - logits).abs().max())
            out["ref_output_diff"] = float(
                (plain(input_ids=probe).logits - _ref_logits(ref_state, probe)).abs().max()
            )
    # a weights file holding the tied tensor once loads back into the split model (strict)
    weights = _load_weights(os.path.join(saved, "model.safetensors"))
    acc._strategy.load_model_state_dict(model, weights)
    with torch.no_grad():
        out["reload_diff"] = float((model(input_ids=probe).logits - logits).abs().max())
    out["reload_tied"] = model.lm_head.weight is model.model.embed_tokens.weight
    # plans that split the shared weight differently are refused; alike ones are re-tied
    out["toy_rowwise_head"] = _toy_outcome(acc, {"embed": "embedding_rowwise", "head": "rowwise"})
    out["toy_head_only"] = _toy_outcome(acc, {"head": "colwise_rep"})
    out["toy_alike"] = _toy_outcome(acc, {"embed": "embedding_rowwise", "head": "colwise_rep"})
    return out


def _load_weights(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def _ref_logits(state: dict, probe: torch.Tensor) -> torch.Tensor:
    model = _llama()
    model.load_state_dict(state)
    return model(input_ids=probe).logits


def _check(first: list[dict], second: list[dict]) -> None:
    main = first[0]
    expected = {
        "same_object": True,
        "dtensor": True,
        "vocab_split": True,
        "held_once": True,
        "held_all": True,
    }
    for rank in range(len(first)):
        assert first[rank]["after_prepare"] == expected, (rank, first[rank]["after_prepare"])
        assert first[rank]["after_training"] == expected, rank
        assert second[rank]["after_resume"] == expected, rank
        assert second[rank]["tail"] == pytest.approx(first[rank]["tail"], abs=1e-6), rank
    assert "re-tied model.embed_tokens.weight = lm_head.weight" in main["applied"][0], main["applied"]
    assert main["loss_diff"] < 1e-5 and main["weight_diff"] < 1e-5, (main["loss_diff"], main["weight_diff"])
    assert main["full_keys_equal"] and main["full_shared"]
    # saved once (the first name), and a plain tied model loads it and computes the same outputs
    assert main["saved_keys"] == ["model.embed_tokens.weight"]
    assert main["load"].missing_keys == ["lm_head.weight"] and main["load"].unexpected_keys == []
    assert main["plain_tied"] and main["output_diff"] < 1e-5 and main["ref_output_diff"] < 1e-5, main
    refused = main["toy_rowwise_head"]
    assert refused.startswith("ValueError") and "embed.weight" in refused and "head.weight" in refused, (
        refused
    )
    assert "Shard(dim=1)" in refused and "'rowwise'" in refused
    head_only = main["toy_head_only"]
    assert head_only.startswith("ValueError") and "a whole (unsplit) tensor" in head_only, head_only
    assert main["toy_alike"] == "tied"
    for rank in range(len(first)):
        assert first[rank]["reload_diff"] == 0.0 and first[rank]["reload_tied"], rank


@pytest.mark.slow  # two 2-process launches with transformers (~1 min; minutes on a busy machine)
@pytest.mark.timeout(1800)
def test_tp2_tied_llama_keeps_the_tie_trains_like_one_process_saves_once_and_resumes(tmp_path) -> None:
    pytest.importorskip("transformers")
    sizes = {"tp_size": 2}
    first = run_distributed(_tied_worker, 2, str(tmp_path), sizes, 0, timeout=900)
    second = run_distributed(_tied_worker, 2, str(tmp_path), sizes, 1, timeout=900)
    _check(first, second)


@pytest.mark.slow  # two 4-process launches
@pytest.mark.timeout(2400)
def test_fsdp2_x_tp_2x2_tied_llama(tmp_path) -> None:
    pytest.importorskip("transformers")
    sizes = {"dp_shard_size": 2, "tp_size": 2}
    first = run_distributed(_tied_worker, 4, str(tmp_path), sizes, 0, timeout=1200)
    second = run_distributed(_tied_worker, 4, str(tmp_path), sizes, 1, timeout=1200)
    _check(first, second)
    assert first[0]["applied"][1].startswith("2. FSDP2"), first[0]["applied"]


def _fsdp_tied_full_state_dict() -> tuple[bool, list[str]]:
    """One FSDP2 process (world of 1, gloo): are both names of the tie one tensor in the full state dict?"""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from accelerando.backends.strategies.fsdp.state import full_model_state_dict

    dist.init_process_group("gloo", rank=0, world_size=1)

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.body = nn.Linear(8, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    fully_shard(model)
    state = full_model_state_dict(model)
    return state["embed.weight"] is state["head.weight"], sorted(state)


def test_fsdp_full_state_dict_keeps_a_tie_as_one_tensor() -> None:
    """FSDP's gathered full state dict holds one tensor for both names of a tied weight (written once)."""
    ((shared, names),) = run_distributed_preloaded(_fsdp_tied_full_state_dict, 1, timeout=300)
    assert shared is True, names
