"""HTML reports: the library's results in, one self-contained HTML file out (installed as headlens.reports).

`build_report(loaded, ...) -> ReportResults` runs everything a page shows once (headlens.reports.pipeline);
`ReportResults.render(path, lang)` writes the page in English or Spanish. `render_report(path, *, model_info,
heads=None, sweep=None, ablation=None, pruning=None, validation=None, training=None, viewer=None, command=None,
text_label=None, lang="en") -> Path` draws given results and never runs a model. Prose comes from one message
catalogue in English or Spanish (headlens.reports.i18n: `t(key, lang)`); the languages a report is written in
are headlens.reports.languages'.

The public names are re-exported here, each imported when first asked for (headlens.lazy.lazy_getattr, PEP 562),
so importing one submodule (the languages, which every command's `--lang` checks) loads no page code and no
matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headlens.lazy import lazy_exports, lazy_getattr

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.reports.pipeline import ReportResults, build_report
    from headlens.reports.render import EmptyReportError, render_report

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)


__all__ = sorted(LAZY)
