"""Train, checkpoint, and be lost mid-way through the next checkpoint (test_multihost_checkpoint_fault.py).

Usage: checkpoint_fault.py SAVE_DIR train    every rank trains ZeRO 2 (each rank writes its optimizer shard);
                                             after step 2 the job saves tag "a", after step 4 tag "b". In
                                             save "b" the last rank, once its own files are written, writes
                                             SAVE_DIR.writing and waits, so that its host is lost while the
                                             checkpoint is partly written (the others wait in the save).
       checkpoint_fault.py SAVE_DIR resume   one process: load_checkpoint(SAVE_DIR) (what `latest` names)
                                             and train one step.
Each writes SAVE_DIR.<mode>.json: the weights' digest after the save / after the load, and the tag loaded.
"""

import json
import os
import sys
import time
from pathlib import Path

import ds_checkpoint._save as save_impl
import ds_engine
import torch
import torch.distributed as dist

args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
save_dir, mode = Path(args[0]), args[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
world = int(os.environ.get("WORLD_SIZE", "1"))
config = {
    "train_batch_size": 4 * world,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 2},
}
engine, *_ = ds_engine.initialize(model=model, config=config)
rank = dist.get_rank()


def digest() -> float:
    return float(sum(p.detach().double().sum() for p in engine.module.parameters()))


def step(i: int) -> None:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(4, 16, generator=g), torch.randint(0, 4, (4,), generator=g)
    engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
    engine.step()


write_rank = save_impl._write_rank


def write_then_wait(tmp, r, *args):
    """The last rank, in save "b": its files written, the checkpoint not yet complete; its host is lost here."""
    report = write_rank(tmp, r, *args)
    if tmp.name == ".b.tmp" and r == dist.get_world_size() - 1:
        Path(f"{save_dir}.writing").write_text(str(sorted(p.name for p in tmp.iterdir())))
        time.sleep(600)
    return report


save_impl._write_rank = write_then_wait
out = {}
if mode == "train":
    for i in range(4):
        step(i)
        if i + 1 in (2, 4):
            tag = "a" if i + 1 == 2 else "b"
            engine.save_checkpoint(str(save_dir), tag=tag, client_state={"tag": tag})
            out[f"digest_{tag}"] = digest()
            if rank == 0:
                Path(f"{save_dir}.train.json").write_text(json.dumps(out))
else:
    path, client = engine.load_checkpoint(str(save_dir))
    out = {"path": str(path), "client": client, "digest": digest(), "global_steps": engine.global_steps}
    step(100)  # and it trains on
    Path(f"{save_dir}.resume.json").write_text(json.dumps(out))
