"""``python -m ds_checkpoint``: export consolidated fp32 weights; convert DeepSpeed checkpoints."""

from __future__ import annotations

import argparse
import sys

from ._deepspeed_import import load_deepspeed
from ._errors import CheckpointError
from ._export import export_fp32


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m ds_checkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write the consolidated fp32 weights of a checkpoint (.safetensors)")
    exp.add_argument("ckpt_dir", help="save directory (with 'latest') or a tag directory")
    exp.add_argument("out", help="output .safetensors file")
    exp.add_argument("--tag", default=None, help="tag to export (default: the one in 'latest')")
    imp = sub.add_parser("import-deepspeed", help="convert a DeepSpeed ZeRO 0-3 checkpoint to this format")
    imp.add_argument("ds_dir", help="DeepSpeed save directory (with 'latest')")
    imp.add_argument("save_dir", help="where to write the converted checkpoint")
    imp.add_argument("--tag", default=None, help="DeepSpeed tag (default: the one in 'latest')")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            names = export_fp32(args.ckpt_dir, args.out, tag=args.tag)
            print(f"wrote {len(names)} tensors to {args.out}")
        else:
            ckpt = load_deepspeed(args.ds_dir, args.tag)
            path = ckpt.save(args.save_dir, ckpt.path.name)
            print(f"converted ZeRO-{ckpt.zero_stage} checkpoint ({ckpt.world_size} ranks) to {path}")
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
