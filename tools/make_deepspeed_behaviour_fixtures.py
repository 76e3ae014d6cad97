"""Record what DeepSpeed 0.19.8 returns and raises where ds's behaviour must match it name for name.

Run from the repository root with a Python that has deepspeed==0.19.8 installed (CPU accelerator):

    DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_behaviour_fixtures.py

Writes ``packages/ds-engine/tests/fixtures/deepspeed_behaviour.json``, which
``packages/ds-engine/tests/test_deepspeed_behaviour.py`` compares ds against: the value ``backward(loss)``
returns (gradient accumulation 2, fp32 and fp16 with its loss scale, and ``scale_wrt_gas=False``), and the
exception class and message of ``save_checkpoint(None)`` / ``save_checkpoint("")``, ``initialize(model=None)``
and a client optimizer ZeRO has not tested without ``zero_allow_untested_optimizer``. One process, world 1;
``no_sync`` also at 2 ranks (this script started twice with ``--no-sync-rank``).

Also writes ``packages/deepspeed/tests/fixtures/deepspeed_config_objects.json`` (DeepSpeedConfig and its
section models read as code reads them) and adds the LR schedules, ``initialize`` without an optimizer,
``no_sync`` and a ZeRO-3 external parameter to the behaviour fixture (``tools/_record_deepspeed_surface.py``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _record_deepspeed_surface as surface  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "packages/ds-engine/tests/fixtures/deepspeed_behaviour.json"
# the public names and constants of DeepSpeed's module paths, for the deepspeed package's own tests
CONFIG_OUT = (
    Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_config_objects.json"
)
NAMES_OUT = (
    Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_module_names.json"
)
LOSS = 4.59375  # the loss every case feeds to backward (exact in fp16 and bf16)


def _net(torch, dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dtype)


def _error(fn) -> dict | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the class is what is recorded
        return {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    return None


def _config_optimizers(deepspeed, torch) -> dict:
    """Class (MRO names) and weight decay of the optimizer the config's Adam/AdamW builds."""
    cases = {
        "Adam": {"type": "Adam"},
        "AdamW": {"type": "AdamW"},
        "Adam.torch_adam": {"type": "Adam", "params": {"torch_adam": True}},
        "AdamW.torch_adam": {"type": "AdamW", "params": {"torch_adam": True}},
        "Adam.adam_w_mode=False.torch_adam": {
            "type": "Adam",
            "params": {"torch_adam": True, "adam_w_mode": False},
        },
        "Adam.offload": {"type": "Adam", "offload": True},
    }
    got = {}
    for name, case in cases.items():
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": case["type"], "params": case.get("params", {})},
        }
        if case.get("offload"):
            config["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
            config["zero_force_ds_cpu_optimizer"] = False
        try:
            eng = deepspeed.initialize(model=_net(torch, torch.float32), config=config)[0]
            opt = eng.basic_optimizer
            got[name] = {
                "mro": [c.__name__ for c in type(opt).__mro__],
                "weight_decay": opt.param_groups[0]["weight_decay"],
            }
        except Exception as exc:  # noqa: BLE001 - recorded: this DeepSpeed cannot build it on CPU
            got[name] = {"not_run": f"{type(exc).__name__}: {exc}"[:300]}
    return got


def _cpu_adam(deepspeed, torch) -> dict:
    """DeepSpeedCPUAdam's state dtype with fp32_optimizer_states, and step_subgroup then rollback_subgroup."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    got = {}
    for fp32_states in (True, False):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 8).to(torch.bfloat16))
        opt = DeepSpeedCPUAdam([p], lr=0.1, fp32_optimizer_states=fp32_states)
        p.grad = torch.linspace(0.5, -0.5, 8).to(torch.bfloat16)
        opt.step()
        got[f"fp32_optimizer_states={fp32_states}"] = {
            "exp_avg_dtype": str(opt.state[p]["exp_avg"].dtype),
            "param_after": p.detach().float().tolist(),
        }
    for adamw in (True, False):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 8))
        opt = DeepSpeedCPUAdam([p], lr=0.1, weight_decay=0.1, adamw_mode=adamw)
        p.grad = torch.linspace(0.5, -0.5, 8)
        opt.step_subgroup(7)
        opt.step_subgroup(7)
        after = p.detach().clone().tolist()
        opt.rollback_subgroup(7)
        got[f"subgroup.adamw_mode={adamw}"] = {
            "state_keys": [str(k) for k in opt.state],
            "after_two_steps": after,
            "after_rollback": p.detach().tolist(),
            "step_after_rollback": int(opt.state[7]["step"]),
            "exp_avg_after_rollback": opt.state[7]["exp_avg"].tolist(),
        }
    got["rollback_uninitialised"] = _error(
        lambda: DeepSpeedCPUAdam([torch.nn.Parameter(torch.ones(2))]).rollback_subgroup(0)
    )
    return got


def _device_count(deepspeed) -> dict:
    from deepspeed.accelerator import get_accelerator

    got = {}
    for local_size in ("3", None):
        saved = os.environ.pop("LOCAL_SIZE", None)
        if local_size:
            os.environ["LOCAL_SIZE"] = local_size
        got[f"LOCAL_SIZE={local_size}"] = get_accelerator().device_count()
        os.environ.pop("LOCAL_SIZE", None)
        if saved is not None:
            os.environ["LOCAL_SIZE"] = saved
    return got


def _module_names() -> dict:
    """Public names of the module paths ds maps, and the values of their JSON-able constants."""
    import importlib

    got = {}
    for name in (
        "deepspeed.runtime.constants",
        "deepspeed.runtime.zero.config",
        "deepspeed.runtime.precision_config",
        "deepspeed.runtime.config",
        "deepspeed.runtime.engine",
        "deepspeed.runtime.zero",
        "deepspeed.runtime.activation_checkpointing",
        "deepspeed.utils",
        "deepspeed.utils.groups",
        "deepspeed.git_version_info",
        "deepspeed.ops.op_builder",
        "deepspeed.launcher.runner",
    ):
        module = importlib.import_module(name)
        constants = {
            k: v
            for k, v in vars(module).items()
            if k.isupper() and isinstance(v, (str, int, float, bool, type(None)))
        }
        got[name] = {"names": sorted(n for n in dir(module) if not n.startswith("_")), "constants": constants}
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    got["enums"] = {
        "ZeroStageEnum": {m.name: m.value for m in ZeroStageEnum},
        "ZeroParamStatus": {m.name: m.value for m in ZeroParamStatus},
    }
    return got


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_sync_at_two_ranks() -> dict:
    """Start this script twice (ranks 0 and 1) in ``--no-sync-rank`` mode; both ranks' records."""
    port, procs, outs = _free_port(), [], []
    for rank in range(2):
        out = Path(tempfile.mkdtemp()) / f"rank{rank}.json"
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
        env.update(WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--no-sync-rank", str(out)], env=env))
        outs.append(out)
    if any(p.wait(timeout=900) for p in procs):
        raise RuntimeError("the no_sync ranks failed")
    return {f"rank{r}": json.loads(o.read_text()) for r, o in enumerate(outs)}


def _no_sync_rank(out: str) -> None:
    import deepspeed
    import torch

    Path(out).write_text(json.dumps(surface.no_sync_ranks(deepspeed, torch, int(os.environ["RANK"]))))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--no-sync-rank":
        return _no_sync_rank(sys.argv[2])
    # DS_RECORD_NO_SYNC_CACHE=path: reuse (or write) the 2-rank record there (DeepSpeed's op builds are slow)
    cache = Path(os.environ.get("DS_RECORD_NO_SYNC_CACHE", "/nonexistent"))
    no_sync_ranks = json.loads(cache.read_text()) if cache.is_file() else _no_sync_at_two_ranks()
    if cache.parent.is_dir():
        cache.write_text(json.dumps(no_sync_ranks))
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    import deepspeed
    import torch

    out: dict = {"deepspeed": deepspeed.__version__, "loss": LOSS, "backward": {}}

    def engine(dtype, extra=None, optimizer=None):
        model = _net(torch, dtype)
        opt = optimizer(model.parameters()) if optimizer else torch.optim.SGD(model.parameters(), lr=0.1)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, **(extra or {})}
        return deepspeed.initialize(model=model, optimizer=opt, config=config)[0]

    cases = {"fp32": (torch.float32, {}), "fp16": (torch.float16, {"fp16": {"enabled": True}})}
    for name, (dtype, extra) in cases.items():
        try:
            eng = engine(dtype, extra)
            for wrt in (True, False):
                x = torch.randn(1, 4, dtype=dtype)
                loss = eng(x).float().sum() * 0 + LOSS
                got = eng.backward(loss, scale_wrt_gas=wrt)
                out["backward"][f"{name}.scale_wrt_gas={wrt}"] = {
                    "value": float(got),
                    "dtype": str(got.dtype),
                }
            out["backward"][f"{name}.loss_scale"] = float(getattr(eng.optimizer, "loss_scale", 1.0))
        except Exception as exc:  # noqa: BLE001 - recorded: this DeepSpeed cannot run the case on CPU
            out["backward"][name] = {"not_run": f"{type(exc).__name__}: {exc}"[:300]}

    eng = engine(torch.float32, {"gradient_accumulation_steps": 1})
    out["save_checkpoint_none"] = _error(lambda: eng.save_checkpoint(None))
    out["save_checkpoint_empty"] = _error(lambda: eng.save_checkpoint(""))
    out["initialize_model_none"] = _error(
        lambda: deepspeed.initialize(model=None, config={"train_micro_batch_size_per_gpu": 1})
    )
    out["untested_client_optimizer"] = _error(
        lambda: engine(torch.float32, {"zero_optimization": {"stage": 1}}, lambda p: torch.optim.RMSprop(p))
    )
    out["config_optimizer"] = _config_optimizers(deepspeed, torch)
    out["cpu_adam"] = _cpu_adam(deepspeed, torch)
    out["device_count"] = _device_count(deepspeed)
    out["lr_schedules"] = surface.lr_schedules(torch)
    out["no_optimizer"] = surface.no_optimizer(deepspeed, torch)
    out["no_sync"] = {"refusals": surface.no_sync_refusals(deepspeed, torch), "two_ranks": no_sync_ranks}
    out["external_parameter"] = surface.external_parameter(deepspeed, torch)
    with tempfile.TemporaryDirectory() as tmp:
        objects = {"deepspeed": deepspeed.__version__, **surface.config_objects(deepspeed, tmp)}
    CONFIG_OUT.write_text(json.dumps(objects, indent=2) + "\n")
    NAMES_OUT.write_text(json.dumps({"deepspeed": deepspeed.__version__, **_module_names()}, indent=2) + "\n")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
