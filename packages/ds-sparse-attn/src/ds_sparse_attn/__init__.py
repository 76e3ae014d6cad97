"""Block-sparse attention (fixed, BigBird, Longformer, variable layouts) on CPU and CUDA.

Layouts reproduce DeepSpeed 0.14's sparsity configs; `SparseSelfAttention` computes attention only on the
layout's blocks (torch's fused CPU attention kernel over groups of rows sharing their key blocks on CPU;
compiled FlexAttention with a BlockMask from the layout, or flash-style Numba kernels, on GPUs), forward and
backward.
"""

from ._attention import BertSparseSelfAttention, SparseSelfAttention
from ._config_fields import CONFIG_FIELDS
from ._from_config import from_config
from ._layouts import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)
from ._plot import plot_layout
from ._utils import SparseAttentionUtils

__version__ = "0.1.0"
__all__ = [
    "CONFIG_FIELDS",
    "BSLongformerSparsityConfig",
    "BertSparseSelfAttention",
    "BigBirdSparsityConfig",
    "DenseSparsityConfig",
    "FixedSparsityConfig",
    "LocalSlidingWindowSparsityConfig",
    "SparseAttentionUtils",
    "SparseSelfAttention",
    "SparsityConfig",
    "VariableSparsityConfig",
    "__version__",
    "from_config",
    "plot_layout",
]
