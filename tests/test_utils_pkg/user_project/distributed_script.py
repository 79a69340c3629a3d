# A training script as a user of the reference library writes it; run by user_suite.py under
# `<package> launch --num_processes=2`. It only imports the reference's public names.
import torch
from accelerate import Accelerator
from accelerate.test_utils import RegressionDataset, RegressionModel
from accelerate.utils import gather, gather_object, reduce, set_seed
from torch.utils.data import DataLoader


def main():
    accelerator = Accelerator()
    set_seed(0)
    rank = accelerator.process_index
    assert accelerator.num_processes == 2, accelerator.num_processes

    gathered = gather(torch.tensor([rank * 10.0], device=accelerator.device))
    assert gathered.tolist() == [0.0, 10.0], gathered
    assert gather_object([f"r{rank}"]) == ["r0", "r1"]
    assert reduce(torch.tensor([rank + 1.0]), "sum").item() == 3.0

    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(RegressionDataset(length=32, seed=1), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weights = torch.stack([p.detach().reshape(-1)[0] for p in accelerator.unwrap_model(model).parameters()])
    assert torch.equal(gather(weights[None])[0], gather(weights[None])[1]), "replicas diverged"

    accelerator.wait_for_everyone()
    print(f"USER SCRIPT OK rank {rank} accelerator from {Accelerator.__module__}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
