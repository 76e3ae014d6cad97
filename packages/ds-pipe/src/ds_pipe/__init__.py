"""Pipeline parallelism: DeepSpeed's ``PipelineModule`` and its 1F1B schedule, over process groups it is given.

``PipelineModule`` splits a list of layers (``LayerSpec``, ``TiedLayerSpec``, modules, functions) into
stages; ``PipelineRunner`` executes DeepSpeed's schedules on one stage, sending activations and gradients
point to point. It builds no process group: ds-engine builds the job's one topology and hands the pipe,
data and tied-weight groups over.
"""

from ds_pipe import schedule
from ds_pipe._config_fields import CONFIG_FIELDS
from ds_pipe._grid import PipelineGrid
from ds_pipe._module import LayerSpec, PipelineError, PipelineModule, TiedLayerSpec
from ds_pipe._partition import partition_balanced, partition_uniform
from ds_pipe._runner import PipelineRunner, StageHooks
from ds_pipe._topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology
from ds_pipe.schedule import InferenceSchedule, PipeSchedule, TrainSchedule

__all__ = [
    "CONFIG_FIELDS",
    "InferenceSchedule",
    "LayerSpec",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipeSchedule",
    "PipelineError",
    "PipelineGrid",
    "PipelineModule",
    "PipelineRunner",
    "ProcessTopology",
    "StageHooks",
    "TiedLayerSpec",
    "TrainSchedule",
    "partition_balanced",
    "partition_uniform",
    "schedule",
]
