"""The version of ds's ``deepspeed``: the DeepSpeed API level mapped, with the ds release as local label."""

__version__ = "0.19.8+ds.0.1.0"
