"""Record what DeepSpeed 0.19.8's async I/O op (``AsyncIOBuilder().load().aio_handle``) does on real files.

Run from the repository root with the real DeepSpeed (CPU accelerator, libaio-dev installed so that the op
builds; the first build takes minutes):

    env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_aio_fixtures.py

Writes ``packages/deepspeed/tests/fixtures/deepspeed_aio_handle.json``, read by
``packages/deepspeed/tests/test_aio_handle.py``: for each case in ``CASES`` (a list of calls on one handle
in a fresh directory) the return value of every call, whether the data read back equals the data written,
and the size of every file afterwards. A call that raises is recorded as ``{"raises": class name}``. Each case
runs in its own process: a failed C++ assertion in the op aborts the process (recorded as ``"aborted"``:
the signal, and the calls that returned before it), and the op's own messages (printed to stdout by its C++
code) are recorded too. Also recorded (``stage12_nvme``): what DeepSpeed does with
``offload_optimizer.device: "nvme"`` at ZeRO stages 1 and 2 (ds-config refuses it there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_aio_handle.json"

# (name, handle kwargs, calls); a call is (method, args) where a tensor argument is "w:N" (N fp32 values,
# 0..N-1, written) or "r:N" (N fp32 zeros to read into; recorded: equal to the values written?) and a
# file argument is "f:NAME" (NAME inside the case's directory)
CASES = [
    ("getters_default", {}, [
        ("get_block_size", []), ("get_queue_depth", []), ("get_single_submit", []),
        ("get_overlap_events", []), ("get_intra_op_parallelism", []), ("get_alignment", []),
    ]),
    ("getters_set", {"block_size": 262144, "queue_depth": 4, "single_submit": True, "overlap_events": True,
                     "intra_op_parallelism": 2}, [
        ("get_block_size", []), ("get_queue_depth", []), ("get_single_submit", []),
        ("get_overlap_events", []), ("get_intra_op_parallelism", []), ("get_alignment", []),
    ]),
    ("sync_round_trip", {}, [
        ("sync_pwrite", ["w:262144", "f:a"]), ("sync_pread", ["r:262144", "f:a"]),
    ]),
    ("async_round_trip", {"intra_op_parallelism": 2}, [
        ("async_pwrite", ["w:262144", "f:a"]), ("async_pwrite", ["w:262144", "f:b"]), ("wait", []),
        ("async_pread", ["r:262144", "f:a"]), ("async_pread", ["r:262144", "f:b"]), ("wait", []),
        ("wait", []),
    ]),
    ("file_offset", {}, [
        ("sync_pwrite", ["w:1024", "f:a"]), ("sync_pwrite", ["w:1024", "f:a", 4096]),
        ("sync_pread", ["r:1024", "f:a", 4096]),
    ]),
    ("pread_pwrite_flags", {}, [
        ("pwrite", ["w:4096", "f:a", False, True]), ("wait", []),
        ("pread", ["r:4096", "f:a", False, False]),
    ]),
    ("unaligned_size", {}, [
        ("sync_pwrite", ["w:1000", "f:a"]), ("sync_pread", ["r:1000", "f:a"]),
    ]),
    ("read_missing_file", {}, [("sync_pread", ["r:1024", "f:missing"])]),
    ("read_past_end", {}, [("sync_pwrite", ["w:1024", "f:a"]), ("sync_pread", ["r:2048", "f:a"])]),
    ("parallelism_not_dividing", {"intra_op_parallelism": 3}, [("sync_pwrite", ["w:1024", "f:a"])]),
]  # fmt: skip


def _run_case(op, kwargs: dict, calls: list) -> dict:
    import torch

    handle = op.aio_handle(**kwargs)
    out: dict = {"returns": [], "equal": [], "sizes": {}}
    with tempfile.TemporaryDirectory() as d:
        reads = []
        for method, args in calls:
            real = []
            for a in args:
                if isinstance(a, str) and a[:2] == "w:":
                    real.append(torch.arange(int(a[2:]), dtype=torch.float32))
                elif isinstance(a, str) and a[:2] == "r:":
                    t = torch.zeros(int(a[2:]), dtype=torch.float32)
                    reads.append(t)
                    real.append(t)
                elif isinstance(a, str) and a[:2] == "f:":
                    real.append(os.path.join(d, a[2:]))
                else:
                    real.append(a)
            try:
                ret = getattr(handle, method)(*real)
            except Exception as e:  # recorded: what DeepSpeed raises
                ret = {"raises": type(e).__name__}
            out["returns"].append(ret)
            print("RETURN " + json.dumps(ret), flush=True)
        out["equal"] = [bool(torch.equal(t, torch.arange(t.numel(), dtype=torch.float32))) for t in reads]
        out["sizes"] = {name: os.path.getsize(os.path.join(d, name)) for name in sorted(os.listdir(d))}
    return out


def _stage12_nvme() -> dict:
    """What DeepSpeed does with ``offload_optimizer.device: "nvme"`` at stages 1 and 2: one step of a small
    model; recorded: the engine's offload getters, where the Adam state lives, the files under nvme_path."""
    import deepspeed
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed.init_distributed()
    out = {}
    for stage in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            cfg = {
                "train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_optimization": {
                    "stage": stage,
                    "offload_optimizer": {"device": "nvme", "nvme_path": d},
                },
            }
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 4)
            engine, *_ = deepspeed.initialize(model=model, config=cfg)
            loss = engine(torch.randn(2, 8)).pow(2).mean()
            engine.backward(loss)
            engine.step()
            opt = engine.optimizer
            states = [
                t
                for st in opt.optimizer.state.values()
                for t in st.values()
                if torch.is_tensor(t) and t.dim()
            ]
            out[f"stage{stage}"] = {
                "zero_cpu_offload": engine.zero_cpu_offload(),
                "zero_nvme_offload_optimizer": engine.zero_nvme_offload_optimizer(),
                "optimizer_cpu_offload": getattr(opt, "cpu_offload", None),
                "inner_optimizer": type(opt.optimizer).__name__,
                "state_devices": sorted({str(t.device) for t in states}),
                "files_under_nvme_path": sorted(str(p.relative_to(d)) for p in Path(d).rglob("*")),
            }
    return out


def _case_in_subprocess(name: str) -> dict:
    res = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, timeout=300)
    lines = res.stdout.splitlines()
    done = [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]
    if done:
        return done[0]
    return {
        "aborted": -res.returncode,
        "returns": [json.loads(line[len("RETURN ") :]) for line in lines if line.startswith("RETURN ")],
        "messages": [line for line in lines if not line.startswith("RETURN ")][-5:],
    }


def main() -> None:
    import deepspeed
    from deepspeed.ops.op_builder import AsyncIOBuilder

    builder = AsyncIOBuilder()
    op = builder.load(verbose=False)
    if sys.argv[1:] == ["stage12"]:
        print("RESULT " + json.dumps(_stage12_nvme()), flush=True)
        return
    if len(sys.argv) > 1:  # one case, in this process
        name = sys.argv[1]
        kwargs, calls = next((k, c) for n, k, c in CASES if n == name)
        print("RESULT " + json.dumps(_run_case(op, kwargs, calls)), flush=True)
        return
    record = {
        "deepspeed": deepspeed.__version__,
        "is_compatible": builder.is_compatible(),
        "op_names": sorted(n for n in dir(op) if not n.startswith("_")),
        "cases": {name: _case_in_subprocess(name) for name, _, _ in CASES},
        "stage12_nvme": _case_in_subprocess("stage12"),
    }
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
