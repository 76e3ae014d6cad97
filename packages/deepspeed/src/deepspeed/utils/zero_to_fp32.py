"""DeepSpeed's ``deepspeed.utils.zero_to_fp32``: a full fp32 state dict from a ZeRO checkpoint.

Filled in by the framework work (issue 28): the functions read ds checkpoints through ds_checkpoint.
"""
