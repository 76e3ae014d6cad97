"""Sources (dict, path, base64), duplicate keys, nulls, strictness, "auto", deprecated forms."""

import base64
import json
import warnings

import pytest
from ds_config import ConfigError, ConfigWarning, load_config

CFG = {"train_batch_size": 16, "fp16": {"enabled": True}}


def test_from_dict_does_not_modify_callers_dict():
    given = {"train_batch_size": 16, "fp16": {"enabled": True, "loss_scale": None}}
    snapshot = json.dumps(given)
    cfg = load_config(given)
    assert cfg.fp16.enabled and json.dumps(given) == snapshot


def test_from_path(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CFG))
    assert load_config(path).fp16.enabled
    assert load_config(str(path)).train_batch_size == 16


@pytest.mark.parametrize("encode", [base64.urlsafe_b64encode, base64.b64encode])
def test_from_base64(encode):
    text = encode(
        json.dumps({**CFG, "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "x": "??>>"}}}).encode()
    )
    with pytest.raises(ConfigError, match="optimizer.params.x"):  # decoded fine; the bogus param is reported
        load_config(text.decode())
    assert load_config(base64.urlsafe_b64encode(json.dumps(CFG).encode()).decode()).train_batch_size == 16


def test_base64_without_padding():
    text = base64.urlsafe_b64encode(json.dumps({"train_batch_size": 1}).encode()).decode().rstrip("=")
    assert load_config(text).train_batch_size == 1


@pytest.mark.parametrize("source", ["missing.json", "/no/such/file.json", "configs/ds"])
def test_missing_file_is_one_line_naming_it(source):
    with pytest.raises(ConfigError) as info:
        load_config(source)
    text = str(info.value)
    assert text.splitlines() == [text]  # one line
    assert text.startswith(f"DeepSpeed config {source}: no such file (the working directory is ")


def test_directory_and_unreadable_file_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^DeepSpeed config .*: is a directory, not a JSON config file$"):
        load_config(tmp_path)
    binary = tmp_path / "ds.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"^DeepSpeed config .*ds\.json: not UTF-8 text \(.*\)$"):
        load_config(binary)


@pytest.mark.parametrize("source", ["not base64 !!", 42, None, ["train_batch_size"]])
def test_bad_source(source):
    with pytest.raises(ConfigError, match="expected a dict, a path"):
        load_config(source)


def test_duplicate_keys_in_file(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text(
        '{"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false}, "train_batch_size": 4}'
    )
    with pytest.raises(ConfigError, match=r"duplicate keys.*'enabled'") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_invalid_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"train_batch_size": 8,}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(path)


def test_top_level_must_be_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(path)


def test_null_behaves_as_absent():
    cfg = load_config({"train_batch_size": 8, "gradient_accumulation_steps": None, "fp16": None,
                       "zero_optimization": {"stage": 1, "reduce_bucket_size": None}, "optimizer": None,
                       "steps_per_print": None})  # fmt: skip
    assert cfg.gradient_accumulation_steps == 1 and not cfg.fp16.enabled
    assert cfg.zero_optimization.reduce_bucket_size == 500_000_000 and cfg.steps_per_print == 10


def test_unknown_keys_strict_with_did_you_mean():
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 8, "fp16": {"enabeld": True}, "zero_optimisation": {"stage": 1},
                     "gradient_clip": 1.0, "reduce_bucket_size": 10})  # fmt: skip
    text = str(info.value)
    assert "fp16.enabeld" in text and "did you mean 'fp16.enabled'" in text
    assert "did you mean 'zero_optimization'" in text
    assert "did you mean 'gradient_clipping'" in text
    assert "reduce_bucket_size = 10: unknown key; did you mean 'zero_optimization.reduce_bucket_size'" in text


def test_unknown_keys_non_strict_warn_and_are_ignored():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config({"train_batch_size": 8, "fp16": {"enabeld": True}, "sparse_attention": {
            "mode": "fixed", "num_random_blocks": 3}}, strict=False)  # fmt: skip
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert any("fp16.enabeld" in m for m in messages)
    assert any("sparse_attention.num_random_blocks" in m for m in messages)
    assert not cfg.fp16.enabled and cfg.sparse_attention.mode == "fixed"


def test_unsupported_deepspeed_keys_say_why():
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
                     "communication_data_type": "fp32"})  # fmt: skip
    text = str(info.value)
    assert "zero_optimization.offload_param" in text and "stage 3" in text
    assert "fp32_allreduce" in text


def test_auto_values_listed_all_at_once():
    hf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.0}}}  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_config(hf)
    assert info.value.paths == ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_clipping",
                                "optimizer.params.lr"]  # fmt: skip
    assert all("auto_values" in str(p) for p in info.value.problems)


def test_auto_values_resolved():
    hf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "bf16": {"enabled": "auto"}}  # fmt: skip
    cfg = load_config(hf, world_size=2, auto_values={"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                                      "optimizer.params.lr": 3e-4, "bf16.enabled": True})  # fmt: skip
    assert cfg.gradient_accumulation_steps == 2 and cfg.optimizer.params["lr"] == 3e-4 and cfg.bf16.enabled


def test_auto_resolved_value_is_still_validated():
    with pytest.raises(ConfigError, match="fp16.enabled"):
        load_config({"train_batch_size": 1, "fp16": {"enabled": "auto"}}, auto_values={"fp16.enabled": "yes"})


@pytest.mark.parametrize(("flag", "stage"), [(True, 1), (False, 0)])
def test_deprecated_boolean_zero_form(flag, stage):
    with pytest.warns(ConfigWarning, match="deprecated"):
        cfg = load_config({"train_batch_size": 8, "zero_optimization": flag, "optimizer": {"type": "Adam"}})
    assert cfg.zero_optimization.stage == stage


def test_boolean_zero_form_reads_allgather_size():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = load_config({"train_batch_size": 8, "zero_optimization": True, "allgather_size": 1000,
                           "optimizer": {"type": "Adam"}})  # fmt: skip
    assert cfg.zero_optimization.allgather_bucket_size == 1000


def test_cpu_offload_becomes_offload_optimizer():
    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": True},
                       "optimizer": {"type": "Adam"}})  # fmt: skip
    assert cfg.zero_optimization.offload_device == "cpu"
    assert cfg.zero_optimization.offload_optimizer.device == "cpu"


@pytest.mark.parametrize(("given", "stored"), [("warn", "Warn"), ("IGNORE", "Ignore"), ("Fail", "Fail")])
def test_tag_validation_case_insensitive(given, stored):
    assert (
        load_config(
            {"train_batch_size": 1, "checkpoint": {"tag_validation": given}}
        ).checkpoint.tag_validation
        == stored
    )


@pytest.mark.parametrize(
    ("fragment", "path"),
    [
        ({"train_batch_size": "32"}, "train_batch_size"),
        ({"train_batch_size": 32.5}, "train_batch_size"),
        ({"train_batch_size": True}, "train_batch_size"),
        ({"fp16": {"enabled": 1}}, "fp16.enabled"),
        ({"fp16": {"loss_scale": "x"}}, "fp16.loss_scale"),  # "3" is a number to DeepSpeed (recorded)
        ({"fp16": {"enabled": True, "initial_scale_power": 65}}, "fp16.initial_scale_power"),
        (
            {"zero_optimization": {"stage": 1, "reduce_bucket_size": True}},
            "zero_optimization.reduce_bucket_size",
        ),
        ({"amp": {"enabled": True, "opt_level": "O4"}}, "amp.opt_level"),
        ({"amp": {"enabled": True, "loss_scale": 0}}, "amp.loss_scale"),
        ({"bf16": {"enabled": True, "grad_accum_dtype": "fp16"}}, "bf16.grad_accum_dtype"),
        ({"optimizer": {"params": {}}}, "optimizer.type"),
        ({"optimizer": "Adam"}, "optimizer"),
        (
            {"sparse_attention": {"mode": "variable", "local_window_blocks": [4, 0]}},
            "sparse_attention.local_window_blocks[1]",
        ),
    ],
)
def test_types_and_bounds(fragment, path):
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 8, **fragment})
    assert path in info.value.paths, str(info.value)


def test_float_bucket_sizes_are_integers():
    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 1, "reduce_bucket_size": 2e8},
                       "optimizer": {"type": "Adam"}})  # fmt: skip
    assert cfg.zero_optimization.reduce_bucket_size == 200_000_000
    assert isinstance(cfg.zero_optimization.reduce_bucket_size, int)


def test_reference_defaults():
    cfg = load_config({"train_batch_size": 1})
    assert cfg.fp16.min_loss_scale == 1 and cfg.fp16.initial_scale_power == 32
    assert cfg.fp16.hysteresis == 2 and cfg.fp16.loss_scale_window == 1000 and cfg.fp16.dynamic_loss_scale
    assert cfg.zero_optimization.stage == 0 and cfg.zero_optimization.contiguous_gradients is False
    assert cfg.gradient_clipping == 0 and cfg.steps_per_print == 10 and cfg.precision == "fp32"
    assert cfg.sparse_attention is None and cfg.checkpoint.tag_validation == "Warn"


def test_config_error_is_value_error_with_problems():
    with pytest.raises(ValueError) as info:
        load_config({"train_batch_size": 0})
    assert isinstance(info.value, ConfigError)
    assert info.value.problems[0].value == 0


def test_amp_initialize_kwargs_pass_extra_keys_through():
    cfg = load_config({"train_batch_size": 1, "amp": {"enabled": True, "opt_level": "O2", "loss_scale": "dynamic",
                                                      "my_new_apex_option": [1, 2]}})  # fmt: skip
    assert cfg.amp.initialize_kwargs() == {"opt_level": "O2", "loss_scale": "dynamic", "num_losses": 1,
                                           "verbosity": 1, "max_loss_scale": 2.0**24,
                                           "my_new_apex_option": [1, 2]}  # fmt: skip


def test_config_error_from_one_message_is_one_problem():
    error = ConfigError("train_batch_size is required")
    assert len(error.problems) == 1 and error.paths == ["<root>"]
    assert str(error).startswith("1 problem in DeepSpeed config:")
    assert "train_batch_size is required" in str(error)


def test_config_error_survives_pickling():
    """A rank's error sent to another process (multiprocessing, a gathered object) keeps its problems."""
    import pickle

    with pytest.raises(ConfigError) as raised:
        load_config({"train_batch_size": "x", "gradient_clipping": -1}, world_size=1)
    original = raised.value
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is ConfigError
    assert copy.problems == original.problems and str(copy) == str(original)
    assert copy.source == original.source and copy.hint == original.hint
    # a problem without an offending value stays one after the round trip
    bare = pickle.loads(pickle.dumps(ConfigError("no value here")))
    assert str(bare.problems[0]) == "<root>: no value here"
