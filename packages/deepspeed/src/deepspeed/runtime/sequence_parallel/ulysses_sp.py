"""DeepSpeed's ``deepspeed.runtime.sequence_parallel.ulysses_sp`` (Ulysses / ALST sequence parallelism): not in ds.

Accelerate and transformers import ``UlyssesSPAttentionHF`` and ``UlyssesSPDataLoaderAdapter`` from here when
``sp_size > 1``, and call ``UlyssesSPAttentionHF.register_with_transformers``: every name fails at use with
``FeatureNotAvailableError`` naming sequence parallelism, instead of an ImportError or AttributeError.
"""

from ds_engine._missing import missing_class, missing_function

_SP = "Ulysses/ALST sequence parallelism (deepspeed.runtime.sequence_parallel)"
_TILING = "ALST sequence tiling (TiledMLP, tiled logits loss)"
_INSTEAD = "ds is data parallel only: train with sp_size 1 (shard a long-sequence model with ZeRO-3 instead)."

UlyssesSPAttentionHF = missing_class(__name__, "UlyssesSPAttentionHF", _SP, _INSTEAD)
# Accelerate calls this static method before constructing anything
UlyssesSPAttentionHF.register_with_transformers = staticmethod(
    missing_function(__name__, "UlyssesSPAttentionHF.register_with_transformers", _SP, _INSTEAD)
)
UlyssesSPDataLoaderAdapter = missing_class(__name__, "UlyssesSPDataLoaderAdapter", _SP, _INSTEAD)
SequenceTiledCompute = missing_class(__name__, "SequenceTiledCompute", _TILING, _INSTEAD)
TiledMLP = missing_class(__name__, "TiledMLP", _TILING, _INSTEAD)
TiledFusedLogitsLoss = missing_class(__name__, "TiledFusedLogitsLoss", _TILING, _INSTEAD)
AutogradComputeMLP = missing_class(__name__, "AutogradComputeMLP", _TILING, _INSTEAD)
sequence_tiled_compute = missing_function(__name__, "sequence_tiled_compute", _TILING, _INSTEAD)

__all__ = [
    "AutogradComputeMLP",
    "SequenceTiledCompute",
    "TiledFusedLogitsLoss",
    "TiledMLP",
    "UlyssesSPAttentionHF",
    "UlyssesSPDataLoaderAdapter",
    "sequence_tiled_compute",
]
