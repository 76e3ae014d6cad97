"""ds_optim.CONFIG_FIELDS is exactly what its from_config functions read from the typed sections."""

import ds_optim
import pytest
import torch
from ds_config import load_config
from ds_config.testing import ConfigReads


def test_config_fields_match_what_the_code_reads():
    reads = ConfigReads()
    cfg = reads.wrap(
        load_config(
            {
                "train_batch_size": 1,
                "optimizer": {"type": "Adam", "params": {"lr": 0.1}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
            }
        )
    )
    opt = ds_optim.optimizer_from_config([torch.nn.Parameter(torch.zeros(2))], cfg.optimizer)
    ds_optim.scheduler_from_config(opt, cfg.scheduler)
    reads.check("ds_optim", ds_optim.CONFIG_FIELDS)


def test_the_schedule_class_reads_the_same_section():
    reads = ConfigReads()
    cfg = reads.wrap(load_config({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {}}}))
    ds_optim.WarmupLR.from_config(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg.scheduler
    )
    assert reads.read_by("ds_optim") == {"scheduler.type", "scheduler.params"}


def test_a_duck_typed_section_is_refused():
    with pytest.raises(TypeError, match="SchedulerConfig"):
        ds_optim.scheduler_from_config(None, object())
