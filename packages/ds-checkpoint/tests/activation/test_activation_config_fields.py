"""ds_checkpoint.CONFIG_FIELDS is exactly what configure() reads from the typed section."""

import ds_checkpoint
from ds_checkpoint.activation import configure
from ds_config import load_config
from ds_config.testing import ConfigReads


def test_config_fields_match_what_the_code_reads():
    reads = ConfigReads()
    section = {"partition_activations": True, "contiguous_memory_optimization": True, "number_checkpoints": 2}
    configure(
        None,
        deepspeed_config=reads.wrap(
            load_config({"train_batch_size": 1, "activation_checkpointing": section})
        ),
    )
    configure(None, deepspeed_config=load_config({"train_batch_size": 1}))  # leave the defaults behind
    reads.check("ds_checkpoint", ds_checkpoint.CONFIG_FIELDS)
