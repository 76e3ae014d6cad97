"""A Lightning training script in Lightning's documented DeepSpeed style, run unmodified on DeepSpeed and on ds.

    python lightning_script.py --stage 3 --devices 2 --steps 6 [--precision bf16-mixed] [--offload]
        [--save-dir DIR] [--every 3] [--resume CKPT_DIR] [--final-ckpt DIR] [--out losses.json]
    python lightning_script.py --strategy deepspeed_stage_3_offload_nvme --nvme-path DIR --devices 2 --steps 6

Lightning launches the other ranks itself (its subprocess launcher re-runs this file). Rank 0 prints, as
the last line of its stdout, ``{"losses": [...], "steps": [...]}``: the loss of each optimizer step,
averaged over all ranks (the global batch's mean loss, so runs at different rank counts compare).

The data is a fixed synthetic regression set and the per-rank batch is ``GLOBAL_BATCH // devices``.
Lightning's DistributedSampler shuffles it with one permutation per epoch (seed 0 + epoch) whatever the
rank count, and rank r takes every devices-th index from r: the ranks' micro-batches of step k together are
the permutation's ``[k*G, (k+1)*G)``, so a run at 1, 2 or 4 ranks trains on the same global batches.

The one adjustment for CPU (the same for DeepSpeed and ds, touching no ``deepspeed`` name): Lightning's
``DeepSpeedStrategy.setup_environment`` refuses any accelerator but CUDA; ``CPUDeepSpeedStrategy`` skips that
check and sets up the environment as the DDP strategy it derives from does. For the same reason a
registered strategy name (``--strategy deepspeed_stage_3_offload_nvme``) is applied as Lightning applies it,
its registered arguments (``StrategyRegistry[name]["init_params"]``) given to that class, plus the one a
user must add: ``nvme_path`` (Lightning's default is ``/local_nvme``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, StrategyRegistry
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GLOBAL_BATCH = 8
FEATURES = 16
SAMPLES_PER_EPOCH = 3 * GLOBAL_BATCH  # three optimizer steps per epoch


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy without its CUDA-only assumptions (CPU runs of DeepSpeed and ds alike):
    ``setup_environment`` accepts the CPU accelerator and gives each CPU device its local rank as index
    (Lightning checks the indices against the local ranks and hands ``root_device.index`` to the engine as the
    device rank; CPU devices carry none). The rest is Lightning's own code."""

    def setup_environment(self) -> None:
        self.parallel_devices = [torch.device("cpu", i) for i in range(len(self.parallel_devices or []))]
        DDPStrategy.setup_environment(self)


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 1e-2, width: int = 32, cpu_adam: bool = False) -> None:
        super().__init__()
        self.lr, self.cpu_adam = lr, cpu_adam
        self.net = nn.Sequential(
            nn.Linear(FEATURES, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
        )
        self.step_losses: list[tuple[int, float]] = []
        self.step_seconds: list[float] = []  # wall time of each training batch (forward, backward, step)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y)
        mean = loss.detach().float().clone()
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(mean)
            mean /= torch.distributed.get_world_size()
        self.step_losses.append((self.trainer.global_step, mean.item()))
        return loss

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        self.step_seconds.append(time.perf_counter() - self._t0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.cpu_adam:  # Lightning's documented optimizer for an offloaded one (DeepSpeed refuses torch's)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=self.lr, weight_decay=0.01, adamw_mode=True)
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES_PER_EPOCH, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(SAMPLES_PER_EPOCH, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=2, choices=[0, 1, 2, 3])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    p.add_argument(
        "--offload", action="store_true", help="offload the optimizer (and at ZeRO-3 the parameters)"
    )
    p.add_argument(
        "--strategy", default=None, help="a registered DeepSpeed strategy name (instead of --stage/--offload)"
    )
    p.add_argument("--nvme-path", default=None, help="the strategy's nvme_path (created if missing)")
    p.add_argument("--save-dir", default=None, help="ModelCheckpoint directory (saves every --every steps)")
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--resume", default=None, help="a Lightning DeepSpeed checkpoint directory to resume from")
    p.add_argument("--final-ckpt", default=None, help="trainer.save_checkpoint(PATH) after fit")
    p.add_argument("--width", type=int, default=32, help="hidden width (the benchmark uses a larger one)")
    p.add_argument("--ddp", action="store_true", help="Lightning's DDP strategy instead (benchmark baseline)")
    p.add_argument("--out", default=None, help="also write rank 0's losses to this JSON file")
    args = p.parse_args()

    pl.seed_everything(0, workers=True)
    if args.devices > 1 and GLOBAL_BATCH % args.devices:
        raise SystemExit(f"--devices must divide the global batch {GLOBAL_BATCH}")
    if args.strategy:
        registered = StrategyRegistry[args.strategy]
        if not issubclass(registered["strategy"], DeepSpeedStrategy):
            raise SystemExit(f"--strategy {args.strategy} is not a DeepSpeed strategy")
        kwargs = dict(registered["init_params"])
    else:
        kwargs = {
            "stage": args.stage,
            "offload_optimizer": args.offload,
            "offload_parameters": args.offload and args.stage == 3,
        }
    if args.nvme_path:
        kwargs["nvme_path"] = os.path.abspath(args.nvme_path)
        os.makedirs(kwargs["nvme_path"], exist_ok=True)
    strategy = (
        "ddp"
        if args.ddp
        else CPUDeepSpeedStrategy(**kwargs, logging_batch_size_per_gpu=GLOBAL_BATCH // args.devices)
    )
    callbacks = []
    if args.save_dir:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.save_dir, every_n_train_steps=args.every, save_top_k=-1, save_last=False
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.steps,
        callbacks=callbacks,
        enable_checkpointing=bool(args.save_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    model = Regressor(
        width=args.width,
        cpu_adam=strategy != "ddp"
        and strategy.config["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none",
    )
    loader = DataLoader(dataset(), batch_size=GLOBAL_BATCH // args.devices, shuffle=False)
    trainer.fit(model, loader, ckpt_path=args.resume)
    if args.final_ckpt:
        trainer.save_checkpoint(args.final_ckpt)
    if trainer.global_rank == 0:
        steps, losses = zip(*model.step_losses) if model.step_losses else ((), ())
        result = {"steps": list(steps), "losses": list(losses), "world_size": trainer.world_size}
        result["step_seconds"] = model.step_seconds
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
