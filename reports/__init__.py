"""HTML reports: DataFrames in, one self-contained HTML file out (installed as headlens.reports).

`render_report(path, *, model_info, heads=None, sweep=None, ablation=None, pruning=None, validation=None,
training=None, viewer=None, command=None, text_label=None, lang="en") -> Path`; never runs a model.
Prose comes from one message catalogue in English or Spanish (headlens.reports.i18n: `t(key, lang)`).
"""

from headlens.reports.render import EmptyReportError, render_report

__all__ = ["EmptyReportError", "render_report"]
