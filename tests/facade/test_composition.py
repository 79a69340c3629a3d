"""The Accelerator is composed, not mixed: no base classes, and each service works on its own.

Every service is built here from its typed constructor, without an Accelerator (the connector still
builds the runtime: strategy, precision, process), and checked by counted work on a tiny model.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accelerando.backends.connector as connector
from accelerando import Accelerator, DataLoaderConfiguration
from accelerando.backends.strategies.base import Strategy
from accelerando.core.gradient_state import GradientState
from accelerando.core.runtime import Plugins
from accelerando.facade.checkpoint_service import CheckpointService
from accelerando.facade.collectives import Collectives
from accelerando.facade.context import ServiceContext
from accelerando.facade.observing import Observability
from accelerando.facade.options import AcceleratorOptions
from accelerando.facade.preparer import Preparer
from accelerando.facade.registry import PreparedObjects
from accelerando.facade.topology import MeshRanks
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.plugins.project import ProjectConfiguration
from accelerando.scheduler import AcceleratedScheduler
from accelerando.state import AcceleratorState

pytestmark = pytest.mark.usefixtures("fresh_state")

SERVICES = (PreparedObjects, Preparer, CheckpointService, Collectives, Observability, MeshRanks)
FACADE_DIR = Path(__file__).resolve().parents[2] / "src" / "accelerando" / "facade"
ACCELERATOR_FILE = FACADE_DIR.parent / "accelerator.py"


class _Owner:
    """Stands for the Accelerator where a service needs its owner: a step counter, weakly referenced."""

    def __init__(self) -> None:
        self.step = 0


class _CountingStrategy(Strategy):
    """The single-device strategy, counting what the preparer asks of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {"prepare_all": 0, "prepare_model": 0, "prepare_optimizer": 0}

    def prepare_all(self, request: Any) -> Any:
        self.calls["prepare_all"] += 1
        return super().prepare_all(request)

    def prepare_model(
        self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> Any:
        self.calls["prepare_model"] += 1
        return super().prepare_model(model, device_placement, evaluation_mode)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self.calls["prepare_optimizer"] += 1
        return super().prepare_optimizer(optimizer)


def _runtime() -> connector.Built:
    """The connector's runtime, strategy and precision for one CPU process, built without an Accelerator."""
    return connector.build(connector.resolve_settings({"cpu": True}), Plugins())


def _options(tmp_path: Path | None = None) -> AcceleratorOptions:
    project = ProjectConfiguration(project_dir=str(tmp_path)) if tmp_path else ProjectConfiguration()
    return AcceleratorOptions(dataloader_config=DataLoaderConfiguration(), project_configuration=project)


def _context(
    built: connector.Built,
    registry: PreparedObjects | None = None,
    strategy: Strategy | None = None,
    options: AcceleratorOptions | None = None,
    gradients: GradientState | None = None,
) -> ServiceContext:
    """The services record an Accelerator builds in ``_compose``, built here from its parts."""
    return ServiceContext(
        runtime=built.runtime,
        strategy=strategy or built.strategy,
        precision=built.precision,
        state=AcceleratorState(),
        gradient_state=gradients or GradientState(),
        options=options or _options(),
        registry=registry if registry is not None else PreparedObjects(),
    )


def _preparer(
    registry: PreparedObjects, strategy: Strategy, built: connector.Built, gradients: GradientState
) -> Preparer:
    return Preparer(_context(built, registry, strategy, gradients=gradients), lambda: False)


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, loader, scheduler


# ------------------------------------------------------------------------------------ structure
def test_the_accelerator_has_no_base_class_but_object() -> None:
    assert Accelerator.__mro__ == (Accelerator, object)


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.__name__)
def test_every_service_constructor_is_typed(service: type) -> None:
    parameters = list(inspect.signature(service.__init__).parameters.values())[1:]
    untyped = [p.name for p in parameters if p.annotation in (inspect.Parameter.empty, "Any")]
    assert untyped == [], f"{service.__name__} takes untyped {untyped}"


def test_no_sequence_or_context_parallel_internals_in_the_facade() -> None:
    sources = [ACCELERATOR_FILE, *sorted(FACADE_DIR.glob("*.py"))]
    internals = (
        "UlyssesSPDataLoaderAdapter",
        "deepspeed.utils",
        "tensor.experimental",
        "context_parallel_context",
    )
    found = [(path.name, word) for path in sources for word in internals if word in path.read_text()]
    assert found == []


def test_the_reference_attributes_are_the_services_objects() -> None:
    accelerator = Accelerator(cpu=True)
    registry = accelerator._registry
    assert accelerator._models is registry.models and accelerator._optimizers is registry.optimizers
    assert accelerator._schedulers is registry.schedulers and accelerator._dataloaders is registry.dataloaders
    assert accelerator._custom_objects is registry.custom_objects
    model, optimizer, loader, scheduler = accelerator.prepare(*_tiny())
    assert (len(registry.models), len(registry.optimizers), len(registry.dataloaders)) == (1, 1, 1)
    assert registry.schedulers == [scheduler]
    # Rebinding a shared option on the Accelerator (as the reference's own tests do) reaches the preparer.
    accelerator.dataloader_config = DataLoaderConfiguration(split_batches=True)
    assert accelerator._preparer.options.dataloader_config.split_batches is True
    assert accelerator.split_batches is True
    accelerator.free_memory()
    assert not (registry.models or registry.optimizers or registry.dataloaders or registry.schedulers)


# ------------------------------------------------------------------------------ each service alone
def test_registry_and_preparer_alone_prepare_a_tiny_model_once() -> None:
    runtime = _runtime()
    strategy = _CountingStrategy(runtime.runtime, runtime.precision)
    registry, gradients = PreparedObjects(), GradientState()
    preparer = _preparer(registry, strategy, runtime, gradients)
    model, optimizer, loader, scheduler = _tiny()
    prepared = preparer.prepare(model, optimizer, loader, scheduler)
    again = preparer.prepare(*prepared)  # already prepared: returned as is, registered once
    assert list(again) == list(prepared)
    p_model, p_optimizer, p_loader, p_scheduler = prepared
    assert isinstance(p_optimizer, AcceleratedOptimizer) and isinstance(p_scheduler, AcceleratedScheduler)
    assert (registry.models, registry.optimizers) == ([p_model], [p_optimizer])
    assert (registry.schedulers, registry.dataloaders) == ([p_scheduler], [p_loader])
    assert strategy.calls == {"prepare_all": 2, "prepare_model": 1, "prepare_optimizer": 1}
    assert all(obj._is_accelerate_prepared for obj in prepared)
    assert registry.holds(p_model) and not registry.holds(model.weight)


def test_prepared_optimizer_steps_bit_for_bit_like_plain_pytorch_and_calls_the_registry_hook() -> None:
    runtime = _runtime()
    registry = PreparedObjects()
    steps: list[int] = []
    registry.set_after_optimizer_step(lambda: steps.append(1))
    preparer = _preparer(registry, Strategy(runtime.runtime, runtime.precision), runtime, GradientState())
    model, optimizer, _, _ = _tiny()
    reference = nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = preparer.prepare(model, optimizer)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    for net, opt in ((model, optimizer), (reference, reference_optimizer)):
        for _ in range(3):
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert torch.equal(model.weight, reference.weight) and torch.equal(model.bias, reference.bias)
    assert len(steps) == 3


def test_collectives_alone_gather_and_trigger_on_one_process() -> None:
    collectives = Collectives(_context(_runtime()))
    tensor = torch.arange(4.0)
    assert torch.equal(collectives.gather(tensor), tensor)
    assert torch.equal(collectives.reduce(tensor, "sum"), tensor)
    assert collectives.check_trigger() is False
    collectives.set_trigger()
    assert collectives.flag_tensor is not None
    assert collectives.check_trigger() is True and collectives.flag_tensor is None


def test_checkpoint_service_alone_saves_and_restores_a_tiny_model(tmp_path: Path) -> None:
    registry, owner = PreparedObjects(), _Owner()
    context = _context(_runtime(), registry, options=_options(tmp_path))
    service = CheckpointService(context, owner, Observability(context))
    model = nn.Linear(3, 1)
    registry.models.append(model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    owner.step = 5
    path = service.save_state(str(tmp_path / "ckpt"))
    with torch.no_grad():
        model.weight.add_(1.0)
    owner.step = 0
    service.load_state(path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert service.target.owner is owner


def test_observability_alone_logs_nothing_without_trackers_and_hooks_the_memory_monitor(
    tmp_path: Path,
) -> None:
    registry = PreparedObjects()
    observability = Observability(_context(_runtime(), registry, options=_options(tmp_path)))
    observability.log({"loss": 1.0})  # no tracker: a no-op
    assert observability.trackers == []
    monitor = observability.enable_memory_monitor(window=3, plot=False)
    assert registry.after_optimizer_step == monitor.step
    observability.end_training()
    assert registry.after_optimizer_step is None and observability.memory_monitor is None


def test_mesh_ranks_alone_without_a_mesh() -> None:
    ranks = MeshRanks(_context(_runtime()))
    assert ranks.tensor_parallel_rank == ranks.pipeline_parallel_rank == ranks.context_parallel_rank == 0
    assert ranks.data_parallel_rank == 0 and ranks.data_parallel_shard_rank == 0
    assert ranks.should_save_model is True


def test_a_dropped_accelerator_frees_its_services_and_prepared_model_without_a_gc_pass() -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 2))
    watched = [weakref.ref(o) for o in (accelerator, accelerator._registry, accelerator._checkpoints, model)]
    gc.disable()
    try:
        del accelerator, model
        assert [ref() for ref in watched] == [None] * len(watched)  # no reference cycle among the services
    finally:
        gc.enable()
