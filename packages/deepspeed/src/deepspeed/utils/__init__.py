"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist`` and the rest (``_utils``), and (as DeepSpeed's
``from .groups import *``) the group getters of ``groups``.

Submodules (``logging``, ``zero_to_fp32``, ``groups``) are files beside this one.
"""

from deepspeed._forward import forward
from deepspeed.utils import _utils
from deepspeed.utils import groups as _groups
from deepspeed.utils import z3_leaf_module as _z3_leaf_module
from deepspeed.utils.init_on_device import OnDevice as OnDevice
from deepspeed.utils.logging import logger as logger

# as in DeepSpeed, the package attribute is the function (it shadows its module's name once imported)
from deepspeed.utils.z3_leaf_module import z3_leaf_module as z3_leaf_module  # noqa: E402

__all__, __getattr__, __dir__ = forward(
    __name__, _z3_leaf_module, _utils, _groups, extra=["OnDevice", "logger"]
)
