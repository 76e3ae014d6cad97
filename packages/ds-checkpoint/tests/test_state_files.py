"""Atomic saves under SIGKILL, bad files, client_state rules, fp32 export (single process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import ds_checkpoint
import pytest
import torch
from _sharded import GROUPS, full_state, shard_of
from ds_checkpoint import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ClientStateError,
    ShardFormatError,
    load_state,
    save_state,
)
from ds_checkpoint._export import export_fp32
from safetensors.torch import load_file


def _model():
    gen = torch.Generator().manual_seed(7)
    return {name: torch.randn(shape, generator=gen) for params in GROUPS for name, shape in params} | {
        "norm.running_mean": torch.zeros(4, dtype=torch.float16),
        "norm.num_batches_tracked": torch.tensor(3),
    }


def _save_small(save_dir, tag="t1"):
    full = full_state()
    return save_state(save_dir, tag, model_state=_model(), optimizer_shard=shard_of(full, 2, 0, 1),
                      counters={"global_steps": 2}, client_state={"x": [1, (2, 3)]})  # fmt: skip


# ------------------------------------------------------------------------------- atomicity
KILLED_WRITER = textwrap.dedent(
    """
    import sys, torch
    from ds_checkpoint import save_state
    big = {f"w{i}": torch.ones(1_000_000) for i in range(50)}  # 200 MB: takes a while to write
    print("writing", flush=True)
    save_state(sys.argv[1], "t2", model_state=big)
    """
)


def test_sigkill_mid_save_leaves_previous_checkpoint_and_latest(tmp_path):
    _save_small(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 60
    partial = tmp_path / ".t2.tmp"
    # kill while the big model file is being written (it is renamed from .tmp when complete)
    while not (partial / "model.safetensors.tmp").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "latest").read_text() == "t1"
    assert not (tmp_path / "t2").exists()
    state = load_state(tmp_path)
    assert state.tag == "t1" and state.counters == {"global_steps": 2}
    torch.testing.assert_close(state.model_state, _model(), rtol=0, atol=0)
    # the next save cleans the half-written directory
    _save_small(tmp_path, "t3")
    assert not partial.exists()
    assert (tmp_path / "latest").read_text() == "t3"


KILLED_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys, torch
    from ds_checkpoint import save_state
    real_replace = os.replace
    def replace(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".t1.old"):  # the old t1 is moved aside; the new one not yet in place
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    save_state(sys.argv[1], "t1", model_state={"w": torch.ones(2)})
    """
)


def test_sigkill_between_the_renames_of_a_resave_keeps_the_old_tag(tmp_path):
    _save_small(tmp_path)
    proc = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(tmp_path)], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "t1").exists() and (tmp_path / ".t1.old").is_dir()
    with pytest.warns(UserWarning, match=r"\.t1\.old"):
        state = load_state(tmp_path)
    assert state.counters == {"global_steps": 2}
    torch.testing.assert_close(state.model_state, _model(), rtol=0, atol=0)
    # the next save moves the old copy back into place and drops the half-published new one
    _save_small(tmp_path, "t3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "t1", "t3"]
    torch.testing.assert_close(load_state(tmp_path, "t1").model_state, _model(), rtol=0, atol=0)


def test_resave_same_tag_replaces_it(tmp_path):
    _save_small(tmp_path)
    save_state(tmp_path, "t1", model_state={"w": torch.ones(2)}, save_rng=False)
    assert list(load_state(tmp_path).model_state) == ["w"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "t1"]


# ------------------------------------------------------------------------------- bad input
def test_missing_optimizer_file_is_named(tmp_path):
    ckpt = _save_small(tmp_path)
    (ckpt / "optim_rank00000.safetensors").unlink()
    state = load_state(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="optim_rank00000.safetensors"):
        state.read_shard(0, 0, 4)


def test_truncated_model_file_is_named(tmp_path):
    ckpt = _save_small(tmp_path)
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match=r"model\.safetensors is truncated"):
        load_state(tmp_path)


def test_tampered_optimizer_bytes_are_detected(tmp_path):
    ckpt = _save_small(tmp_path)
    path = ckpt / "optim_rank00000.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="optim_rank00000.safetensors was modified"):
        load_state(tmp_path).read_shard(1, 0, 13)


def test_tampered_meta_json_is_detected(tmp_path):
    ckpt = _save_small(tmp_path)
    meta = ckpt / "meta.json"
    meta.write_text(meta.read_text().replace('"global_steps": 2', '"global_steps": 9'))
    with pytest.raises(CheckpointCorruptError, match="meta.json does not match"):
        load_state(tmp_path)
    meta.write_text(meta.read_text()[:50])
    with pytest.raises(CheckpointCorruptError, match="meta.json is not valid JSON"):
        load_state(tmp_path)


def test_missing_latest_warns_and_missing_tag_raises(tmp_path):
    with pytest.warns(UserWarning, match="Unable to find latest file"):
        assert load_state(tmp_path) is None
    with pytest.raises(CheckpointNotFoundError, match="nope"):
        load_state(tmp_path, "nope")


# ------------------------------------------------------------------------------- client_state
def test_client_state_round_trip_and_errors(tmp_path):
    client = {"epoch": 3, "pair": (1, "a"), "nested": {"t": torch.arange(4), "l": [None, 2.5, True]}}
    save_state(tmp_path, "c", client_state=client, save_rng=False)
    got = load_state(tmp_path, load_model=False).client_state
    assert got["epoch"] == 3 and got["pair"] == (1, "a") and got["nested"]["l"] == [None, 2.5, True]
    assert torch.equal(got["nested"]["t"], torch.arange(4))
    with pytest.raises(
        ClientStateError, match=r"client_state\['bad'\]\[0\]: a value of type builtins.object"
    ):
        save_state(tmp_path, "d", client_state={"bad": [object()]})
    with pytest.raises(ClientStateError, match="key 1 is a int"):
        save_state(tmp_path, "d", client_state={1: 2})
    assert not (tmp_path / "d").exists() and (tmp_path / "latest").read_text() == "c"


def test_invalid_shard_is_rejected(tmp_path):
    tensors, meta = shard_of(full_state(), 1, 0, 2)
    tensors["g0.master"] = tensors["g0.master"][:-1]
    with pytest.raises(ShardFormatError, match="g0.master"):
        save_state(tmp_path, "x", optimizer_shard=(tensors, meta))


# ------------------------------------------------------------------------------- export
def test_export_writes_fp32_master_weights_by_name(tmp_path):
    full = full_state()
    ckpt = _save_small(tmp_path / "s")
    out = tmp_path / "out.safetensors"
    from ds_checkpoint.__main__ import main

    assert main(["export", str(tmp_path / "s"), str(out)]) == 0
    got = load_file(out)
    for g, params in enumerate(GROUPS):
        off = 0
        for name, shape in params:
            n = torch.Size(shape).numel()
            assert torch.equal(got[name], full["master"][g][off : off + n].view(shape)), name
            off += n
    assert got["norm.running_mean"].dtype == torch.float32  # buffers from the model file, as fp32
    assert got["norm.num_batches_tracked"].item() == 3
    assert sorted(export_fp32(ckpt, tmp_path / "o2.safetensors")) == sorted(got)


def test_export_cli_subprocess_reports_errors(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ds_checkpoint", "export", str(tmp_path), str(tmp_path / "o")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert run.returncode == 1 and "latest" in run.stderr


def test_public_names():
    for name in ("save_state", "load_state", "read_shard", "validate_tag", "load_deepspeed", "export_fp32"):
        assert name in ds_checkpoint.__all__
