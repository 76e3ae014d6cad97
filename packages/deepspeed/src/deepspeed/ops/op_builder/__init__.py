"""DeepSpeed's ``deepspeed.ops.op_builder`` (issue 29 fills it in)."""
