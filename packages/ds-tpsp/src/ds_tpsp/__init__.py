"""Tensor parallelism (``ds_tpsp.tensor``) and sequence parallelism (``ds_tpsp.sequence``) over given groups."""

from ._config_fields import CONFIG_FIELDS

__all__: list[str] = ["CONFIG_FIELDS"]
