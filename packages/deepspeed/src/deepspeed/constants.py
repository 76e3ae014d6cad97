"""DeepSpeed's ``deepspeed.constants``: the distributed defaults DeepSpeed's launcher and comm use."""

from deepspeed.comm.comm import TORCH_DISTRIBUTED_DEFAULT_PORT

CROSS_RANK = "CROSS_RANK"
CROSS_SIZE = "CROSS_SIZE"
LOCAL_RANK = "LOCAL_RANK"
INFERENCE_GENERIC_MODE = "generic"
INFERENCE_SPECIALIZED_MODE = "specialized"

__all__ = [
    "CROSS_RANK",
    "CROSS_SIZE",
    "INFERENCE_GENERIC_MODE",
    "INFERENCE_SPECIALIZED_MODE",
    "LOCAL_RANK",
    "TORCH_DISTRIBUTED_DEFAULT_PORT",
]
