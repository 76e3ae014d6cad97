"""Tensor parallelism (``ds_tpsp.tensor``) and sequence parallelism (``ds_tpsp.sequence``) over given groups."""

__all__: list[str] = []
