"""Two real gloo processes: the prepared loop against hand-written DDP and single-process full batch.

Each launch costs seconds, so one launch runs many checks and returns numbers the parent compares.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from suite_support import fresh_accelerator, run_distributed_preloaded

N, MICRO = 48, 4


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=g)
    y = torch.randn(N, 1, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    return model, x, y


def _train_prepared(steps: int):
    model, x, y = _problem()
    acc = fresh_accelerator(gradient_accumulation_steps=steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=MICRO))
    norms = []
    for xb, yb in dl:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            if acc.sync_gradients:
                norms.append(acc.clip_grad_norm_(model.parameters(), 1e9).item())
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()], norms


def _train_handwritten_ddp():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, x, y = _problem()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank, world = dist.get_rank(), dist.get_world_size()
    # The same interleaved sharding the prepared loader uses: global batch i*world + rank.
    batches = list(DataLoader(TensorDataset(x, y), batch_size=MICRO))
    for xb, yb in batches[rank::world]:
        nn.functional.mse_loss(ddp(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _count_allreduces(steps: int) -> tuple[int, int]:
    from accelerando import DistributedDataParallelKwargs

    model, x, y = _problem()
    acc = fresh_accelerator(
        gradient_accumulation_steps=steps, kwargs_handlers=[DistributedDataParallelKwargs()]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=MICRO))
    calls = []

    def counting_hook(state, bucket):
        calls.append(1)
        import torch.distributed as dist

        fut = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting_hook)
    syncs = 0
    for xb, yb in dl:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            syncs += acc.sync_gradients
            opt.step()
            opt.zero_grad()
    return len(calls), syncs


def _fp16_skip_agreement():
    import torch.distributed as dist

    model, x, y = _problem()
    acc = fresh_accelerator(mixed_precision="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.backward(nn.functional.mse_loss(model(x), y))
    if dist.get_rank() == 1:  # overflow seen by one process only, after the all-reduce
        next(iter(model.parameters())).grad.view(-1)[0] = float("inf")
    opt.step()
    return acc.optimizer_step_was_skipped, acc.scaler.get_scale()


def _gather_for_metrics_lengths():
    from accelerando import DataLoaderConfiguration

    results = {}
    batch, world = 3, 2
    # even_batches=False without split_batches gives processes different batch counts, so a
    # per-batch collective cannot be used there at all (that is what join_uneven_inputs is for).
    for split, even in ((False, True), (True, True), (True, False)):
        if True:
            for length in range(1, 3 * batch * world + 1):
                if not even and 0 < length % (batch * world) <= batch * (world - 1):
                    continue  # a process would get no sample at all in the last batch
                cfg = DataLoaderConfiguration(split_batches=split, even_batches=even)
                acc = fresh_accelerator(dataloader_config=cfg)
                data = torch.arange(length)
                dl = acc.prepare(
                    DataLoader(TensorDataset(data), batch_size=batch * world if split else batch)
                )
                seen = []
                for (xb,) in dl:
                    gathered = acc.gather_for_metrics({"ids": xb, "twice": (xb * 2,)})
                    seen.extend(gathered["ids"].tolist())
                    assert torch.equal(gathered["twice"][0], gathered["ids"] * 2)
                objects = []
                for (xb,) in dl:
                    objects.extend(acc.gather_for_metrics([f"s{i}" for i in xb.tolist()]))
                results[(split, even, length)] = (seen, objects)
    return results


def _join_and_trigger():
    import torch.distributed as dist

    from accelerando import DataLoaderConfiguration

    model, x, y = _problem()
    acc = fresh_accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # 5 batches of 4 over 2 processes: rank 0 gets 3, rank 1 gets 2; Join keeps rank 0 from hanging.
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x[:20], y[:20]), batch_size=MICRO))
    batches = 0
    with acc.join_uneven_inputs([model]):
        for xb, yb in dl:
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()
            batches += 1
    calls = []

    def counting_hook(state, bucket):
        calls.append(1)
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting_hook)
    xb, yb = x[:4], y[:4]
    with acc.no_sync(model):
        acc.backward(nn.functional.mse_loss(model(xb), yb))  # local only
        with acc.trigger_sync_in_backward(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))  # forced all-reduce
    return batches, len(calls)


def _rank_main():
    from accelerando.state import PartialState

    state = PartialState()
    out = {
        "world": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "backend": state.backend,
        "prepared_1": _train_prepared(1),
        "prepared_2": _train_prepared(2),
        "handwritten": _train_handwritten_ddp(),
        "allreduce_counts": _count_allreduces(3),
        "fp16_skip": _fp16_skip_agreement(),
        "gather_for_metrics": _gather_for_metrics_lengths(),
        "join_trigger": _join_and_trigger(),
    }
    return out


@pytest.fixture(scope="module")
def two_process_results():
    return run_distributed_preloaded(_rank_main, 2, timeout=400)


def _single_process_full_batch(steps: int):
    """What 2 processes x micro-batch x steps compute: one process over batches of 2*MICRO*steps."""
    model, x, y = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = list(DataLoader(TensorDataset(x, y), batch_size=MICRO))
    norms = []
    group = 2 * steps
    for i in range(0, len(batches), group):
        chunk = batches[i : i + group]
        # Each process averages its own micro-batch losses; DDP averages over processes.
        total = sum(nn.functional.mse_loss(model(xb), yb) for xb, yb in chunk) / len(chunk)
        total.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item())
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()], norms


def test_ranks_and_backend(two_process_results):
    for res in two_process_results:
        assert res["world"] == 2 and res["distributed_type"] == "MULTI_CPU" and res["backend"] == "gloo"


def test_prepared_equals_handwritten_ddp_and_full_batch(two_process_results):
    full, _ = _single_process_full_batch(1)
    for res in two_process_results:
        params, _ = res["prepared_1"]
        for a, b, c in zip(params, res["handwritten"], full, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            torch.testing.assert_close(a, c, atol=1e-6, rtol=0)


def test_ddp_accumulation_equals_bigger_batch(two_process_results):
    full, full_norms = _single_process_full_batch(2)
    for res in two_process_results:
        params, norms = res["prepared_2"]
        assert norms == pytest.approx(full_norms, rel=1e-5)
        for a, c in zip(params, full, strict=True):
            torch.testing.assert_close(a, c, atol=1e-6, rtol=0)


def test_no_sync_skips_allreduce(two_process_results):
    # 12 batches / 2 processes = 6 micro-batches each, accumulation 3 -> 2 syncs, one bucket each.
    for res in two_process_results:
        calls, syncs = res["allreduce_counts"]
        assert syncs == 2
        assert calls == syncs


def test_fp16_skip_is_agreed(two_process_results):
    assert [r["fp16_skip"] for r in two_process_results] == [(True, 32768.0), (True, 32768.0)]


def test_gather_for_metrics_returns_dataset_exactly_once(two_process_results):
    for res in two_process_results:
        for (split, even, length), (seen, objects) in res["gather_for_metrics"].items():
            expected = list(range(length))
            assert seen == expected, (split, even, length)
            assert sorted(objects, key=lambda s: int(s[1:])) == [f"s{i}" for i in expected]


def test_join_uneven_inputs_and_trigger_sync(two_process_results):
    assert [r["join_trigger"] for r in two_process_results] == [(3, 1), (2, 1)]
