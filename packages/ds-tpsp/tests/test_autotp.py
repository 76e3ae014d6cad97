"""AutoTP training of a tiny Hugging Face Llama on 2 real gloo ranks: losses equal to the unsplit model's,
the split each rule asks for, whole weights back, and the errors for what cannot be split. One 2-rank run
makes every check (tp_workers.everything); the tests read its results."""

from __future__ import annotations

import pytest
import tp_workers as w
from rank_testing import spawn

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ran():
    return spawn(w.everything, 2, timeout_s=600)


def test_tp2_losses_equal_the_unsplit_models_and_the_llama_split(ran):
    for out in ran:
        reference = out["reference"][0]
        losses, layers, source, grad_fn = out["tp2"]
        assert losses == pytest.approx(reference, rel=1e-5) and source == "the model's Hugging Face tp_plan"
        attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
        assert [layers[attn + p] for p in ("q_proj", "k_proj", "v_proj", "o_proj")] == ["column"] * 3 + [
            "row"
        ]
        assert [layers[mlp + p] for p in ("gate_proj", "up_proj", "down_proj")] == ["column", "column", "row"]
        assert layers["lm_head"] == "column+gather" and len(layers) == 15 and "Overlapped" not in grad_fn


def test_preset_llama_splits_the_same_layers_and_leaves_the_head_whole(ran):
    losses, layers, source, _ = ran[0]["preset"]
    assert losses == pytest.approx(ran[0]["reference"][0], rel=1e-5) and source == "preset 'llama'"
    assert "lm_head" not in layers and len(layers) == 14


def test_tp_overlap_comm_takes_the_overlapped_backward_with_the_same_losses(ran):
    losses, _, _, grad_fn = ran[0]["overlap"]
    assert losses == pytest.approx(ran[0]["reference"][0], rel=1e-5)
    assert grad_fn == "_OverlappedColumnLinearBackward"


@pytest.mark.parametrize(
    ("case", "words"),
    [
        (0, ["model.layers.0.self_attn", "num_key_value_heads (1)", "autotp_size 2"]),
        (1, ["model.layers.0.self_attn", "num_attention_heads (3)", "autotp_size 2"]),
        (2, ["model.layers.0.mlp.gate_proj", "(63)", "autotp_size 2"]),
    ],
)
def test_sizes_that_do_not_split_are_one_error_naming_module_and_numbers(ran, case, words):
    message, untouched = ran[0]["errors"][str(case)]
    assert message is not None and all(word in message for word in words), message
    assert untouched


def test_full_weights_equal_the_unsplit_model_and_load_back(ran):
    assert [out["round_trip"] for out in ran] == [(True, True), (True, True)]


def test_config_fields_are_the_reads_the_code_makes(ran):
    from ds_tpsp import CONFIG_FIELDS

    assert ran[0]["config"]["read"] == sorted(CONFIG_FIELDS)


def test_layer_specs_and_use_default_specs_merge_with_the_preset(ran):
    got = ran[0]["config"]  # partition_config's head rule first, then the preset's (use_default_specs true)
    assert got["source"] == "partition_config then preset 'llama'" and len(got["layers"]) == 15
    assert got["layers"]["lm_head"] == "column+gather"


def test_use_default_specs_false_takes_the_layer_specs_alone(ran):
    assert ran[0]["config"]["alone"] == {"lm_head": "column+gather"}


def test_tp_overlap_comm_from_the_config(ran):
    assert ran[0]["config"]["grad_fn"] == "_OverlappedColumnLinearBackward"


def test_strict_mode_names_the_weight_no_spec_matches(ran):
    got = ran[0]["config"]["strict"]
    assert got is not None and "strict_mode" in got and "lm_head.weight" in got


def test_vocab_parallel_lm_head_from_the_config_splits_the_head_over_the_vocabulary(ran):
    assert ran[0]["config"]["vocab"] == "vocab"


def test_vocab_parallel_head_trains_with_the_unsplit_models_losses(ran):
    for out in ran:
        got = out["vocab"]
        losses, layers, _, _ = got["untied"]
        assert losses == pytest.approx(out["reference"][0], rel=1e-5)
        assert layers["lm_head"] == "vocab" and "model.embed_tokens" not in layers
        tied_losses, tied_layers, _, _ = got["tied"]
        assert tied_losses == pytest.approx(got["tied_reference"][0], rel=1e-5)
        assert tied_layers["lm_head"] == "vocab" and tied_layers["model.embed_tokens"] == "vocab-embedding"
        assert got["tied_shares"] == [32, 32]  # one parameter: this rank's 32 of the 64 vocabulary rows


def test_vocab_parallel_head_returns_this_ranks_logits_and_the_loss_of_the_whole(ran):
    got = ran[0]["vocab"]
    assert got["logits_shape"] == [2, 8, 32]
    assert got["masked"][0] == pytest.approx(got["masked"][1], rel=1e-5)  # labels -100 ignored
    assert got["items"][0] == pytest.approx(got["items"][1], rel=1e-5)  # the sum over num_items_in_batch


def test_vocab_parallel_lm_head_null_follows_a_plan_that_shards_a_tied_embedding(ran):
    assert ran[0]["vocab"]["auto"] == [("vocab", "vocab-embedding"), (None, None), ("column+gather", None)]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("rows", ["lm_head", "63 vocabulary rows", "autotp_size 2"]),
        ("no_head", ["LM head", "'lm_head', 'embed_out'", "LlamaModel"]),
        ("no_hook", ["NoHook has no loss_function", "vocab_parallel_lm_head false"]),
    ],
)
def test_vocab_parallel_lm_head_errors_name_the_module_and_numbers(ran, case, words):
    message, untouched = ran[0]["vocab"]["errors"][case]
    assert all(word in message for word in words), message
    assert untouched


def test_autotp_size_other_than_the_group_is_an_error(ran):
    got = ran[0]["config"]["size"]
    assert got is not None and "autotp_size is 4" in got and "2 ranks" in got
