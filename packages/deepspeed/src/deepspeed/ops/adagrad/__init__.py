"""``deepspeed.ops.adagrad`` (``DeepSpeedCPUAdagrad``): not in ds-optim; construction fails, naming it."""

from ds_engine._missing import missing_class

DeepSpeedCPUAdagrad = missing_class(
    __name__,
    "DeepSpeedCPUAdagrad",
    "DeepSpeed's CPU Adagrad optimizer (deepspeed.ops.adagrad.DeepSpeedCPUAdagrad)",
    "Use torch.optim.Adagrad as the client optimizer (with zero_allow_untested_optimizer: true), or Adam.",
)

__all__ = ["DeepSpeedCPUAdagrad"]
