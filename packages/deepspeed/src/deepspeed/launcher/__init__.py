"""DeepSpeed's ``deepspeed.launcher``: ``runner`` (the ``deepspeed`` command's parser), over ds-launch."""
