"""DeepSpeed's ``deepspeed.moe`` (mixture of experts with expert parallelism), mapped onto ds_moe."""

import ds_moe as _impl

from deepspeed._forward import forward
from deepspeed.moe import experts as experts
from deepspeed.moe import layer as layer
from deepspeed.moe import utils as utils

__all__, __getattr__, __dir__ = forward(__name__, _impl, extra=["experts", "layer", "utils"])
