"""prefer_fused_kernel: a client Adam/AdamW that left the kernel to torch steps on the fused one."""

from __future__ import annotations

import logging

import ds_optim
import pytest
import torch
from ds_optim import _fused


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(5))]


def _count_fused(monkeypatch) -> list[int]:
    """Count calls of torch's fused AdamW kernel (the real kernel still runs)."""
    calls = [0]
    real = torch._fused_adamw_

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adamw_", counted)
    return calls


def _steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], n: int = 5) -> None:
    for i in range(n):
        for p in params:
            p.grad = torch.full_like(p, 0.1 * (i + 1)) + p.detach() * 0.01
        opt.step()


def test_default_adamw_runs_the_fused_kernel(monkeypatch, caplog):
    calls = _count_fused(monkeypatch)
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2)
    monkeypatch.setattr(_fused, "_logged", False)
    with caplog.at_level(logging.INFO, logger="ds_optim"):
        assert ds_optim.prefer_fused_kernel(opt)
        assert not ds_optim.prefer_fused_kernel(opt)  # already fused: nothing left to switch
    assert opt.param_groups[0]["fused"] is True
    assert [r.message.count("foreach=True") for r in caplog.records] == [1], "said once, with the opt-out"
    _steps(opt, params)
    assert calls[0] == 5


@pytest.mark.parametrize("explicit", [{"foreach": True}, {"foreach": False}, {"fused": False}])
def test_an_explicit_choice_is_kept(monkeypatch, explicit):
    calls = _count_fused(monkeypatch)
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2, **explicit)
    assert not ds_optim.prefer_fused_kernel(opt)
    assert opt.param_groups[0]["fused"] in (None, False)
    _steps(opt, params)
    assert calls[0] == 0


def test_other_optimizers_and_unsupported_tensors_are_left_alone():
    class MyAdam(torch.optim.AdamW):
        pass

    assert not ds_optim.prefer_fused_kernel(MyAdam(_params()))  # a subclass may rely on its path
    assert not ds_optim.prefer_fused_kernel(torch.optim.SGD(_params(), lr=0.1))
    meta = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    assert not ds_optim.prefer_fused_kernel(meta)
    assert meta.param_groups[0]["fused"] is None


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_matches_foreach_to_rounding(cls):
    """Same math: 20 steps on the fused kernel stay within rounding of the foreach path."""
    runs = []
    for switch in (False, True):
        params = _params()
        opt = cls(params, lr=1e-2, weight_decay=0.1)
        if switch:
            assert ds_optim.prefer_fused_kernel(opt)
        else:
            opt.param_groups[0]["foreach"] = True
        _steps(opt, params, 20)
        runs.append(torch.cat([p.detach().reshape(-1) for p in params]))
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-6, atol=1e-6)
