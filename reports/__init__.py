"""HTML reports: the library's results in, one self-contained HTML file out (installed as headlens.reports).

`build_report(loaded, ...) -> ReportResults` runs everything a page shows once (headlens.reports.pipeline);
`ReportResults.render(path, lang)` writes the page in English or Spanish. `render_report(path, *, model_info,
heads=None, sweep=None, ablation=None, pruning=None, validation=None, training=None, viewer=None, command=None,
text_label=None, lang="en") -> Path` draws given results and never runs a model. Prose comes from one message
catalogue in English or Spanish (headlens.reports.i18n: `t(key, lang)`).
"""

from headlens.reports.render import EmptyReportError, render_report

__all__ = ["EmptyReportError", "ReportResults", "build_report", "render_report"]


def __getattr__(name: str):
    """build_report and ReportResults, imported when first asked for (they bring the classifier and ablation)."""
    if name in ("build_report", "ReportResults"):
        from headlens.reports import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'headlens.reports' has no attribute {name!r}")
