"""Classify: every head's scores -> its labels, with the evidence behind each. `kinds` is the registry of head
kinds (one entry per kind: its probe, score columns, rule and paper); `labels` holds the rules and their cut-offs
(ClassifyConfig); `runs` streams each probe once over its input; `frame` turns the runs into the labelled
DataFrame (`classify_heads`); `samples` picks the attention viewer's sample by the labelled heads; `roles`
reads a labels file or the classification into the heads of a role (ablation and circuits read it).

The entry points are re-exported here, imported when first asked for (headlens.lazy.lazy_getattr, PEP 562): reading
the registry (`from headlens.classify import kinds`) loads no scoring code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.lazy import lazy_exports, lazy_getattr

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.classify.compare import compare_texts
    from headlens.classify.frame import (
        SCORE_COLUMNS,
        SOURCE_COLUMNS,
        SOURCE_DEFAULT,
        classify_heads,
        head_records,
    )
    from headlens.classify.labels import ClassifyConfig

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)

__all__ = sorted([*LAZY])
