"""``deepspeed.ops.lion`` (``FusedLion``, ``DeepSpeedCPULion``): not in ds-optim; construction fails, naming it."""

from ds_engine._missing import missing_class

_FEATURE = "DeepSpeed's Lion optimizer (deepspeed.ops.lion)"
_INSTEAD = "Use Adam/AdamW, or a torch Lion implementation as the client optimizer."

FusedLion = missing_class(__name__, "FusedLion", _FEATURE, _INSTEAD)
DeepSpeedCPULion = missing_class(__name__, "DeepSpeedCPULion", _FEATURE, _INSTEAD)

__all__ = ["DeepSpeedCPULion", "FusedLion"]
