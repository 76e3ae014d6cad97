"""DeepSpeed's ``deepspeed.runtime.sequence_parallel``: sequence parallelism is not in ds (see ``ulysses_sp``)."""
