"""DeepSpeed's ``deepspeed.runtime.activation_checkpointing`` (issue 29 fills it in)."""
