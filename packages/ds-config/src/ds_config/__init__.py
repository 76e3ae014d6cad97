"""pydantic v2 models of the whole DeepSpeed JSON config; batch-size derivation and validation.

Load a config with :func:`load_config` (a dict, a JSON file path, or a base64 JSON string); every
problem comes back at once in one :class:`ConfigError`. Sections are plain pydantic models whose
field names are the JSON keys, e.g. ``cfg.zero_optimization.stage`` or ``cfg.fp16.loss_scale``.
"""

from ._batch import BatchSizes, derive_batch_sizes
from ._compat import (
    AutotuningConfig,
    CometConfig,
    CommsLoggerConfig,
    CSVMonitorConfig,
    CurriculumLearningConfig,
    DataEfficiencyConfig,
    EigenvalueConfig,
    FlopsProfilerConfig,
    HybridEngineConfig,
    ProgressiveLayerDropConfig,
    TensorBoardConfig,
    TorchAutocastConfig,
    WandbConfig,
)
from ._deepspeed_keys import DEEPSPEED_DEFAULTS, DEEPSPEED_REFUSED, deepspeed_refusal
from ._env import EnvironmentVariableError, env_choice, env_flag, env_number
from ._errors import ConfigError, ConfigProblem, ConfigWarning, DeprecatedKeyConflictError
from ._fields import CONFIG_FIELDS, NO_EFFECT, leaf_paths
from ._load import load_config
from ._loss_scale import LossScaleConfig
from ._models import (
    DEFAULT_LEAF_MODULE_CLASSES,
    NATIVE_OPTIMIZERS,
    NATIVE_SCHEDULERS,
    SPARSE_ATTENTION_MODES,
    ActivationCheckpointingConfig,
    AmpConfig,
    BF16Config,
    BigBirdSparseAttentionConfig,
    BSLongformerSparseAttentionConfig,
    CheckpointConfig,
    DenseSparseAttentionConfig,
    DSConfig,
    FixedSparseAttentionConfig,
    FP16Config,
    LeafModuleConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    OptimizerConfig,
    SchedulerConfig,
    SparseAttentionConfig,
    SparseAttentionModeConfig,
    VariableSparseAttentionConfig,
    ZeroConfig,
)
from ._source import read_source
from ._tensor_parallel import LayerSpecConfig, PartitionConfig, TensorParallelConfig, TPGroupConfig

__version__ = "0.1.0"
__all__ = [
    "LayerSpecConfig",
    "LossScaleConfig",
    "PartitionConfig",
    "TensorParallelConfig",
    "TPGroupConfig",
    "read_source",
    "EnvironmentVariableError",
    "env_choice",
    "env_flag",
    "env_number",
    "CONFIG_FIELDS",
    "AutotuningConfig",
    "CSVMonitorConfig",
    "CometConfig",
    "CommsLoggerConfig",
    "CurriculumLearningConfig",
    "DataEfficiencyConfig",
    "EigenvalueConfig",
    "FlopsProfilerConfig",
    "HybridEngineConfig",
    "ProgressiveLayerDropConfig",
    "TensorBoardConfig",
    "TorchAutocastConfig",
    "WandbConfig",
    "NATIVE_OPTIMIZERS",
    "NO_EFFECT",
    "DEEPSPEED_DEFAULTS",
    "DEEPSPEED_REFUSED",
    "deepspeed_refusal",
    "NATIVE_SCHEDULERS",
    "SPARSE_ATTENTION_MODES",
    "ActivationCheckpointingConfig",
    "BatchSizes",
    "AmpConfig",
    "BF16Config",
    "BSLongformerSparseAttentionConfig",
    "BigBirdSparseAttentionConfig",
    "CheckpointConfig",
    "ConfigError",
    "DeprecatedKeyConflictError",
    "ConfigProblem",
    "ConfigWarning",
    "DSConfig",
    "DenseSparseAttentionConfig",
    "FP16Config",
    "FixedSparseAttentionConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "LeafModuleConfig",
    "DEFAULT_LEAF_MODULE_CLASSES",
    "OptimizerConfig",
    "SchedulerConfig",
    "SparseAttentionConfig",
    "SparseAttentionModeConfig",
    "VariableSparseAttentionConfig",
    "ZeroConfig",
    "__version__",
    "derive_batch_sizes",
    "leaf_paths",
    "load_config",
]
