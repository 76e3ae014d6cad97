"""DeepSpeed's ``deepspeed.runtime``: a package of module paths, each mapped onto the ds implementation."""
