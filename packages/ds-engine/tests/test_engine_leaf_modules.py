"""``zero_optimization.leaf_module`` at initialize, 2 real ranks (gloo): the section's modules become ZeRO-3
leaves as under DeepSpeed 0.19.8 (whose defaults are Hugging Face's sparse MoE blocks: a block of that
module-qualified class is a leaf with no marking by the user); a leaf is gathered in one fetch a forward,
its parameters carry ``ds_z3_leaf_module``. Below stage 3 the mark is set (as DeepSpeed does) and nothing
else. The Trainer on a real Mixtral is integration/frameworks/test_hf_moe.py's."""

from __future__ import annotations

from rank_testing import spawn


def _runs(rank: int, world: int, sections: list) -> list[dict]:
    import ds_engine
    import torch
    from ds_engine.topology import reset_topology
    from torch import nn

    class Block(nn.Module):
        """A gate and two branches (not in a list named like experts, so no leaf of its own)."""

        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(4, 2)
            self.branches = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            p = torch.softmax(self.gate(h), dim=-1)
            return h + sum(p[:, i : i + 1] * b(h) for i, b in enumerate(self.branches))

    # named as Hugging Face's, in its module: one of DeepSpeed's default leaf classes
    MixtralSparseMoeBlock = type("MixtralSparseMoeBlock", (Block,), {})
    MixtralSparseMoeBlock.__module__ = "transformers.models.mixtral.modeling_mixtral"
    MyMoe = type("MyMoe", (Block,), {})

    out = []
    for stage, section in sections:
        reset_topology()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), MixtralSparseMoeBlock(), MyMoe(), nn.Linear(4, 1))
        zero = {"stage": stage, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}
        if section is not None:
            zero["leaf_module"] = section
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
            "zero_optimization": zero,
        }
        engine, *_ = ds_engine.initialize(model=model, config=config)
        fetches: list[int] = []
        schedule = getattr(engine.optimizer, "schedule", None)
        if stage == 3:
            fetch = schedule.fetch
            schedule.fetch = lambda slots, f=fetch, seen=fetches: (seen.append(len(slots)), f(slots))[1]
        loss = engine(torch.randn(2, 4, generator=torch.Generator().manual_seed(rank))).square().mean()
        forward = list(fetches)
        engine.backward(loss)
        engine.step()
        out.append(
            {
                "flagged": [n for n, m in model.named_modules() if getattr(m, "_z3_leaf", False)],
                "leaf_params": sorted(
                    n for n, p in model.named_parameters() if hasattr(p, "ds_z3_leaf_module")
                ),
                "forward_fetches": forward,
            }
        )
    return out


def test_defaults_and_configured_classes_names_suffixes_are_leaves():
    sections = [
        (3, None),  # DeepSpeed's defaults: the Mixtral-named block
        (3, {"classes": "MyMoe"}),  # a class by name replaces the defaults
        (3, {"classes": [], "names": ["1"], "name_suffixes": ["2"]}),
        (3, {"classes": []}),  # defaults off: gathered per submodule
        (2, None),  # marked, no stage-3 hooks
    ]
    for r in spawn(_runs, 2, sections, timeout_s=120):
        defaults, by_class, by_name, off, stage2 = r
        assert defaults["flagged"] == ["1"] and by_class["flagged"] == ["2"] and off["flagged"] == []
        assert by_name["flagged"] == ["1", "2"]
        block = ["gate.bias", "gate.weight", "branches.0.bias", "branches.0.weight", "branches.1.bias"]
        block = sorted([*block, "branches.1.weight"])
        assert defaults["leaf_params"] == sorted(f"1.{n}" for n in block)
        assert by_class["leaf_params"] == sorted(f"2.{n}" for n in block)
        assert by_name["leaf_params"] == sorted(f"{i}.{n}" for i in (1, 2) for n in block)
        assert off["leaf_params"] == []
        # one fetch per module with parameters: the leaf block once, all six of its parameters
        assert defaults["forward_fetches"] == [2, 6, 2, 2, 2, 2]
        assert by_class["forward_fetches"] == [2, 2, 2, 2, 6, 2]
        assert by_name["forward_fetches"] == [2, 6, 6, 2]
        assert off["forward_fetches"] == [2] * 8
        assert stage2["flagged"] == ["1"] and stage2["leaf_params"] == []
