"""Train a small byte-level GPT on the Python standard library's source with ds-engine.

ZeRO stage 2, bf16 on CPU (fp16 with dynamic loss scaling on CUDA), block-sparse causal attention from
the config's ``sparse_attention`` section, activation checkpointing of every transformer block, a
WarmupDecayLR schedule, a checkpoint every ``--save-every`` steps and ``--resume`` at any world size.

    ds-launch --num_procs 2 examples/train_gpt.py                 # built-in defaults, a few minutes
    ds-launch --num_procs 2 examples/train_gpt.py --resume        # continue from runs/gpt/checkpoints
    ds-launch --hostfile hosts --launcher mpi examples/train_gpt.py --model-size medium

On rank 0 it shows a progress bar, the engine's ``steps_per_print`` lines, and at the end writes a
loss-curve PNG, ``metrics.json`` and the generated sample (``sample.txt``, also printed) into ``--out``,
and prints the last checkpoint.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ds_checkpoint.activation
import ds_engine
import torch
import torch.distributed as dist
from ds_config import load_config
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpt.py and data.py sit next to this script
from data import Corpus, WindowSampler, eval_windows, load_corpus, nats_to_bits, unigram_entropy_nats  # noqa: E402
from gpt import GPT, MODEL_PRESETS, GPTConfig  # noqa: E402

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "gpt_zero2.json"
DEFAULT_STEPS = 300
EVAL_WINDOWS = 64  # validation windows per evaluation, split across ranks
SCHEDULES_WITH_TOTAL = ("WarmupDecayLR", "WarmupCosineLR")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--model-size",
        choices=sorted(MODEL_PRESETS),
        default="small",
        help="preset (n_layer, n_head, n_embd): " + ", ".join(f"{k}={v}" for k, v in MODEL_PRESETS.items()),
    )
    p.add_argument("--n-layer", type=int, help="override the preset's number of blocks")
    p.add_argument("--n-head", type=int, help="override the preset's attention heads")
    p.add_argument("--n-embd", type=int, help="override the preset's embedding width")
    p.add_argument(
        "--seq-len", type=int, default=128, help="bytes per training sequence (multiple of the block)"
    )
    p.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help="total optimizer steps (a resumed run stops here)"
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="DeepSpeed JSON config")
    p.add_argument("--out", type=Path, default=Path("runs/gpt"), help="checkpoints, loss curve and metrics")
    p.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in OUT/checkpoints"
    )
    p.add_argument(
        "--eval-every", type=int, default=50, help="validation loss every N steps (and at the end)"
    )
    p.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (and at the end)")
    p.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp16", "fp32"],
        default="auto",
        help="auto: the config's own choice, except that the built-in config uses fp16 on CUDA",
    )
    p.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each block in backward (options from the config's activation_checkpointing)",
    )
    p.add_argument("--corpus-bytes", type=int, default=3_000_000, help="read at most this much stdlib source")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--prompt", default="def ", help="start of the generated sample")
    p.add_argument("--sample-bytes", type=int, default=300, help="length of the generated sample (0: none)")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # passed by ds-launch
    args = p.parse_args(argv)
    if not args.config.is_file():  # one line, not a traceback from json.loads(read_text())
        p.exit(1, f"{p.prog}: --config {args.config}: no such file\n")
    for name in ("steps", "seq_len", "eval_every", "save_every", "corpus_bytes"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def model_config(args: argparse.Namespace) -> GPTConfig:
    n_layer, n_head, n_embd = MODEL_PRESETS[args.model_size]
    return GPTConfig(
        n_layer=args.n_layer or n_layer,
        n_head=args.n_head or n_head,
        n_embd=args.n_embd or n_embd,
        block_size=args.seq_len,
    )


def ds_config_dict(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, Any], list[str]]:
    """The DeepSpeed config this run uses, and notes on what the command line changed in it."""
    cfg = json.loads(args.config.read_text())
    notes = []
    precision = args.precision
    if precision == "auto" and args.config.resolve() == DEFAULT_CONFIG:
        precision = "fp16" if device.type == "cuda" else "bf16"  # bf16 on CPU, fp16 with loss scaling on GPUs
    if precision != "auto":
        cfg.setdefault("fp16", {})["enabled"] = precision == "fp16"
        cfg.setdefault("bf16", {})["enabled"] = precision == "bf16"
        notes.append(f"precision {precision}")
    params = cfg.get("scheduler", {}).get("params", {})
    if cfg.get("scheduler", {}).get("type") in SCHEDULES_WITH_TOTAL:
        params["total_num_steps"] = args.steps  # the schedule ends where the run does
        if params.get("warmup_num_steps", 0) > args.steps // 5:
            params["warmup_num_steps"] = max(1, args.steps // 5)
        notes.append(f"scheduler total_num_steps={args.steps} warmup_num_steps={params['warmup_num_steps']}")
    return cfg, notes


def build_model(args: argparse.Namespace, cfg: dict[str, Any], world_size: int) -> GPT:
    """The GPT with sparse attention from the config's ``sparse_attention`` section."""
    parsed = load_config(copy.deepcopy(cfg), world_size=world_size)
    if parsed.sparse_attention is None:
        raise SystemExit(
            f'{args.config} has no "sparse_attention" section: this example needs one, e.g. '
            '{"mode": "fixed", "block": 16, "attention": "unidirectional"}'
        )
    gpt_cfg = model_config(args)
    block = parsed.sparse_attention.block
    if args.seq_len % block:
        raise SystemExit(f"--seq-len {args.seq_len} must be a multiple of sparse_attention.block={block}")
    checkpoint_fn = ds_checkpoint.activation.checkpoint if args.activation_checkpointing else None
    return GPT(
        gpt_cfg,
        lambda: ds_engine.sparse_attention.sparse_self_attention(
            parsed, gpt_cfg.n_head, seed=args.seed, max_seq_length=args.seq_len
        ),
        checkpoint_fn,
    )


@dataclass
class History:
    """Loss curves ``[[step, loss], ...]``, kept in the checkpoint's client_state across resumes."""

    train: list[list[float]] = field(default_factory=list)
    val: list[list[float]] = field(default_factory=list)


@torch.no_grad()
def evaluate(
    model: GPT, windows: torch.Tensor, rank: int, world_size: int, micro_batch: int, device: torch.device
) -> float:
    """Mean validation loss in nats per byte over all ``windows``, each rank evaluating its share."""
    model.eval()
    mine = windows[rank::world_size].to(device)  # (n_rank, T + 1)
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, count)
    for chunk in mine.split(micro_batch):
        total[0] += model(chunk[:, :-1], chunk[:, 1:]).double() * len(chunk)
        total[1] += len(chunk)
    model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
    return float(total[0] / total[1])


def mean_over_ranks(loss: torch.Tensor) -> float:
    value = loss.detach().float().clone()
    if dist.is_initialized():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value)


def resume(engine: Any, ckpt_dir: Path, sampler: WindowSampler, history: History) -> str | None:
    """Load the latest checkpoint (saved at any world size); restore the data position and curves."""
    path, client = engine.load_checkpoint(ckpt_dir)
    if path is None:
        return None
    sampler.position = int(client["data_position"])
    history.train, history.val = client.get("train_curve", []), client.get("val_curve", [])
    return path


def save(engine: Any, ckpt_dir: Path, sampler: WindowSampler, history: History) -> Path:
    tag = f"global_step{engine.global_steps}"
    engine.save_checkpoint(
        ckpt_dir,
        tag=tag,
        client_state={
            "data_position": sampler.position,
            "train_curve": history.train,
            "val_curve": history.val,
        },
    )
    return ckpt_dir / tag


def plot_losses(history: History, baseline_nats: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    if history.train:
        steps, losses = zip(*history.train)
        ax.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="train (per step)")
        ax.plot(steps, _ema(losses, 0.9), color="tab:blue", label="train (EMA 0.9)")
    if history.val:
        steps, losses = zip(*history.val)
        ax.plot(steps, losses, "o-", color="tab:orange", label="validation")
    ax.axhline(baseline_nats, color="gray", linestyle="--", label=f"unigram baseline {baseline_nats:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title("byte-level GPT on the Python standard library")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ema(values: tuple[float, ...], beta: float) -> list[float]:
    """Exponential moving average, bias-corrected as Adam's moments so it starts at the first value."""
    out, avg = [], 0.0
    for t, v in enumerate(values, start=1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**t))
    return out


def sample_text(model: GPT, prompt: str, num_bytes: int, device: torch.device, seed: int) -> str:
    model.eval()
    idx = torch.tensor([list(prompt.encode())], dtype=torch.long, device=device)  # (1, T)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(idx, num_bytes, temperature=0.8, top_k=40, generator=gen)
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")


class Trainer:
    """One run: the engine, the data stream, the loop and what rank 0 reports."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        topology = ds_engine.init_distributed()
        _share_cpu_threads(topology)
        self.rank, self.world_size, self.device = topology.rank, topology.world_size, topology.device
        cfg, self.config_notes = ds_config_dict(args, self.device)
        torch.manual_seed(args.seed)  # the same initial weights on every rank (rank 0's are broadcast anyway)
        model = build_model(args, cfg, self.world_size)
        self.engine, _, _, _ = ds_engine.initialize(args=args, model=model, config=cfg)
        self.model: GPT = self.engine.module
        self.micro_batch = self.engine.train_micro_batch_size_per_gpu()
        self.gas = self.engine.gradient_accumulation_steps()
        self.corpus: Corpus = load_corpus(args.corpus_bytes)
        self.sampler = WindowSampler(self.corpus.train, args.seq_len, args.seed)
        self.val = eval_windows(self.corpus.val, args.seq_len, EVAL_WINDOWS)
        self.baseline = unigram_entropy_nats(self.corpus.val)
        self.history = History()
        self.ckpt_dir = args.out / "checkpoints"
        self.last_ckpt: Path | None = None
        self.tokens_per_step = self.engine.train_batch_size() * args.seq_len

    def log(self, msg: str) -> None:
        if self.rank == 0:
            tqdm.write(msg, file=sys.stderr)

    def describe(self) -> None:
        a, n_params = self.args, sum(p.numel() for p in self.model.parameters())
        mc, sa = self.model.config, self.engine.ds_config.sparse_attention
        self.log(
            f"corpus: {len(self.corpus.train):,} train / {len(self.corpus.val):,} validation bytes from "
            f"{self.corpus.num_files} files in {self.corpus.root}"
        )
        self.log(
            f"model: {n_params / 1e6:.2f}M parameters, n_layer={mc.n_layer} n_head={mc.n_head} "
            f"n_embd={mc.n_embd} seq_len={a.seq_len}; attention {sa.mode} layout, block {sa.block}; "
            f"activation checkpointing {'on' if a.activation_checkpointing else 'off'}"
        )
        self.log(
            f"batch: {self.micro_batch} sequences x {self.gas} accumulation x {self.world_size} ranks = "
            f"{self.engine.train_batch_size()} sequences = {self.tokens_per_step:,} tokens per step; "
            f"dtype {self.engine.parts.dtype}; ZeRO stage {self.engine.ds_config.zero_optimization.stage}"
        )
        if self.config_notes:
            self.log(f"config {a.config} with: " + "; ".join(self.config_notes))
        self.log(
            f"unigram baseline (byte entropy of the validation text): {self.baseline:.4f} nats = "
            f"{nats_to_bits(self.baseline):.4f} bits/byte"
        )

    def train_step(self) -> float:
        losses = []
        for _ in range(self.gas):
            x, y = self.sampler.next_batch(self.rank, self.world_size, self.micro_batch)
            loss = self.engine(x.to(self.device), y.to(self.device))
            self.engine.backward(loss)
            self.engine.step()
            losses.append(loss)
        return mean_over_ranks(torch.stack(losses).mean())

    def run(self) -> dict[str, Any]:
        args = self.args
        if args.resume:
            path = resume(self.engine, self.ckpt_dir, self.sampler, self.history)
            if path is None:
                raise SystemExit(f"--resume: no checkpoint in {self.ckpt_dir} (run without --resume first)")
            self.last_ckpt = Path(path)
            self.log(
                f"resumed from {path} at step {self.engine.global_steps} "
                f"(data position {self.sampler.position:,} windows)"
            )
        self.describe()
        start_step, first_loss = self.engine.global_steps, None
        train_s, train_cpu_s, wall_start = 0.0, 0.0, time.perf_counter()
        bar = tqdm(
            total=args.steps,
            initial=start_step,
            disable=self.rank != 0,
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5 if sys.stderr.isatty() else 15.0,
        )
        # ds_engine logs through tqdm.write (its AboveProgressBars handler): its lines go above the bar.
        while self.engine.global_steps < args.steps:
            t0, c0 = time.perf_counter(), time.process_time()
            loss = self.train_step()
            train_s += time.perf_counter() - t0
            train_cpu_s += time.process_time() - c0
            step = self.engine.global_steps
            first_loss = loss if first_loss is None else first_loss
            self.history.train.append([step, loss])
            tok_s = (step - start_step) * self.tokens_per_step / train_s
            bar.set_postfix(
                loss=f"{loss:.3f}",
                tok_s=f"{tok_s:,.0f}",
                scale=f"{self.engine.loss_scale:g}",
                refresh=False,
            )
            bar.update(1)
            self.maybe_evaluate(step)
            if step % args.save_every == 0 or step == args.steps:
                self.last_ckpt = save(self.engine, self.ckpt_dir, self.sampler, self.history)
        bar.close()
        if not self.history.val or self.history.val[-1][0] != self.engine.global_steps:
            self.maybe_evaluate(self.engine.global_steps, force=True)
        steps_run = self.engine.global_steps - start_step
        return {
            "start_step": start_step,
            "final_step": self.engine.global_steps,
            "world_size": self.world_size,
            "first_train_loss": first_loss,
            "final_train_loss": self.history.train[-1][1] if steps_run else None,
            "final_val_loss_nats": self.history.val[-1][1],
            "unigram_baseline_nats": self.baseline,
            "train_seconds": train_s,
            "rank0_train_cpu_seconds": train_cpu_s,
            "wall_seconds": time.perf_counter() - wall_start,
            "tokens_per_second": steps_run * self.tokens_per_step / train_s if steps_run else None,
            "tokens_per_step": self.tokens_per_step,
            "skipped_steps": self.engine.skipped_steps,
            "last_checkpoint": str(self.last_ckpt) if self.last_ckpt else None,
            "train_curve": self.history.train,
            "val_curve": self.history.val,
        }

    def maybe_evaluate(self, step: int, force: bool = False) -> None:
        if force or step % self.args.eval_every == 0:
            val = evaluate(self.model, self.val, self.rank, self.world_size, self.micro_batch, self.device)
            self.history.val.append([step, val])
            self.log(
                f"step {step}: validation loss {val:.4f} nats = {nats_to_bits(val):.4f} bits/byte "
                f"(unigram baseline {self.baseline:.4f} nats)"
            )

    def finish(self, metrics: dict[str, Any]) -> None:
        """Rank 0: the PNG, metrics.json, a generated sample and the summary."""
        # every rank samples (same seed, same weights, same bytes): at ZeRO stage 3 a forward is collective
        text = None
        if self.args.sample_bytes > 0:
            text = sample_text(
                self.model, self.args.prompt, self.args.sample_bytes, self.device, self.args.seed
            )
        if self.rank != 0:
            return
        out = self.args.out
        png = out / "loss_curve.png"
        plot_losses(self.history, self.baseline, png)
        val = metrics["final_val_loss_nats"]
        if text is not None:
            (out / "sample.txt").write_text(text, encoding="utf-8")
            print(
                f"\n--- sample (temperature 0.8, top-k 40, prompt {self.args.prompt!r}) ---\n{text}\n---",
                flush=True,
            )
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        tok_s = metrics["tokens_per_second"]
        print(
            f"validation loss {val:.4f} nats = {nats_to_bits(val):.4f} bits/byte; unigram baseline "
            f"{self.baseline:.4f} nats = {nats_to_bits(self.baseline):.4f} bits/byte "
            f"({val / self.baseline:.0%} of it)",
            flush=True,
        )
        print(
            f"steps {metrics['start_step']} -> {metrics['final_step']} on {self.world_size} ranks in "
            f"{metrics['wall_seconds']:.0f} s" + (f", {tok_s:,.0f} tokens/s" if tok_s else ""),
            flush=True,
        )
        print(
            f"loss curve: {png}\nmetrics: {out / 'metrics.json'}\n"
            + (f"sample: {out / 'sample.txt'}\n" if text is not None else "")
            + f"last checkpoint: {self.last_ckpt}",
            flush=True,
        )


def _share_cpu_threads(topology: Any) -> None:
    """On CPU, split the cores between this host's ranks unless OMP_NUM_THREADS says otherwise.

    torch starts one thread per core in every process; ranks sharing a host would oversubscribe it.
    """
    if topology.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // topology.local_world_size))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(args)
    metrics = trainer.run()
    trainer.finish(metrics)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
