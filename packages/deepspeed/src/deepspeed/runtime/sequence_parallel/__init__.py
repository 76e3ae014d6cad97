"""DeepSpeed's ``deepspeed.runtime.sequence_parallel``: the Ulysses mpu (``parallel_state_sp``) and ALST (``ulysses_sp``)."""
