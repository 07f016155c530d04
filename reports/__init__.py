"""HTML reports: the library's results in, one self-contained HTML file out (installed as headlens.reports).

`build_report(loaded, ...) -> ReportResults` runs everything a page shows once (headlens.reports.pipeline);
`ReportResults.render(path, lang)` writes the page in English or Spanish. `render_report(path, *, model_info,
heads=None, sweep=None, ablation=None, pruning=None, validation=None, training=None, viewer=None, command=None,
text_label=None, lang="en") -> Path` draws given results and never runs a model. Prose comes from one message
catalogue in English or Spanish (headlens.reports.i18n: `t(key, lang)`); the languages a report is written in
are headlens.reports.languages'.

The entry points are re-exported here, imported when first asked for (headlens.lazy.lazy_getattr), so a command
that only needs the catalogue (i18n) or a sentence loads no drawing code. Every module here that draws imports
matplotlib below this package, so this module points matplotlib's folder into headlens's cache first
(`keep_matplotlib_in_cache`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from headlens.files import cache_root
from headlens.lazy import lazy_exports, lazy_getattr

MATPLOTLIB_FOLDER = "matplotlib"  # matplotlib's config and font cache (MPLCONFIGDIR), inside headlens's cache


def keep_matplotlib_in_cache() -> None:
    """Point matplotlib's config and cache folder (MPLCONFIGDIR) at `<headlens's cache>/matplotlib` before
    matplotlib is first imported: on its first import in a home folder matplotlib otherwise writes
    ~/.cache/matplotlib (its font list) and ~/.config/matplotlib, outside headlens's outputs and cache. Left
    alone when the user set MPLCONFIGDIR, or when matplotlib is imported already (its folders are then set)."""
    if not os.environ.get("MPLCONFIGDIR") and "matplotlib" not in sys.modules:
        os.environ["MPLCONFIGDIR"] = str(cache_root() / MATPLOTLIB_FOLDER)


keep_matplotlib_in_cache()

if TYPE_CHECKING:  # the lazily re-exported names, written once (headlens.lazy.lazy_exports reads them)
    from headlens.reports.pipeline import ReportResults, build_report
    from headlens.reports.render import EmptyReportError, render_report

LAZY = lazy_exports(__name__, __file__)  # the names the TYPE_CHECKING imports above name

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a name that is neither
    __getattr__ = lazy_getattr(__name__, LAZY)

__all__ = sorted([*LAZY])
