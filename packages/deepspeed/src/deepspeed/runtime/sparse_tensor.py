"""DeepSpeed's ``deepspeed.runtime.sparse_tensor``: ``SparseTensor`` is not in ds; it fails at use, naming it.

DeepSpeed wraps a sparse embedding gradient in ``SparseTensor`` to all-gather its rows; ds reduces
row-sparse gradients inside ds_zero (``sparse_gradients: true``) without such a container.
"""

from ds_engine._missing import missing_class

SparseTensor = missing_class(
    __name__,
    "SparseTensor",
    "DeepSpeed's SparseTensor container for sparse gradients",
    "ds reduces row-sparse embedding gradients itself (config sparse_gradients: true); use torch sparse tensors.",
)

__all__ = ["SparseTensor"]
