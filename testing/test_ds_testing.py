import torch, torch.distributed as dist
from ds_testing import spawn
def f(rank, ws):
    t = torch.tensor([rank + 1.0]); dist.all_reduce(t); return t.item()
def test_spawn():
    assert spawn(f, 2) == [3.0, 3.0]
