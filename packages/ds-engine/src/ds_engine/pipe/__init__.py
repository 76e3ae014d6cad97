"""DeepSpeed's ``deepspeed.pipe`` (pipeline parallelism): not in ds; every name fails at use, naming it."""

from ds_engine._missing import missing_class

_FEATURE = "pipeline parallelism (deepspeed.pipe)"
_INSTEAD = "Train the model as one nn.Module (data parallel, ZeRO) or use torch.distributed.pipelining."

PipelineModule = missing_class(__name__, "PipelineModule", _FEATURE, _INSTEAD)
LayerSpec = missing_class(__name__, "LayerSpec", _FEATURE, _INSTEAD)
TiedLayerSpec = missing_class(__name__, "TiedLayerSpec", _FEATURE, _INSTEAD)
ProcessTopology = missing_class(__name__, "ProcessTopology", _FEATURE, _INSTEAD)

__all__ = ["LayerSpec", "PipelineModule", "ProcessTopology", "TiedLayerSpec"]
