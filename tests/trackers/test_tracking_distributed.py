"""Two gloo processes: one run per tracker, reduced metrics, rank-aware logging and progress bars."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from suite_support import run_distributed_preloaded

pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")


def _observability_rank(tmp: str) -> dict:
    import torch.distributed as dist

    from accelerando.logging import get_logger
    from accelerando.tracking import TrackingManager
    from accelerando.utils import tqdm

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    manager = TrackingManager(["tensorboard"], logging_dir=tmp)
    manager.init("proj", config={"lr": 0.1})
    value = 1.0 + 2 * rank  # rank 0: 1.0, rank 1: 3.0
    manager.log({"mean_loss": value}, step=0, reduce="mean")
    manager.log({"sum_items": int(value)}, step=0, reduce="sum")
    manager.log({"max_mem": value, "note": f"from {rank}"}, step=0, reduce="max")
    manager.finish()

    handler = logging.FileHandler(Path(tmp, "log.txt"))
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = get_logger("obs.dist", log_level="INFO")
    logger.logger.addHandler(handler)
    logger.info("main only")
    logger.info(f"in order {rank}", main_process_only=False, in_order=True)
    handler.close()
    dist.barrier()
    started = [t.tracker is not None for t in manager.trackers]
    return {"rank": rank, "started": started, "bar_disabled": tqdm(range(2)).disable}


def test_one_run_reduced_metrics_and_ordered_logs(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = run_distributed_preloaded(_observability_rank, 2, str(tmp_path))
    assert [r["started"] for r in results] == [[True], [False]]
    assert [r["bar_disabled"] for r in results] == [False, True]

    event_files = list((tmp_path / "proj").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    events = EventAccumulator(str(tmp_path / "proj"))
    events.Reload()
    assert events.Scalars("mean_loss")[0].value == 2.0
    assert events.Scalars("sum_items")[0].value == 4
    assert events.Scalars("max_mem")[0].value == 3.0

    assert events.Tensors("note/text_summary")[0].tensor_proto.string_val == [b"from 0"]
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert lines == ["main only", "in order 0", "in order 1"]
