"""An Accelerator with prepared loaders pickles and unpickles (its checkpoint target's weak link too)."""

from __future__ import annotations

import pickle

import torch

from accelerando import Accelerator
from accelerando.data_loader import DataLoaderShard, skip_first_batches


def test_accelerator_with_prepared_loaders_round_trips_through_pickle(fresh_state: None) -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10)))
    accelerator = Accelerator()
    prepared, _ = accelerator.prepare(loader, skip_first_batches(loader, 2))
    assert isinstance(prepared, DataLoaderShard)
    restored = pickle.loads(pickle.dumps(accelerator))
    assert len(restored._dataloaders) == 2
    assert [b[0].tolist() for b in restored._dataloaders[0]] == [b[0].tolist() for b in prepared]
    assert restored._checkpoint_target.owner is restored
