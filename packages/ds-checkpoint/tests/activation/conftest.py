"""Every activation test starts from an unconfigured process and an empty RNG tracker."""

import pytest
from ds_checkpoint.activation import _state, get_rng_tracker


@pytest.fixture(autouse=True)
def fresh_activation_state():
    _state._RUNTIME = _state._Runtime()
    get_rng_tracker().reset()
    yield
    _state._RUNTIME = _state._Runtime()
    get_rng_tracker().reset()
