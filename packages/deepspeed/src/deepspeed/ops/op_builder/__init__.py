"""``deepspeed.ops.op_builder``: DeepSpeed's op builders, answering for what ds has.

DeepSpeed compiles C++/CUDA ops (``CPUAdamBuilder().load()``); ds has no compiled ops. Its optimizers and
kernels are Python classes over torch's fused kernels and Numba (``deepspeed.ops.adam.DeepSpeedCPUAdam``,
``FusedAdam``, ``deepspeed.ops.lamb.FusedLamb``, ``deepspeed.ops.sparse_attention``). So a builder's
``is_compatible()`` is True exactly when the feature its op backs is usable in ds through those classes
(code uses it to choose them), and ``load()`` raises :class:`FeatureNotAvailableError`: the op's raw
functions (``create_adam``, ``adam_update``...) are not part of ds. The exception is ``AsyncIOBuilder``:
its ``load()`` returns DeepSpeed's async I/O names (``aio_handle``...) over ds's own file I/O
(``deepspeed.ops.aio._handle``).
"""

from __future__ import annotations

from typing import Any

from ds_engine._missing import missing_function

# op NAME -> the ds class that provides the feature, or None where ds has none (with the reason)
_OPS: dict[str, tuple[str, str | None, str]] = {
    "CPUAdamBuilder": ("cpu_adam", "deepspeed.ops.adam.DeepSpeedCPUAdam", ""),
    "FusedAdamBuilder": ("fused_adam", "deepspeed.ops.adam.FusedAdam", ""),
    "FusedLambBuilder": ("fused_lamb", "deepspeed.ops.lamb.FusedLamb", ""),
    "SparseAttnBuilder": ("sparse_attn", "deepspeed.ops.sparse_attention", ""),
    "CPUAdagradBuilder": ("cpu_adagrad", None, "ds has no CPU Adagrad; use torch.optim.Adagrad"),
    "CPULionBuilder": ("cpu_lion", None, "ds has no Lion optimizer"),
    "FusedLionBuilder": ("fused_lion", None, "ds has no Lion optimizer"),
    "AsyncIOBuilder": ("async_io", "deepspeed.ops.aio._handle", ""),
    "GDSBuilder": ("gds", None, "DeepSpeed's compiled async I/O op (aio_handle); ds's NVMe optimizer offload uses its own I/O (ds_zero._aio)"),
    "TransformerBuilder": ("transformer", None, "DeepSpeed's fused transformer kernels are not in ds"),
    "StochasticTransformerBuilder": ("stochastic_transformer", None, "DeepSpeed's fused transformer kernels are not in ds"),
    "InferenceBuilder": ("transformer_inference", None, "DeepSpeed inference kernels are not in ds"),
    "QuantizerBuilder": ("quantizer", None, "DeepSpeed's quantizer kernels are not in ds"),
    "FPQuantizerBuilder": ("fp_quantizer", None, "DeepSpeed's quantizer kernels are not in ds"),
    "RandomLTDBuilder": ("random_ltd", None, "random layer token drop is not in ds"),
    "EvoformerAttnBuilder": ("evoformer_attn", None, "DeepSpeed's Evoformer attention is not in ds"),
    "UtilsBuilder": ("utils", None, "DeepSpeed's flatten/unflatten op: use torch's _flatten_dense_tensors"),
    "CCLCommBuilder": ("deepspeed_ccl_comm", None, "oneCCL communication is not in ds (gloo/NCCL are)"),
    "ShareMemCommBuilder": ("deepspeed_shm_comm", None, "DeepSpeed's shared-memory collectives are not in ds"),
    "PinMemoryBuilder": ("pin_memory", None, "use torch.Tensor.pin_memory()"),
    "NotImplementedBuilder": ("deepspeed_not_implemented", None, "DeepSpeed's placeholder op"),
    "DeepCompileBuilder": ("dc", None, "DeepSpeed's DeepCompile is not in ds"),
    "FlashAttentionBuilder": ("flash_attn", None, "DeepSpeed's flash attention op is not in ds (sparse attention is)"),
    "InferenceCoreBuilder": ("inference_core_ops", None, "DeepSpeed inference kernels are not in ds"),
    "InferenceCutlassBuilder": ("cutlass_ops", None, "DeepSpeed inference kernels are not in ds"),
    "RaggedOpsBuilder": ("ragged_device_ops", None, "DeepSpeed inference kernels are not in ds"),
    "RaggedUtilsBuilder": ("ragged_ops", None, "DeepSpeed inference kernels are not in ds"),
    "SpatialInferenceBuilder": ("spatial_inference", None, "DeepSpeed inference kernels are not in ds"),
}  # fmt: skip


class OpBuilder:
    """Base of the builders: ``NAME``, ``is_compatible()``, ``load()``, ``absolute_name()``."""

    NAME = "op"
    _provider: str | None = None
    _why_not = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.NAME

    def absolute_name(self) -> str:
        return f"deepspeed.ops.{self.NAME}_op"

    def is_compatible(self, verbose: bool = False) -> bool:
        """True when ds provides this op's feature (through the class named in ``load()``'s error)."""
        return self._provider is not None

    def builder(self) -> Any:
        return self.load()

    # DeepSpeed's base class compiles; ds compiles no ops (each builder below names its op and what instead)
    load = missing_function(__name__, "OpBuilder.load", "DeepSpeed's compiled ops", "ds compiles no ops.")


def _load_aio(self, verbose: bool = False):
    """The async I/O op's names (``aio_handle``...) over ds's file I/O: see ``deepspeed.ops.aio._handle``."""
    from deepspeed.ops.aio import _handle as aio

    return aio.load()


def _unloadable(cls_name: str, method: str, op: str, provider: str | None, why_not: str) -> Any:
    """``load`` (or ``builder``) of an op ds does not compile: not available, naming the op and what instead."""
    instead = (
        f"ds provides the feature as {provider}, in Python over torch: use that class"
        if provider
        else why_not
    )
    return missing_function(
        __name__, f"{cls_name}.{method}", f"DeepSpeed's compiled op {op!r}", f"{instead}."
    )


def _builder(cls_name: str, op: str, provider: str | None, why_not: str) -> type[OpBuilder]:
    attrs = {"NAME": op, "_provider": provider, "_why_not": why_not, "__module__": __name__}
    if op == "async_io":  # the one op ds gives whole, under DeepSpeed's names
        attrs["load"] = _load_aio
    else:
        attrs["load"] = _unloadable(cls_name, "load", op, provider, why_not)
        attrs["builder"] = _unloadable(cls_name, "builder", op, provider, why_not)
    attrs["__doc__"] = f"DeepSpeed's ``{cls_name}`` (op ``{op}``): " + (
        f"available in ds as ``{provider}``." if provider else f"not in ds: {why_not}."
    )
    return type(cls_name, (OpBuilder,), attrs)


_BUILDERS = {name: _builder(name, *spec) for name, spec in _OPS.items()}
globals().update(_BUILDERS)
ALL_OPS = {cls.NAME: cls() for cls in _BUILDERS.values()}
# DeepSpeed's git_version_info.installed_ops: op name -> usable
INSTALLED_OPS = {name: builder.is_compatible() for name, builder in ALL_OPS.items()}

__all__ = ["ALL_OPS", "INSTALLED_OPS", "OpBuilder", *_BUILDERS]  # noqa: PLE0604
