"""Pipeline parallelism over ``torch.distributed.pipelining`` (training and ``prepare_pippy``).

``split.py`` decides where stages begin (layer names or parameter bytes); ``stage.py`` traces the
model and builds one process's stage and schedule; ``model.py`` is the prepared model that runs a
pipeline step per call; ``data_parallel.py`` the pipeline x data-parallel layout (sizes, the
``("dp_replicate", "pp")`` mesh, the gradient all-reduce over the pipelines); ``strategy.py`` the
training strategy. (Context parallelism, another non-data-parallel axis, composes onto any mesh:
``accelerando.backends.strategies.context_parallel``.)
"""

from __future__ import annotations

from accelerando.backends.strategies.pipeline.data_parallel import (
    build_pipeline_mesh,
    pipeline_data_parallel_sizes,
)
from accelerando.backends.strategies.pipeline.model import PipelineModel, PipelineOutput
from accelerando.backends.strategies.pipeline.split import (
    balanced_split_points,
    generate_stage_map,
    validate_split_points,
)
from accelerando.backends.strategies.pipeline.stage import PipelineLayout
from accelerando.backends.strategies.pipeline.strategy import PipelineStrategy

__all__ = [
    "PipelineLayout",
    "PipelineModel",
    "PipelineOutput",
    "PipelineStrategy",
    "balanced_split_points",
    "build_pipeline_mesh",
    "generate_stage_map",
    "pipeline_data_parallel_sizes",
    "validate_split_points",
]
