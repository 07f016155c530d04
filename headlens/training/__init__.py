"""Training the embedded tiny models on CPU: recipe (config), data, per-checkpoint evaluation, loop."""

from headlens.training.config import ARCHS, TrainConfig, recipe, stages
from headlens.training.data import PRINTABLE, byte_tokenizer, load_corpus, lr_at, sample_batch
from headlens.training.loop import HEAD_COLUMNS, LOG_COLUMNS, load_training_log, train_tiny

__all__ = [
    "ARCHS",
    "HEAD_COLUMNS",
    "LOG_COLUMNS",
    "PRINTABLE",
    "TrainConfig",
    "byte_tokenizer",
    "load_corpus",
    "load_training_log",
    "lr_at",
    "recipe",
    "sample_batch",
    "stages",
    "train_tiny",
]
