"""DeepSpeed's ``deepspeed.git_version_info``: the version, git hash and installed ops of what runs.

``version`` is the DeepSpeed API level with ds's version as local label (``deepspeed.__version__``);
``git_hash``/``git_branch`` are ``"unknown"`` as in a DeepSpeed built from a release; ``installed_ops``
maps each DeepSpeed op to whether ds provides its feature (see ``deepspeed.ops.op_builder``).
"""

from __future__ import annotations

import torch

from deepspeed._version import __version__ as version
from deepspeed.ops.op_builder import INSTALLED_OPS

git_hash = "unknown"
git_branch = "unknown"
installed_ops = dict(INSTALLED_OPS)
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"
torch_info = {
    "version": torch.__version__,
    "bf16_support": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    "cuda_version": torch.version.cuda or "0.0",
    "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "0.0",
    "hip_version": torch.version.hip or "0.0",
}

__all__ = ["accelerator_name", "git_branch", "git_hash", "installed_ops", "torch_info", "version"]
