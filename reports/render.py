"""render_report: the library's results in, one self-contained HTML file out, written atomically.

Self-contained: figures are data URIs, the style sheet and the script are inline, and a
Content-Security-Policy forbids every network request (only data: images, the inline style, and
the one inline script whose hash is pinned). The page never runs a model.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
from importlib import resources
from pathlib import Path

import pandas as pd
from headlens.reports import sections
from headlens.reports import viewer as viewer_mod

from headlens import __version__, files
from headlens.errors import HeadlensError, OutputPathError

# Characters of the sample text quoted in the summary (the viewer holds the tokens themselves).
TEXT_EXCERPT_CHARS = 600


class EmptyReportError(HeadlensError, ValueError):
    """Nothing to report: every result was missing or empty."""


def _asset(name: str) -> str:
    return (resources.files("headlens.reports") / name).read_text(encoding="utf-8")


def _is_empty(value) -> bool:
    if value is None:
        return True
    if isinstance(value, pd.DataFrame):
        return value.empty
    if isinstance(value, tuple):  # training: (log_df, heads_df)
        return value[0] is None or value[0].empty
    if isinstance(value, dict) and "tokens" in value:  # viewer
        return len(value["tokens"]) == 0
    if isinstance(value, list):
        return len(value) == 0
    return False


def check_output_path(path) -> Path:
    """Resolve the output path; OutputPathError if it is a directory or its folder cannot be made/written."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"output path {path} is a directory: give a file name such as {path / 'report.html'}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create the folder of {path}: {exc.strerror or exc}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {path}: folder {parent} is not writable")
    return path


def write_atomic(path: Path, text: str) -> None:
    """headlens.files.write_atomic, with a failure reported as OutputPathError."""
    try:
        files.write_atomic(path, text)
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from None


def render_report(path, *, model_info: dict, heads=None, sweep=None, ablation=None, pruning=None,
                  validation=None, training=None, viewer=None, command=None, text_label=None) -> Path:
    """Write one self-contained HTML report to `path` and return it.

    Inputs are the library's results (schemas in notes/contracts): `heads` from classify_heads,
    `sweep` from sweep_heads, `ablation` an ablate_heads dict (or a list of them), `pruning` from
    prune_curve, `validation` from validate_model, `training` the (log_df, heads_df) pair of
    load_training_log, `viewer` the sample_patterns dict (tokens, patterns [n_layers, n_heads, pos, pos]).
    Raises OutputPathError for a directory or unwritable path, EmptyReportError when every result is
    missing or empty.
    """
    path = check_output_path(path)
    results = {"heads": heads, "sweep": sweep, "ablation": ablation, "pruning": pruning,
               "validation": validation, "training": training, "viewer": viewer}
    present = {name: value for name, value in results.items() if not _is_empty(value)}
    if not present:
        raise EmptyReportError(f"nothing to report for {path}: every result (heads, sweep, ablation, pruning, "
                               "validation, training, viewer) is missing or empty")
    page = build_page(model_info=model_info, command=command, text_label=text_label, **{
        name: present.get(name) for name in results})
    write_atomic(path, page)
    return path


def build_page(*, model_info, command, text_label, heads, sweep, ablation, pruning, validation, training,
               viewer) -> str:
    """The whole HTML document as a string, sections in reading order."""
    excerpt = (viewer or {}).get("text")
    if isinstance(excerpt, str) and len(excerpt) > TEXT_EXCERPT_CHARS:
        excerpt = excerpt[:TEXT_EXCERPT_CHARS] + " [...]"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [sections.summary_section(model_info, version=__version__, date=date, command=command,
                                     text_label=text_label, text_excerpt=excerpt)]
    nav = [("summary", "Summary")]
    if heads is not None:
        body.append(sections.scores_section(heads))
        nav.append(("scores", "Scores"))
    if viewer is not None:
        body.append(sections.thumbnails_section(heads, viewer))
        body.append(viewer_mod.viewer_section(viewer, heads))
        nav += [("thumbnails", "Patterns"), ("viewer", "Viewer")]
    if sweep is not None or ablation is not None or pruning is not None:
        body.append(sections.ablation_section(sweep, ablation, pruning))
        nav.append(("ablation", "Ablation"))
    if validation is not None:
        body.append(sections.validation_section(validation))
        nav.append(("validation", "Validation"))
    if training is not None:
        body.append(sections.training_section(training))
        nav.append(("training", "Training"))
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
           "form-action 'none'; base-uri 'none'")
    title = sections.esc(f"headlens report: {model_info.get('name', 'model')}")
    links = " ".join(f'<a href="#{anchor}">{label}</a>' for anchor, label in nav)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
            f"<style>\n{_asset('report.css')}</style>\n</head>\n<body>\n<h1>{title}</h1>\n<nav>{links}</nav>\n"
            + "".join(body) + f"<script>{script}</script>\n</body>\n</html>\n")
