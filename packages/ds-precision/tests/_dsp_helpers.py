"""Tiny models and training loops shared by the ds-precision tests (fp16 matmul is slow on CPU)."""

import torch
from ds_precision import DynamicLossScaler, MixedPrecisionOptimizer


class TinyNet(torch.nn.Module):
    def __init__(self, d_in=6, d_hidden=12):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.norm = torch.nn.LayerNorm(d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return TinyNet().to(dtype)


def batches(n, seed=1, batch=16, d_in=6):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_in, 1, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(batch, d_in, generator=g)
        out.append((x, torch.sin(x @ w)))
    return out


def loss_fn(model, batch, dtype):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)


def make_wrapped(dtype, *, seed=0, lr=1e-2, scaler="default", **kw):
    model = make_model(seed, dtype)
    inner = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    if scaler == "default":
        scaler = (
            DynamicLossScaler(initial_scale_power=12, loss_scale_window=20)
            if dtype == torch.float16
            else None
        )
    return model, MixedPrecisionOptimizer(inner, scaler=scaler, dtype=dtype, module=model, **kw)


def train(model, opt, data, dtype, inject=None):
    """Run one step per batch; ``inject(step, model)`` may corrupt grads; returns per-step applied flags."""
    applied = []
    for step, batch in enumerate(data):
        opt.backward(loss_fn(model, batch, dtype))
        if inject is not None:
            inject(step, model)
        applied.append(opt.step())
        opt.zero_grad()
    return applied


def master_state(opt):
    """Deep copy of master weights and inner optimizer state, for bit-exact comparisons."""
    masters = [f.flat_master.clone() for f in opt.groups]
    state = {
        i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[m].items()}
        for i, m in enumerate(m for f in opt.groups for m in f.masters)
        if m in opt.state
    }
    return masters, state


def assert_same_state(a, b):
    (ma, sa), (mb, sb) = a, b
    for x, y in zip(ma, mb):
        assert torch.equal(x, y)
    assert sa.keys() == sb.keys()
    for pid in sa:
        assert sa[pid].keys() == sb[pid].keys()
        for k in sa[pid]:
            va, vb = sa[pid][k], sb[pid][k]
            assert torch.equal(va, vb) if torch.is_tensor(va) else va == vb
