"""configure(): defaults, config sources, keyword overrides and the errors that say what to fix."""

import json
import types

import pytest
from ds_checkpoint.activation import (
    ActivationCheckpointingConfigError,
    ActivationCheckpointingSettings,
    configure,
    is_configured,
)
from ds_config import ActivationCheckpointingConfig, DSConfig


class WorldMPU:
    """DeepSpeed's mpu protocol over a group of one (no torch.distributed needed)."""

    def get_model_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_group(self):
        return None


def test_is_configured_only_after_configure():
    assert not is_configured()
    configure(None)
    assert is_configured()


def test_defaults_match_the_reference():
    assert configure(None) == ActivationCheckpointingSettings(
        partition_activations=False,
        cpu_checkpointing=False,
        contiguous_memory_optimization=False,
        number_checkpoints=None,
        synchronize_checkpoint_boundary=False,
        profile=False,
    )


def test_config_dict_then_keyword_overrides():
    cfg = {
        "activation_checkpointing": {
            "partition_activations": True,
            "cpu_checkpointing": True,
            "profile": True,
        }
    }
    settings = configure(WorldMPU(), deepspeed_config=cfg, checkpoint_in_cpu=False, synchronize=True)
    assert settings.partition_activations and settings.profile and settings.synchronize_checkpoint_boundary
    assert not settings.cpu_checkpointing  # an explicit keyword beats the file


def test_configure_resets_to_defaults_first():
    configure(None, partition_activations=True, profile=True)
    assert configure(None, synchronize=True) == ActivationCheckpointingSettings(
        synchronize_checkpoint_boundary=True
    )


def test_json_path(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": True}})
    )
    assert configure(None, deepspeed_config=str(path)).cpu_checkpointing


def test_from_config_with_the_real_section_model():
    section = ActivationCheckpointingConfig(
        partition_activations=True, contiguous_memory_optimization=True, number_checkpoints=4, profile=True
    )
    settings = configure(None, deepspeed_config=section)
    assert settings == ActivationCheckpointingSettings(
        partition_activations=True, contiguous_memory_optimization=True, number_checkpoints=4, profile=True
    )
    whole = DSConfig(activation_checkpointing=section)
    assert configure(None, deepspeed_config=whole) == settings
    assert ActivationCheckpointingSettings.from_config(section) == settings
    with pytest.raises(TypeError, match="ActivationCheckpointingConfig"):
        configure(None, deepspeed_config=types.SimpleNamespace(activation_checkpointing=section))


def test_unknown_key_names_its_path_and_the_closest_key():
    cfg = {"activation_checkpointing": {"partitioned_activations": True}}
    with pytest.raises(
        ActivationCheckpointingConfigError, match=r"activation_checkpointing\.partition_activations"
    ):
        configure(None, deepspeed_config=cfg)


def test_contiguous_without_partition_is_rejected():
    with pytest.raises(
        ActivationCheckpointingConfigError, match="only available with partitioned activations"
    ):
        configure(None, contiguous_checkpointing=True, num_checkpoints=2)


def test_contiguous_without_number_checkpoints_is_rejected():
    cfg = {
        "activation_checkpointing": {"partition_activations": True, "contiguous_memory_optimization": True}
    }
    with pytest.raises(ActivationCheckpointingConfigError, match="number_checkpoints"):
        configure(None, deepspeed_config=cfg)
    with pytest.raises(ActivationCheckpointingConfigError, match="number_checkpoints"):
        configure(None, partition_activations=True, contiguous_checkpointing=True)


@pytest.mark.parametrize("value", [0, -3, 2.5, "4", True])
def test_bad_number_checkpoints(value):
    with pytest.raises(ActivationCheckpointingConfigError, match="positive integer"):
        configure(None, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=value)


def test_non_boolean_flag_is_rejected():
    with pytest.raises(ActivationCheckpointingConfigError, match="profile' must be true or false"):
        configure(None, deepspeed_config={"activation_checkpointing": {"profile": "yes"}})


def test_mpu_without_the_protocol_is_rejected_at_configure():
    with pytest.raises(TypeError, match="get_model_parallel_rank"):
        configure(object())


def test_megatron_tensor_parallel_spelling_is_accepted():
    mpu = types.SimpleNamespace(
        get_tensor_model_parallel_rank=lambda: 0,
        get_tensor_model_parallel_world_size=lambda: 1,
        get_tensor_model_parallel_group=lambda: None,
    )
    configure(mpu, partition_activations=True)


def test_failed_configure_keeps_the_previous_settings():
    configure(None, profile=True)
    with pytest.raises(ActivationCheckpointingConfigError):
        configure(None, contiguous_checkpointing=True)
    from ds_checkpoint.activation import _state

    assert _state.runtime().settings.profile
