"""ds-precision test settings."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # the CI machine has 2 shared cores: intra-op threads on tiny tensors only add contention
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
