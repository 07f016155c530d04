"""Read by mypy (`make typecheck`, pyproject's [tool.mypy] files), never run: a user's ClassifyConfig with a
threshold field type-checks, because the fields are written out rather than made at run time."""

from headlens import ClassifyConfig

config = ClassifyConfig(retrieval_min=0.2, seed=1)
threshold: float = config.retrieval_min
