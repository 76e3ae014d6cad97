"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist`` and the rest, forwarding to ds_engine.utils,
and (as DeepSpeed's ``from .groups import *``) the group getters of ds_engine.groups.

Submodules (``logging``, ``zero_to_fp32``, ``groups``) are files beside this one.
"""

from ds_engine import groups as _groups
from ds_engine import utils as _impl

from deepspeed._forward import forward
from deepspeed.utils import z3_leaf_module as _z3_leaf_module
from deepspeed.utils.init_on_device import OnDevice as OnDevice
from deepspeed.utils.logging import logger as logger

# as in DeepSpeed, the package attribute is the function (it shadows its module's name once imported)
from deepspeed.utils.z3_leaf_module import z3_leaf_module as z3_leaf_module  # noqa: E402

__all__, __getattr__, __dir__ = forward(
    __name__, _z3_leaf_module, _impl, _groups, extra=["OnDevice", "logger"]
)
