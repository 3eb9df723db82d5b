"""RT-J's public names, as docs/relational.md imports them (the family itself lives in
relay_engine.families.rtj): the model, its checkpoints, the trainer, and the way from a
relational database to labelled contexts.

    from relay_engine.relational import RelationalTrainer, RelationalTrainingArguments, RelationalTransformer
"""

from relay_engine.families.rtj.batch import (
    BATCH_FIELDS,
    MAX_PARENTS,
    SEM_BOOLEAN,
    SEM_DATETIME,
    SEM_NUMBER,
    SEM_TEXT,
    RelationalBatch,
    collate,
)
from relay_engine.families.rtj.evaluators import (
    BinaryClassificationEvaluator,
    RegressionEvaluator,
    SequentialEvaluator,
)
from relay_engine.families.rtj.heads import FineTunedHead, HeadError, fit_feature_head
from relay_engine.families.rtj.losses import (
    BinaryClassificationLoss,
    ListwiseRankingLoss,
    MulticlassClassificationLoss,
    MultilabelClassificationLoss,
    RegressionLoss,
    loss_for,
)
from relay_engine.families.rtj.network import (
    NAMED_CONFIGS,
    OUTPUT_VIEWS,
    ModelOutput,
    RTJConfig,
    RTJNetwork,
    parameter_count,
)
from relay_engine.families.rtj.onnx_runtime import DEFAULT_ONNX_MODEL
from relay_engine.families.rtj.trainer import (
    RelationalDataset,
    RelationalExample,
    RelationalTrainer,
    RelationalTrainingArguments,
)
from relay_engine.families.rtj.transformer import DEFAULT_MODEL, RelationalTransformer, TaskHead

__all__ = [
    "BATCH_FIELDS",
    "DEFAULT_MODEL",
    "DEFAULT_ONNX_MODEL",
    "MAX_PARENTS",
    "NAMED_CONFIGS",
    "OUTPUT_VIEWS",
    "SEM_BOOLEAN",
    "SEM_DATETIME",
    "SEM_NUMBER",
    "SEM_TEXT",
    "BinaryClassificationEvaluator",
    "BinaryClassificationLoss",
    "FineTunedHead",
    "HeadError",
    "ListwiseRankingLoss",
    "ModelOutput",
    "MulticlassClassificationLoss",
    "MultilabelClassificationLoss",
    "RTJConfig",
    "RTJNetwork",
    "RegressionEvaluator",
    "RegressionLoss",
    "RelationalBatch",
    "RelationalDataset",
    "RelationalExample",
    "RelationalTrainer",
    "RelationalTrainingArguments",
    "RelationalTransformer",
    "SequentialEvaluator",
    "TaskHead",
    "collate",
    "fit_feature_head",
    "loss_for",
    "parameter_count",
]
