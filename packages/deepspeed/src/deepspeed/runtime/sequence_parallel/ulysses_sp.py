"""DeepSpeed's ``deepspeed.runtime.sequence_parallel.ulysses_sp`` (ALST): ``UlyssesSPAttentionHF`` and
``UlyssesSPDataLoaderAdapter`` are ds_tpsp's; ``register_with_transformers`` makes the sequence groups on ds's one
topology (``parallel_state_sp``) and returns that mpu, as DeepSpeed does. The sequence tiling helpers (TiledMLP,
the tiled logits loss) are not in ds: they fail at use with ``FeatureNotAvailableError``.
"""

from ds_engine._missing import missing_class, missing_function
from ds_tpsp.sequence import alst as _alst

from deepspeed.runtime.sequence_parallel import parallel_state_sp as _mpu

UlyssesSPDataLoaderAdapter = _alst.UlyssesSPDataLoaderAdapter


class UlyssesSPAttentionHF(_alst.UlyssesSPAttentionHF):
    @classmethod
    def register_with_transformers(
        cls,
        model_name_or_path,
        core_attn_implementation,
        sequence_parallel_size,
        micro_batch_size,
        seq_length=None,
        seq_length_is_variable=True,
        disable_in_eval=False,
        max_length=None,
    ):
        """DeepSpeed's: None at size 1; else the groups (``initialize_sequence_parallel``) and the mpu."""
        if sequence_parallel_size == 1:
            return None
        _mpu.initialize_sequence_parallel(sequence_parallel_size)
        super().register_with_transformers(
            model_name_or_path, core_attn_implementation, sequence_parallel_size, micro_batch_size, seq_length,
            seq_length_is_variable, disable_in_eval, max_length, process_group=_mpu.get_sequence_parallel_group(),
        )  # fmt: skip
        return _mpu


_TILING = "ALST sequence tiling (TiledMLP, tiled logits loss)"
_INSTEAD = "Ulysses without tiling (UlyssesSPAttentionHF) is in ds: drop TiledMLP / the tiled loss."

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
