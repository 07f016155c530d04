"""headlens: what does each attention head of a transformer language model do?

Library first: load -> capture -> score/classify -> ablate -> report, each a module.
In a notebook, `headlens.show(result)` draws any result inline (headlens.reports.inline).
"""

__version__ = "0.1.0"

import importlib  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Mapping  # noqa: E402
from typing import Any  # noqa: E402

from headlens.errors import HeadlensError  # noqa: E402
from headlens.heads import Head, all_heads, parse_heads  # noqa: E402

__all__ = ["Head", "HeadlensError", "__version__", "all_heads", "parse_heads", "show", "show_attention"]


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` (PEP 562) of a package whose `table` (public name -> its submodule) names
    what it re-exports lazily: a name is imported from its submodule on first access and then kept in the
    package, so `from package import name` works and importing one submodule loads only what it imports."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups find it without this hook
        return value

    return __getattr__


def show(result, heads=None, lang: str = "en") -> None:
    """Display a result inline in a Jupyter or VS Code notebook, self-contained (no network).

    `result`: a classify_heads frame (score heatmaps + label table), a sweep_heads frame (heatmap), an
    ablate_heads dict or a list of them (delta loss with its 95% CI), a prune_curve frame, a validate_model
    frame, load_training_log's (log, heads) pair, or a sample_patterns dict (the interactive attention
    viewer; `heads`, a classify_heads frame, names the labelled heads in its menu). `lang`: "en" or "es", the
    language of the prose. TypeError for anything else; RuntimeError outside IPython. For an object that
    renders as the last expression of a cell, use `headlens.reports.inline.view(result)`.

    headlens.reports is imported here, not at the top of this module: imports point cli -> reports ->
    headlens, and reports imports headlens, so a top-level import would make a cycle and load matplotlib
    and seaborn on every `import headlens`.
    """
    from headlens.reports import inline

    inline.show(result, heads=heads, lang=lang)


def show_attention(
    loaded, text: str, heads=None, max_tokens: int | None = None, repeat: bool = False, lang: str = "en"
) -> None:
    """Display the interactive attention viewer of `text` for a loaded model (click a token, see every head).

    `max_tokens` defaults to the report viewer's length for this model's size; `repeat=True` shows the text's
    start twice, where induction heads show their stripe (headlens.classify.samples.sample_patterns). headlens.reports
    is imported here for the reason given in `show`.
    """
    from headlens.reports import inline

    inline.show(inline.attention_sample(loaded, text, max_tokens=max_tokens, repeat=repeat), heads=heads, lang=lang)
