"""What of DeepSpeed 0.19.8's public surface ds leaves out on purpose, and where it differs, with the reasons.

Read by ``tools/checks/check_deepspeed_surface.py`` (CI: packages/deepspeed/tests/test_surface.py), which renders it
into docs/deepspeed-api.md. A key is a dotted DeepSpeed path: a module covers every name (and class method)
under it that ds does not provide, a name covers itself and its methods; the longest matching key wins.
An entry that covers nothing missing any more fails the check (stale): delete it when ds provides the name.
"""

# --- whole features ds does not implement -----------------------------------------------------------
_INFERENCE = (
    "DeepSpeed-Inference (kernel injection, ragged batching, inference kernels): ds trains, it does not serve"
)
_KERNELS = "DeepSpeed's compiled CUDA/C++ kernels and their builders: ds compiles no ops (torch and Numba kernels instead)"
_NVME = (
    "DeepSpeed's NVMe swapper classes and aio/GDS handles: ds's NVMe offload at stage 3 (parameters, optimizer "
    "state, gradients) has its own (ds_zero._aio, ds_zero.stage3._swap, _param_swap, _grad_swap)"
)
_DUALPIPE = (
    "DualPipeV (DeepSeek-V3's bidirectional pipeline schedule): not in ds; ds-pipe runs DeepSpeed's 1F1B"
)
_PIPE = (
    "pipeline internals ds-pipe implements its own way: DeepSpeed's p2p module (ds-pipe sends a header with "
    "every message), the engine module's timer names and helpers, CommitP2P, DualPipeV, PipelineModule's "
    "per-layer checkpoint path helpers; PipelineEngine's DeepSpeedEngine methods ds lacks are those of "
    "deepspeed.runtime.engine"
)
_MOE = (
    "DeepSpeed-MoE's internals (sharded_moe's gating functions and MOELayer, the ep_* fused-kernel path, tensor-parallel "
    "token mappings, tutel): ds_moe routes with its own gate; MoE, Experts and deepspeed.moe.utils are provided"
)
_TP = (
    "DeepSpeed's AutoTP and sequence-parallel internals (set_autotp_mode, tp_model_init's record/merge helpers, "
    "runtime.tensor_parallel / sequence_parallel / domino modules): ds's AutoTP is ds_tpsp.tensor, reached "
    "through tensor_parallel.autotp_size and deepspeed.tp_model_init"
)
_ACCEL = (
    "DeepSpeed's accelerator classes per device (CUDA, XPU, NPU, HPU, MPS...): ds's accelerator is "
    "deepspeed.accelerator.get_accelerator() over torch (CPU and CUDA)"
)
_INTERNAL = (
    "module-internal helpers, globals and bookkeeping of DeepSpeed's implementation, which ds implements "
    "differently (its one implementation is in the ds-* packages)"
)
_ENGINE_MODULE = (
    "deepspeed.runtime.engine's module-level internals (apex probe, castable dtypes, timer-name holder, "
    "allreduce size, sparse-tensor split helper): ds's engine module is ds_engine's, which has none of them"
)
_E = "deepspeed.runtime.engine.DeepSpeedEngine."
_ENGINE_REDUCE = (
    "DeepSpeed's engine's gradient-reduction internals (buckets, sparse allreduce, scalar gathers, fp32 "
    "clipping helper): ds reduces inside backward()/step() (ds-zero's reducer, no_sync for local "
    "accumulation) and exposes no separate reduction methods"
)
_ENGINE_ZERO_KEYS = (
    "ZeRO keys ds-config does not take: legacy stage 1, multi-rank bucket allreduce, parameter alignment, sequential allgather, Muon momentum buffers, "
    "the grad-norm switch, trace-cache warnings, leaf-module granularity: these features are not in ds"
)
_ENGINE_OTHER_KEYS = (
    "config keys and their objects ds-config does not take (checkpoint serialization/writer, use_node_local_storage, load_universal_checkpoint, log_level, CPU-Adam core "
    "share, sanity checks, legacy fusion, managed gradient accumulation, DeepSpeed's swap-tensor object): "
    "not in ds"
)
ENGINE_ABSENT: dict[str, str] = {
    **dict.fromkeys(
        [
            _E + "autotuning_" + n
            for n in (
                "enabled end_profile_step metric metric_path model_info_path profile_model_info start_profile_step"
            ).split()
        ],
        "the autotuner's engine getters: autotuning is not in ds",
    ),
    **dict.fromkeys(
        [
            _E + "flops_profiler_" + n
            for n in (
                "detailed enabled module_depth output_file profile_step recompute_fwd_factor top_modules"
            ).split()
        ],
        "the flops profiler's engine getters: the flops profiler is not in ds",
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "curriculum_learning_config curriculum_learning_enabled data_efficiency_config "
                "data_efficiency_enabled data_sampling_config data_sampling_enabled "
                "set_custom_curriculum_learning_schedule set_data_post_process_func random_ltd_config "
                "random_ltd_enabled random_ltd_initialize"
            ).split()
        ],
        "data efficiency (curriculum learning, data sampling, DeepSpeedDataLoader's post-processing, "
        "random-LTD): not in ds",
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "compile_autosp compile_autotp compile_zero_optimization_stage get_autosp_backend "
                "get_autotp_backend get_compile_time get_deepcompile_backend get_deepspeed_compile_backend "
                "is_compiled is_deepcompile_active is_deepcompile_enabled register_compile_pass "
                "uses_parallelization_pass_only"
            ).split()
        ],
        "engine.compile / DeepCompile and its passes: not in ds",
    ),
    _E + "load_moe_state_dict": "MoE: not in ds",
    _E + "print_forward_breakdown": "MoE gate/all-to-all timing: MoE is not in ds",
    **dict.fromkeys(
        [_E + n for n in "offload_states reload_states super_offload zenflow_config".split()],
        "offload_states/reload_states, SuperOffload and ZenFlow: not in ds",
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "torch_autocast_enabled torch_autocast_dtype torch_autocast_lower_precision_safe_modules"
            ).split()
        ],
        "torch_autocast mixed precision: not in ds (ds-config refuses the section; use bf16, fp16 or amp)",
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "all_gather_scalar allreduce_and_copy allreduce_bucket allreduce_gradients allreduce_no_retain "
                "buffered_allreduce_fallback clip_fp32_gradients sparse_all_gather sparse_allreduce "
                "sparse_allreduce_bucket sparse_allreduce_no_retain"
            ).split()
        ],
        _ENGINE_REDUCE,
    ),
    _E + "coalesce_grad_reduction": (
        "coalescing ZeRO gradient reduction across backward() calls: not in ds (engine.no_sync() keeps "
        "gradients local at ZeRO 0/1)"
    ),
    _E + "collect_python_gc": "DeepSpeed's Python GC manager: not in ds",
    _E + "get_optimizer_configuration": (
        "DeepSpeed's choice of its own Adam implementation from the optimizer params: ds-optim builds the "
        "config's optimizer (ds_engine._assemble)"
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "zero_legacy_stage1 zero_multi_rank_bucket_allreduce "
                "zero_parameter_alignment zero_allgather_sequential zero_save_muon_momentum_buffer_in_memory "
                "zero_compute_grad_norm zero_log_trace_cache_warnings zero_module_granularity_threshold"
            ).split()
        ],
        _ENGINE_ZERO_KEYS,
    ),
    **dict.fromkeys(
        [
            _E + n
            for n in (
                "checkpoint_serialization_enabled checkpoint_writer_enabled "
                "use_node_local_storage load_universal_checkpoint log_level cpuadam_cores_perc "
                "is_sanity_checks_enabled optimizer_legacy_fusion managed_gradient_accumulation swap_tensor_config"
            ).split()
        ],
        _ENGINE_OTHER_KEYS,
    ),
}

ABSENT: dict[str, str] = {
    # top-level features
    "deepspeed.inference": _INFERENCE,
    "deepspeed.module_inject": _INFERENCE,
    "deepspeed.model_implementations": _INFERENCE,
    "deepspeed.default_inference_config": _INFERENCE,
    "deepspeed.replace_transformer_layer": _INFERENCE,
    "deepspeed.autotuning": "the autotuner (it launches experiments with DeepSpeed's launcher): not in ds",
    "deepspeed.compile": "DeepCompile (DeepSpeed's compiler passes): not in ds",
    "deepspeed.compression": "model compression (quantisation-aware training, pruning): not in ds",
    "deepspeed.profiling": "the flops profiler: not in ds",
    "deepspeed.monitor": "DeepSpeed's monitor classes: ds-engine has its own writers for the config's tensorboard/wandb/csv_monitor sections",
    "deepspeed.nvme": _NVME,
    "deepspeed.io": _NVME,
    "deepspeed.sequence": (
        "AutoSP, FPDT, the public vocabulary-parallel cross-entropy functions and deepspeed.sequence.layer's "
        "layout helpers (uneven heads, the group registry): not in ds; layer.DistributedAttention, "
        "single_all_to_all and apply_rotary_pos_emb are ds_tpsp's, and tensor_parallel.vocab_parallel_lm_head "
        "installs ds_tpsp's vocab-parallel causal-LM loss"
    ),
    "deepspeed.linear": "LoRA/quantised linear layers (deepspeed.linear): not in ds",
    "deepspeed.datastates": "DataStates asynchronous checkpointing engine: not in ds",
    "deepspeed.env_report": "ds_report (which ops compiled): ds compiles none; deepspeed.ops.op_builder answers is_compatible()",
    "deepspeed.git_version_info_installed": "a file DeepSpeed's build writes; ds's deepspeed.git_version_info holds the values",
    "deepspeed.compat": _INTERNAL,
    "deepspeed.DeepSpeedDataLoader": "DeepSpeed's data loader class: ds's engine builds a torch DataLoader (engine.deepspeed_io)",
    "deepspeed.set_autotp_mode": _TP,
    "deepspeed.record_tp_model_init_args": _TP,
    "deepspeed.merge_tp_model_init_into_config": _TP,
    "deepspeed.resolve_per_head_muon_after_sharding": "the Muon optimizer: not in ds-optim",
    "deepspeed.set_optimizer_flags": "the Muon optimizer's flags: not in ds-optim",
    "deepspeed.DeepSpeedInferenceConfig": _INFERENCE,
    "deepspeed.KV": _INFERENCE,
    "deepspeed.MLA_KV": _INFERENCE,
    "deepspeed.MLA_Q": _INFERENCE,
    "deepspeed.QUERY": _INFERENCE,
    "deepspeed.NOT_HEAD_BLOCKED": _INFERENCE,
    "deepspeed.DualPipeVEngine": _PIPE,
    "deepspeed.DualPipeVModule": _PIPE,
    "deepspeed.MUON_OPTIMIZER": "the Muon optimizer: not in ds-optim",
    "deepspeed.load_ds_config": "DeepSpeed's helper that reads a config for its hybrid/inference paths: ds reads configs with ds_config.load_config",
    "deepspeed.ops.transformer": _KERNELS,
    "deepspeed.ops.triton_ops": _KERNELS,
    "deepspeed.ops.fp_quantizer": _KERNELS,
    "deepspeed.ops.quantizer": _KERNELS,
    "deepspeed.ops.random_ltd": _KERNELS,
    "deepspeed.ops.deepspeed4science": _KERNELS,
    "deepspeed.ops.compile": _KERNELS,
    "deepspeed.ops.pin_memory": _KERNELS,
    "deepspeed.ops.gds": _NVME,
    "deepspeed.ops.DeepSpeedTransformerConfig": _KERNELS,
    "deepspeed.ops.DeepSpeedTransformerLayer": _KERNELS,
    "deepspeed.ops.op_builder": (
        "the builder machinery per device (compiling C++/CUDA with ninja): ds compiles no ops; every builder "
        "class is at deepspeed.ops.op_builder, answering is_compatible() for ds"
    ),
    "deepspeed.ops.adam.cpu_adam": "the module of DeepSpeed's C++ CPU Adam: the class is deepspeed.ops.adam.DeepSpeedCPUAdam (ds-optim)",
    "deepspeed.ops.adam.fused_adam": "the module of DeepSpeed's CUDA fused Adam: the class is deepspeed.ops.adam.FusedAdam (ds-optim)",
    "deepspeed.ops.adam.multi_tensor_apply": _KERNELS,
    "deepspeed.ops.adam.zenflow_cpu_adam": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.ops.adam.zenflow_torch_adam": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.ops.adam.ZenFlowCPUAdam": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.ops.adam.ZenFlowSelectiveAdamW": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.ops.adam.ZenFlowSelectiveAdamW_stage3": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.ops.adagrad.cpu_adagrad": "the module of DeepSpeed's C++ CPU Adagrad: the class is deepspeed.ops.adagrad.DeepSpeedCPUAdagrad (not available)",
    "deepspeed.ops.lamb.fused_lamb": "the module of DeepSpeed's CUDA LAMB: the class is deepspeed.ops.lamb.FusedLamb (ds-optim)",
    "deepspeed.ops.lion": "the Lion optimizer's kernel modules: ds has no Lion (deepspeed.ops.lion's classes are not available)",
    "deepspeed.accelerator": _ACCEL,
    "deepspeed.accelerator.real_accelerator": (
        "the module's globals (supported-device list, cached accelerator, its logger, base-class aliases): ds "
        "supports cpu and cuda; get_accelerator, set_accelerator and is_current_accelerator_supported are provided"
    ),
    "deepspeed.pipe": _DUALPIPE,
    "deepspeed.runtime.pipe": _PIPE,
    "deepspeed.moe": _MOE,
    "deepspeed.runtime.tensor_parallel": _TP,
    "deepspeed.runtime.domino": _TP,
    "deepspeed.runtime.data_pipeline": "data efficiency (curriculum learning, data sampling, random-LTD): not in ds",
    "deepspeed.runtime.swap_tensor": _NVME,
    "deepspeed.runtime.superoffload": "SuperOffload (CPU-GPU superchip offload): not in ds",
    "deepspeed.runtime.zenflow": "ZenFlow (asynchronous CPU-offloaded updates): not in ds",
    "deepspeed.runtime.hybrid_engine": "DeepSpeed's hybrid (RLHF) engine: not in ds",
    "deepspeed.runtime.hybrid_engine_graph": "DeepSpeed's hybrid (RLHF) engine: not in ds",
    "deepspeed.runtime.rollout": "DeepSpeed's RL rollout helpers: not in ds",
    "deepspeed.runtime.compiler": "DeepSpeed's torch.compile integration (engine.compile): not in ds",
    "deepspeed.runtime.weight_quantizer": "weight quantisation: not in ds",
    "deepspeed.runtime.model_checkpointing": "the DeepNVMe checkpoint writers: not in ds (ds-checkpoint writes its own format)",
    "deepspeed.runtime.checkpoint_engine": (
        "DeepSpeed's pluggable checkpoint engines (torch, Nebula, fast, decoupled): ds-checkpoint has one "
        "writer (safetensors shards, atomic)"
    ),
    "deepspeed.runtime.state_dict_factory": "Megatron model-parallel state-dict merging/splitting: ds is data parallel only",
    "deepspeed.runtime.chunked_cross_entropy": "DeepSpeed's chunked cross entropy (for tensor/sequence parallelism): not in ds",
    "deepspeed.runtime.torch_autocast": "the torch_autocast config section's engine support: not in ds (bf16/fp16/amp are)",
    "deepspeed.runtime.keep_in_fp32": _INTERNAL,
    "deepspeed.runtime.python_gc": _INTERNAL,
    "deepspeed.runtime.comm": "DeepSpeed's compressed (1-bit) communication backends: ds-optim's OneBitAdam has its own",
    "deepspeed.runtime.utils": _INTERNAL,
    "deepspeed.runtime.activation_checkpointing.config": "the config section's model: ds_config.ActivationCheckpointingConfig",
    "deepspeed.runtime.activation_checkpointing.offload_activations": "activation offload to NVMe/CPU streams: not in ds",
    "deepspeed.runtime.activation_checkpointing.checkpointing": (
        "DeepSpeed's activation-checkpointing module globals and internal helpers (partitioning buffers, "
        "CudaRNGStatesTracker class, CheckpointFunction): ds-checkpoint implements them its own way; the "
        "functions code calls (checkpoint, configure, is_configured, reset, get_cuda_rng_tracker, "
        "model_parallel_cuda_manual_seed, non_reentrant_checkpoint) are provided"
    ),
    **{
        "deepspeed.runtime.engine." + n: _ENGINE_MODULE
        for n in (
            "APEX_INSTALLED CASTABLE_DTYPES EngineTimers MEMORY_OPT_ALLREDUCE_SIZE split_half_float_double_sparse"
        ).split()
    },
    **ENGINE_ABSENT,
    "deepspeed.runtime.zero.stage_1_and_2": (
        "DeepSpeed's ZeRO 1/2 internals (IPG buckets, timer names, memory estimators, helpers) and the "
        "methods of its optimizer's internals: ds's ZeRO 1/2 optimizer is ds_zero.ZeroOptimizer, provided "
        "as DeepSpeedZeroOptimizer (isinstance holds), with the optimizer API (step, zero_grad, state_dict, "
        "backward, param_groups, the safe_get fragments)"
    ),
    "deepspeed.runtime.zero.stage3": (
        "DeepSpeed's ZeRO-3 internals (IPG buckets, swap timers, memory estimators, module globals) and the "
        "methods of its optimizer's internals: ds's stage-3 optimizer is ds_zero.ZeroStage3Optimizer, "
        "provided as DeepSpeedZeroOptimizer_Stage3 (isinstance holds)"
    ),
    "deepspeed.runtime.zero.partition_parameters": (
        "zero.Init's internals (tensor-constructor overrides, quantisation info, module-subclass patching, "
        "init-context globals): ds's zero.Init partitions each module's parameters as it is built, without "
        "patching torch"
    ),
    "deepspeed.runtime.zero.DeepSpeedTensorOverride": "zero.Init's tensor-constructor overrides: ds does not patch torch",
    "deepspeed.runtime.zero.ZeroParamType": _INTERNAL,
    "deepspeed.runtime.zero.DeepSpeedZeRoOffload": "DeepSpeed's parameter-offload coordinator: ds_zero.stage3 gathers and releases parameters itself",
    "deepspeed.runtime.zero.TiledLinear": "TiledLinear (splitting a huge linear layer): not in ds",
    "deepspeed.runtime.zero.TiledLinearReturnBias": "TiledLinear (splitting a huge linear layer): not in ds",
    "deepspeed.runtime.zero.tiling": "TiledLinear (splitting a huge linear layer): not in ds",
    "deepspeed.runtime.zero.linear": "ZeRO-3's memory-saving linear autograd function: ds's stage 3 gathers around module forwards",
    "deepspeed.runtime.zero.unwrap_model_for_generation": "gathering a ZeRO-3 model for generation: use deepspeed.zero.GatheredParameters",
    "deepspeed.runtime.zero.muon": "the Muon optimizer: not in ds-optim",
    "deepspeed.runtime.zero.leaf_module_config": "DeepSpeed's model of the zero_optimization.leaf_module section: ds's is ds_config.LeafModuleConfig (same fields, defaults and checks; the engine applies it)",
    "deepspeed.runtime.zero.offload_states": "engine.offload_states / reload_states: not in ds",
    "deepspeed.runtime.zero.parameter_offload": "DeepSpeed's parameter-offload coordinator: ds_zero.stage3 gathers and releases parameters itself",
    "deepspeed.runtime.zero.partitioned_param_coordinator": "DeepSpeed's stage-3 prefetch coordinator: ds_zero.stage3's FetchSchedule",
    "deepspeed.runtime.zero.partitioned_param_profiler": _INTERNAL,
    "deepspeed.runtime.zero.contiguous_memory_allocator": _INTERNAL,
    "deepspeed.runtime.fp16.fused_optimizer": (
        "DeepSpeed's fp16 optimizer's timer names and the methods of its internals: ds's fp16 optimizer is "
        "ds_precision.MixedPrecisionOptimizer (isinstance(opt, FP16_Optimizer) holds for it)"
    ),
    "deepspeed.runtime.fp16.unfused_optimizer": "the methods of DeepSpeed's unfused fp16 optimizer's internals: ds's is ds_precision.MixedPrecisionOptimizer (isinstance holds for it)",
    "deepspeed.runtime.fp16.loss_scaler": "DeepSpeed's loss scaler classes: ds_precision.DynamicLossScaler / StaticLossScaler, built from the fp16 section",
    "deepspeed.runtime.bf16_optimizer": (
        "the methods of DeepSpeed's bf16 optimizer's internals: ds's bf16 optimizer below ZeRO is "
        "ds_precision.MixedPrecisionOptimizer (isinstance(opt, BF16_Optimizer) holds for it)"
    ),
    "deepspeed.runtime.base_optimizer.ZeROOptimizer": "methods of DeepSpeed's optimizer base class: ds's optimizers (ZeroOptimizer, ZeroStage3Optimizer) have their own",
    "deepspeed.runtime.base_optimizer.BackwardHookStateManager": _INTERNAL,
    # modules that exist in ds with the names code uses; the rest of DeepSpeed's module is internal
    "deepspeed.checkpoint": (
        "DeepSpeed's checkpoint-reshaping tools (universal checkpoints, 3D/Megatron reshape, AutoEP maps, their "
        "key constants): ds-checkpoint reshards its own format at load, for any world size"
    ),
    "deepspeed.comm": (
        "DeepSpeed's communication backends (CCL, MORI, its TorchBackend class), comms logger and launcher-env "
        "discovery (AML, AWS SageMaker, DLTS): ds's deepspeed.comm forwards the collectives to torch.distributed"
    ),
    "deepspeed.utils": (
        "DeepSpeed's utility modules for its internals (timers, NVTX, debug maps, hp-fragment linkage, pinned "
        "memory, bwc shims): the helpers code calls (logger, log_dist, groups, safe_get_*, zero_to_fp32, numa, "
        "torch) are provided"
    ),
    "deepspeed.utils.groups": (
        "the model/tensor-parallel setters and the module's globals (mpu, mesh_device, "
        "expert_tensor_parallel_world_size): ds is data parallel only (the getters answer: the data-parallel "
        "group is the world, model/tensor-parallel size 1 and rank 0)"
    ),
    "deepspeed.utils.logging": _INTERNAL,
    "deepspeed.utils.zero_to_fp32": (
        "the zero_to_fp32 script's internals for DeepSpeed's pickled files: ds reads its own checkpoints through "
        "ds_checkpoint.fp32_state_dict (the script's public functions are provided)"
    ),
    "deepspeed.utils.safe_update_full_grad_vectorized": "not provided (see the safe_get section)",
    "deepspeed.runtime.dataloader": _INTERNAL,
    "deepspeed.constants.default_pg_timeout": "ds's process-group timeout is ds-launch's (ds_launch.init_distributed)",
    # DeepSpeed's config-key constants and getters (left pending by the config-objects branch, classified at merge)
    "deepspeed.runtime.config": (
        "DeepSpeed's key-name/format-string constants and per-key getters: ds's keys, defaults and validation are "
        "ds_config's models (read them through DeepSpeedConfig); the rest serve features ds lacks (curriculum/data "
        "efficiency, random-LTD, dynamic batching, expert/sequence parallelism, hybrid engine, torch_autocast, "
        "universal and node-local checkpoints, checkpoint parallel write, legacy fusion, data_types)"
    ),
    "deepspeed.runtime.constants": (
        "DeepSpeed's key-name/format-string constants of keys ds reads through ds_config's models, and of features "
        "ds lacks (torch_autocast, data_types, universal/node-local checkpoints, checkpoint parallel write, "
        "sequence/expert parallelism, vocabulary size for its hybrid engine)"
    ),
    "deepspeed.runtime.precision_config": "the fp16/bf16 sections' format strings: ds_config's field descriptions are the documentation",
    "deepspeed.runtime.lr_schedules": (
        "DeepSpeed's command-line tuning arguments for LR schedules (add_tuning_arguments, parse_arguments, "
        "override_*_params, get_config_from_args, get_lr_from_config, update_lr) and their internal constants: "
        "ds builds schedules from the config's scheduler section only"
    ),
    "deepspeed.runtime.config_utils.DeepSpeedConfigModel.serialize_torch_dtype": "a pydantic serializer of DeepSpeed's models; ds's models serialise dtypes as strings themselves",
    "deepspeed.runtime.precision_config.DeepSpeedFP16Config.serialize_torch_dtype": "a pydantic serializer of DeepSpeed's models; ds's models serialise dtypes as strings themselves",
    "deepspeed.runtime.precision_config.DeepSpeedBF16Config.serialize_torch_dtype": "a pydantic serializer of DeepSpeed's models; ds's models serialise dtypes as strings themselves",
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig.serialize_torch_dtype": "a pydantic serializer of DeepSpeed's models; ds's models serialise dtypes as strings themselves",
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig.serialize_torch_dtype": "a pydantic serializer of DeepSpeed's models; ds's models serialise dtypes as strings themselves",
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig.set_pipeline": "DeepSpeed's validator that sets pipeline from pipeline_read/pipeline_write; ds reads the two keys directly",
    "deepspeed.runtime.zero.config.DeepSpeedZeroConfig": (
        "DeepSpeed's pydantic validators (compute_grad_norm_valid, elastic_checkpoint_deprecated, offload_ratio_check, "
        "overlap_comm_valid, serialize_torch_dtype): ds_config's rules validate the same keys (_rules.py)"
    ),
}

# Provided, with a difference in signature or value, and why.
_GETTER = "ds's engine lacks this parameter"
_PIPE_ENGINE = (
    "built by initialize() for a PipelineModule from the parts ds-engine assembled, not by the script; "
    "has_bool_tensors is not needed (each message between stages carries its dtypes)"
)
DIFFERS: dict[str, str] = {
    "deepspeed.PipelineEngine": _PIPE_ENGINE,
    "deepspeed.runtime.pipe.engine.PipelineEngine": _PIPE_ENGINE,
    "deepspeed.runtime.pipe.engine.PipelineEngine.load_checkpoint": f"{_GETTER}: custom_load_fn (ds loads its own format)",
    "deepspeed.runtime.pipe.engine.PipelineEngine.load_module_state_dict": f"{_GETTER}s: custom_load_fn, fetch_z3_params, z3_params_to_fetch, allowed_missing_keys; it takes the state dict itself",
    "deepspeed.runtime.pipe.engine.PipelineEngine.module_state_dict": f"{_GETTER}: exclude_frozen_parameters",
    "deepspeed.runtime.pipe.topology.PipelineParallelGrid": (
        "ds-pipe's grid takes the groups ds-engine made from the job's one topology (topology, global_rank, "
        "pipe_group, data_group); DeepSpeed's makes its own from a process group. Scripts read it as engine.grid"
    ),
    "deepspeed.runtime.zero.config.DeepSpeedZeroConfig": (
        "a view over ds_config's ZeroConfig: keyword construction only (no positional strict), and the keys of "
        "features ds lacks (zenflow, Muon, ...) are not fields"
    ),
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig": (
        "a view over ds_config's offload section: keyword construction only; super_offload and cpuadam_cores_perc "
        "(SuperOffload) are not fields"
    ),
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig": "a view over ds_config's offload section: keyword construction only (no positional strict)",
    "deepspeed.runtime.precision_config.DeepSpeedFP16Config": "a view over ds_config's fp16 section: keyword construction only (no positional strict)",
    "deepspeed.runtime.precision_config.DeepSpeedBF16Config": "a view over ds_config's bf16 section: keyword construction only (no positional strict)",
    "deepspeed.runtime.config.GRADIENT_CLIPPING_DEFAULT": "ds_config's 0.0; deepspeed.initialize fills DeepSpeed's 1.0 (deepspeed_defaults)",
    "deepspeed.runtime.config.FP16_INITIAL_SCALE_POWER_DEFAULT": "ds_config's 32 (docs/design.md §2); deepspeed.initialize fills DeepSpeed's 16",
    "deepspeed.runtime.config.STEPS_PER_PRINT_DEFAULT": "ds prints every 10 steps (logging only); DeepSpeed never",
    "deepspeed.runtime.config.BFLOAT16_IMMEDIATE_GRAD_UPDATE_DEFAULT": "DeepSpeed's constant says True but its config uses False; ds's constant says what ds uses (False)",
    "deepspeed.comm.comm.init_distributed": (
        "ds's init_distributed (ds-launch) lacks config, rank, world_size: rank and world size come from the "
        "launcher's environment (dist_init_required=False without a process group raises, as in DeepSpeed)"
    ),
    "deepspeed.comm.comm.allgather_fn": "no debug argument (DeepSpeed's comms logger is not in ds)",
    "deepspeed.comm.comm.reduce_scatter_fn": "no prof/debug arguments (DeepSpeed's comms logger is not in ds)",
    "deepspeed.comm.comm.get_global_rank": "group and group_rank are required, as in torch.distributed.get_global_rank",
    "deepspeed.runtime.activation_checkpointing.checkpointing.checkpoint": (
        "no **kwargs: DeepSpeed's are forwarded to the function only by its non-reentrant path; pass them via "
        "functools.partial"
    ),
    "deepspeed.runtime.constants.GRADIENT_CLIPPING_DEFAULT": "ds_config's 0.0; deepspeed.initialize fills DeepSpeed's 1.0 (DEEPSPEED_DEFAULTS)",
    "deepspeed.runtime.constants.FP16_INITIAL_SCALE_POWER_DEFAULT": "ds_config's 32 (docs/design.md §2); deepspeed.initialize fills DeepSpeed's 16",
    "deepspeed.runtime.constants.STEPS_PER_PRINT_DEFAULT": "ds prints every 10 steps (logging only); DeepSpeed never",
    "deepspeed.runtime.constants.BFLOAT16_IMMEDIATE_GRAD_UPDATE_DEFAULT": "DeepSpeed's constant says True but its config uses False; ds's constant says what ds uses (False)",
    "deepspeed.runtime.engine.DeepSpeedEngine.load_checkpoint": f"{_GETTER}: custom_load_fn (ds loads its own format)",
    "deepspeed.runtime.engine.DeepSpeedEngine.load_module_state_dict": f"{_GETTER}s: custom_load_fn, fetch_z3_params, z3_params_to_fetch, allowed_missing_keys; it takes the state dict itself",
    "deepspeed.runtime.engine.DeepSpeedEngine.module_state_dict": f"{_GETTER}: exclude_frozen_parameters",
    "deepspeed.runtime.engine.DeepSpeedEngine.step": f"{_GETTER}: lr_kwargs (arguments for the LR schedule's step)",
    "deepspeed.runtime.zero.partition_parameters.Init": (
        "ds's zero.Init lacks zero_param_parallel_group, sequence_data_parallel_group, param_swapper and "
        "tensor_overrides (sequence parallelism, NVMe; hpZ is the config's zero_hpz_partition_size): pass "
        "the others by keyword"
    ),
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer.backward": "no **kwargs (DeepSpeed forwards them to loss.backward); ds takes retain_graph",
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer.step": "no closure argument (DeepSpeed ignores it too)",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3.backward": "no **kwargs (DeepSpeed forwards them to loss.backward); ds takes retain_graph",
    "deepspeed.dist": "DeepSpeed leaves deepspeed.dist None at import; ds binds it to deepspeed.comm",
    "deepspeed.version": "the DeepSpeed API level with ds's version as local label (0.19.8+ds.X), as deepspeed.__version__",
    "deepspeed.git_version_info.version": "the DeepSpeed API level with ds's version as local label (0.19.8+ds.X)",
    "deepspeed.git_version_info.torch_info": "describes the torch ds runs on (DeepSpeed's records the torch it was built against)",
    "deepspeed.runtime.engine.DeepSpeedEngine": (
        "constructed by deepspeed.initialize() (ds's constructor takes the assembled parts); code that "
        "constructs DeepSpeedEngine directly must call initialize()"
    ),
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer": (
        "ds_zero.ZeroOptimizer's constructor (optimizer, options, ...): built by deepspeed.initialize() from the config"
    ),
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3": (
        "ds_zero.ZeroStage3Optimizer's constructor (module, optimizer, options, ...): built by deepspeed.initialize()"
    ),
}

# Constants whose value depends on the machine (compared by kind only, so the check answers the same on a GPU).
MACHINE_DEPENDENT: dict[str, str] = {
    "deepspeed.git_version_info.accelerator_name": "cpu or cuda, as the machine has",
}

# Provided functions and classes that no test is recorded calling (tools/checks/record_surface_calls.py sees
# Python code run; these run none of their own), each with the test that uses it.
_TORCH_CLASS = "torch.distributed's ReduceOp itself (a C++ class: no Python code of it runs)"
NOT_CALLED: dict[str, str] = {
    "deepspeed.comm.ReduceOp": f"{_TORCH_CLASS}; test_called_ranks.py reduces with ReduceOp.MAX",
    "deepspeed.comm.comm.ReduceOp": f"{_TORCH_CLASS}; test_called_ranks.py reduces with ReduceOp.MAX",
    "deepspeed.runtime.zero.partition_parameters._orig_torch_arange": (
        "torch.arange itself (a builtin: no Python code runs); test_called_helpers.py calls it"
    ),
}
