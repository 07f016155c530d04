"""headlens: what does each attention head of a transformer language model do?

Library first: load -> capture -> probes -> scores -> classify -> ablation -> reports, a folder each (README).
The stages' entry points are the package's public names, imported when first used (PEP 562), so `import
headlens` stays light:

    import headlens
    loaded = headlens.load_model("tiny")
    heads = headlens.classify_heads(loaded)           # one row per head, its scores and labels
    result = headlens.ablate_heads(loaded, "1.0")     # the loss with and without head 1.0
    sweep = headlens.sweep_heads(loaded)              # every head alone, exact
    curve = headlens.prune_curve(loaded)              # loss as heads are removed
    checks = headlens.validate_model(loaded)          # the from-scratch attention against the library
    report = headlens.build_report(loaded)            # every result a report page shows; .render(path)

Each is a `headlens.Result` (headlens.results): `.frame` (a DataFrame), `.meta` (what it was measured
under), `.to_json()`; `headlens.concat_results` combines results without losing their metadata. The circuits'
entry points (make_task, circuit, composition_scores, path_patch, edge_attribution, self_repair) are here too.
In a notebook a result draws itself inline (`headlens.view`, headlens.reports.inline); `headlens.show(result)`
displays it at once.
"""

__version__ = "0.1.0"

from typing import TYPE_CHECKING  # noqa: E402

from headlens import results as _results  # noqa: E402
from headlens.errors import HeadlensError  # noqa: E402
from headlens.heads import Head, all_heads, parse_heads  # noqa: E402
from headlens.lazy import lazy_exports, lazy_getattr  # noqa: E402

# Public name -> the module (below headlens) that defines it, imported on first access: the names the
# TYPE_CHECKING imports at the end of this module name, written there once (headlens.lazy.lazy_exports).
LAZY = lazy_exports(__name__, __file__)

__all__ = sorted(
    ["Head", "HeadlensError", "__version__", "all_heads", "parse_heads", "show", "show_attention", "view", *LAZY]
)


def show(result, heads=None, lang: str = "en") -> None:
    """Display a result inline in a Jupyter or VS Code notebook, self-contained (no network).

    `result`: a Result of classify_heads (score heatmaps + label table), sweep_heads (heatmap), ablate_heads
    (delta with its 95% CI; a list of them too), prune_curve, validate_model, the circuits' functions (edge
    tables, circuit, self_repair), load_training_log, or sample_patterns (the
    interactive attention viewer; `heads`, a classify_heads Result, names the labelled heads in its menu).
    `lang`: "en" or "es", the language of the prose. TypeError for anything else; RuntimeError outside
    IPython. For an object that renders as the last expression of a cell, use `view(result)`.

    headlens.reports is imported here, not at the top of this module: imports point cli -> reports ->
    headlens, and reports imports headlens, so a top-level import would make a cycle and load matplotlib
    and seaborn on every `import headlens`.
    """
    from headlens.reports import inline

    inline.show(result, heads=heads, lang=lang)


def view(result, heads=None, lang: str = "en"):
    """`result` (as for `show`) as an object that renders itself as the last expression of a notebook cell;
    its `.html()` is the fragment. headlens.reports is imported here for the reason given in `show`."""
    from headlens.reports import inline

    return inline.view(result, heads=heads, lang=lang)


def _html_view(result) -> str:
    """A Result's notebook fragment (headlens.results.HTML_VIEW): `view(result).html()`."""
    return view(result).html()


_results.HTML_VIEW = _html_view


def show_attention(
    loaded: "LoadedModel", text: str, heads=None, max_tokens: int | None = None, repeat: bool = False, lang: str = "en"
) -> None:
    """Display the interactive attention viewer of `text` for a loaded model (click a token, see every head).

    `max_tokens` defaults to the report viewer's length for this model's size; `repeat=True` shows the text's
    start twice, where induction heads show their stripe (headlens.classify.samples.sample_patterns). headlens.reports
    is imported here for the reason given in `show`.
    """
    from headlens.reports import inline

    inline.show(inline.attention_sample(loaded, text, max_tokens=max_tokens, repeat=repeat), heads=heads, lang=lang)


if TYPE_CHECKING:  # the lazily re-exported names, written once (LAZY above reads them)
    from headlens.ablation.ablate import ablate_heads, sweep_heads
    from headlens.ablation.prune import prune_curve
    from headlens.circuits.attribution import edge_attribution
    from headlens.circuits.circuit import circuit
    from headlens.circuits.composition import composition_scores
    from headlens.circuits.paths import path_patch
    from headlens.circuits.selfrepair import self_repair
    from headlens.circuits.tasks import make_task
    from headlens.classify.frame import classify_heads
    from headlens.classify.labels import ClassifyConfig
    from headlens.load.models import LoadedModel, load_model
    from headlens.reports.pipeline import build_report
    from headlens.results import Result, concat_results
    from headlens.validate.check import validate_model
else:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)
