"""DeepSpeed's ``deepspeed.utils.init_on_device``: ``OnDevice`` is not in ds; it fails at use, naming it."""

from ds_engine._missing import missing_class

OnDevice = missing_class(
    __name__,
    "OnDevice",
    "DeepSpeed's OnDevice (building a model on the meta or a chosen device)",
    "Build the model under `with torch.device('meta'):` (or a device), or use deepspeed.zero.Init.",
)

__all__ = ["OnDevice"]
