"""DeepSpeed's ``deepspeed.checkpoint``: checkpoint helpers, mapped onto ds_checkpoint.

``DeepSpeedCheckpoint`` is DeepSpeed's 3D reshaping view of one of its checkpoint folders
(``DeepSpeedCheckpoint(dir, tp_degree, pp_degree, dp_degree)``, for the universal-checkpoint and Megatron
reshape tools): not in ds, whose checkpoints load at any world size. ds reads a DeepSpeed checkpoint folder
with ``ds_checkpoint.load_deepspeed`` (whose result is ds_checkpoint's own, different, ``DeepSpeedCheckpoint``).
"""

from ds_engine._missing import missing_class

__all__ = ["DeepSpeedCheckpoint"]

DeepSpeedCheckpoint = missing_class(
    __name__,
    "DeepSpeedCheckpoint",
    "DeepSpeed's 3D checkpoint reshaping view (DeepSpeedCheckpoint(dir, tp_degree, pp_degree, dp_degree))",
    "ds checkpoints load at any world size; read a DeepSpeed checkpoint folder with "
    "ds_checkpoint.load_deepspeed(path)",
)

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)
