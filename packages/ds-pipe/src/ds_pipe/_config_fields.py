"""The DSConfig paths ds-pipe reads (checked against its reads by the tests)."""

CONFIG_FIELDS: tuple[str, ...] = ()
