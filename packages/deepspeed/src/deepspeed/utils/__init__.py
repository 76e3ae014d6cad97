"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist`` and the rest, forwarding to ds_engine.utils.

Submodules (``logging``, ``zero_to_fp32``, ``groups``) are files beside this one.
"""

from ds_engine import utils as _impl

from deepspeed._forward import forward
from deepspeed.utils import z3_leaf_module
from deepspeed.utils.logging import logger as logger

__all__, __getattr__, __dir__ = forward(__name__, z3_leaf_module, _impl, extra=["logger"])
