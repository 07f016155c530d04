"""render_report: the library's results in, one self-contained HTML file out, written atomically.

Self-contained: figures are data URIs, the style sheet and the script are inline, and a
Content-Security-Policy forbids every network request (only data: images, the inline style, and
the one inline script whose hash is pinned). The page never runs a model.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import tempfile
from importlib import resources
from pathlib import Path

import pandas as pd

from headlens import __version__, files
from headlens.errors import HeadlensError, OutputPathError
from headlens.reports import circuits as circuits_mod
from headlens.reports import findings, sections, stability, thumbnails
from headlens.reports import viewer as viewer_mod
from headlens.reports.circuit_figures import page_document
from headlens.reports.i18n import DEFAULT_LANG, check_lang, t
from headlens.results import Result

# Characters of the sample text quoted in the summary (the viewer holds the tokens themselves).
TEXT_EXCERPT_CHARS = 600


class EmptyReportError(HeadlensError, ValueError):
    """Nothing to report: every result was missing or empty."""


def _asset(name: str) -> str:
    return (resources.files("headlens.reports") / name).read_text(encoding="utf-8")


# The report's inputs that are headlens Results, each named for its kind (headlens.results.KINDS).
RESULT_KINDS = ("heads", "sweep", "ablation", "pruning", "validation", "training")


def check_results(results: dict) -> None:
    """TypeError unless each of RESULT_KINDS is None or a Result of its kind (`ablation`: one or a list): a bare
    DataFrame (a Result's `.frame`, or a pd.concat of them) has lost the metadata the page states."""
    for kind in RESULT_KINDS:
        name = kind
        value = results.get(name)
        values = value if isinstance(value, list) and name == "ablation" else [value]
        for item in values:
            if item is not None and not (isinstance(item, Result) and item.kind == kind):
                raise TypeError(
                    f"the report's `{name}` is a {kind} Result (what the stage function returns), not a "
                    f"{type(item).__name__}: a frame alone has lost its metadata; combine results with "
                    "headlens.concat_results"
                )


def _is_empty(value) -> bool:
    if value is None:
        return True
    if isinstance(value, Result):
        return len(value) == 0
    if isinstance(value, pd.DataFrame):
        return value.empty
    if isinstance(value, list):
        return len(value) == 0
    return False


def check_output_path(path, lang: str = DEFAULT_LANG, option: str = "--out") -> Path:
    """Resolve the output path given as `option` (--out, --report); OutputPathError (in `lang`, naming the
    option) if it is a directory, a link, a device, FIFO or socket (headlens.files.special_kind), or its folder
    cannot be made/written."""
    path = Path(path)
    kind = files.special_kind(path)
    if kind == "directory":
        raise OutputPathError(t("error.is_directory", lang, option=option, path=path))
    if kind is not None:
        raise OutputPathError(
            t("error.not_regular_file", lang, option=option, path=path, kind=t(f"file_kind.{kind}", lang))
        )
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(t("error.cannot_create_folder", lang, path=path, reason=exc.strerror or exc)) from None
    try:  # the real test (os.access says yes to root on a read-only file system)
        probe = tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".check")
    except OSError:
        raise OutputPathError(t("error.folder_not_writable", lang, path=path, folder=parent)) from None
    probe.close()
    return path


def write_atomic(path: Path, text: str, lang: str = DEFAULT_LANG) -> None:
    """headlens.files.write_atomic, with a failure reported once, as OutputPathError in `lang`."""
    try:
        files.write_atomic(path, text)
    except OutputPathError as exc:
        reason = exc.__context__.strerror if isinstance(exc.__context__, OSError) else None
        if not reason:
            raise
        raise OutputPathError(t("error.cannot_write", lang, path=path, reason=reason)) from None
    except OSError as exc:
        raise OutputPathError(t("error.cannot_write", lang, path=path, reason=exc.strerror or exc)) from None


def render_report(
    path,
    *,
    model_info: dict,
    heads=None,
    sweep=None,
    ablation=None,
    pruning=None,
    validation=None,
    training=None,
    viewer=None,
    circuits=None,
    command=None,
    text_label=None,
    lang: str = DEFAULT_LANG,
) -> Path:
    """Write one self-contained HTML report to `path` and return it.

    Inputs are the library's results (headlens.Result; each schema in its function's docstring): `heads` from
    classify_heads, `sweep` from sweep_heads, `ablation` an ablate_heads Result (or a list of them), `pruning`
    from prune_curve, `validation` from validate_model, `training` from
    load_training_log, `viewer` from sample_patterns (tokens, patterns [n_layers, n_heads, pos, pos]),
    `circuits` a list, one per task, of headlens.circuits.request.run_circuit Results (a circuit, or one found on
    the whole graph) or their documents (headlens.circuits.request.circuit_document).
    `lang` ("en" or "es", headlens.reports.i18n.LANGS) is the language of every piece of prose,
    error messages included. Raises ConfigError for an unknown language, OutputPathError for a
    directory or unwritable path, EmptyReportError when every result is missing or empty.
    """
    lang = check_lang(lang)
    path = check_output_path(path, lang)
    circuits = None if circuits is None else [page_document(item, model_info) for item in circuits]
    results = {
        "heads": heads,
        "sweep": sweep,
        "ablation": ablation,
        "pruning": pruning,
        "validation": validation,
        "training": training,
        "viewer": viewer,
        "circuits": circuits,
    }
    check_results(results)
    present = {name: value for name, value in results.items() if not _is_empty(value)}
    if not present:
        raise EmptyReportError(t("error.nothing_to_report", lang, path=path))
    page = build_page(
        model_info=model_info,
        command=command,
        text_label=text_label,
        lang=lang,
        **{name: present.get(name) for name in results},
    )
    write_atomic(path, page, lang)
    return path


def build_page(
    *,
    model_info,
    command,
    text_label,
    heads,
    sweep,
    ablation,
    pruning,
    validation,
    training,
    viewer,
    circuits=None,
    lang: str = DEFAULT_LANG,
) -> str:
    """The whole HTML document as a string: what the heads do first, then the details in reading order."""
    facts = viewer.meta if viewer is not None else {}  # the viewer's sample
    excerpt = once(facts.get("text"), bool(facts.get("repeated")))
    if isinstance(excerpt, str) and len(excerpt) > TEXT_EXCERPT_CHARS:
        excerpt = excerpt[:TEXT_EXCERPT_CHARS] + " [...]"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body, nav = [], []

    def add(anchor: str, html: str) -> None:
        if html:
            body.append(html)
            nav.append((anchor, t(f"nav.{anchor.replace('-', '_')}", lang)))

    if heads is not None:
        add("findings", findings.findings_section(heads, sweep, ablation, lang, circuits))
    add(
        "summary",
        sections.summary_section(
            model_info,
            version=__version__,
            date=date,
            command=command,
            text_label=text_label,
            text_excerpt=excerpt,
            lang=lang,
            repeated=excerpt != facts.get("text"),
            random_sample=facts.get("sample") == "random_tokens",
        ),
    )
    if heads is not None:
        add("kv-groups", findings.kv_groups_section(heads.frame, lang))
        add("scores", sections.scores_section(heads, lang))
        add("stability", stability.stability_section(heads, lang))
    if viewer is not None:
        frame = None if heads is None else heads.frame
        add("thumbnails", thumbnails.thumbnails_section(frame, viewer, lang))
        add("viewer", viewer_mod.viewer_section(viewer, frame, lang))
    if sweep is not None or ablation is not None or pruning is not None:
        add("ablation", sections.ablation_section(sweep, ablation, pruning, lang))
        if sweep is None and ablation is None:  # a pruning page: named for what it holds
            nav[-1] = ("ablation", t("nav.pruning", lang))
    if circuits:
        n_heads = int(model_info.get("n_layers", 0)) * int(model_info.get("n_heads", 0))
        add("circuits", circuits_mod.circuit_section(circuits, lang, folded=n_heads > sections.FOLD_HEADS))
    if validation is not None:
        add("validation", sections.validation_section(validation, lang))
    if training is not None:
        add("training", sections.training_section(training, lang))
    return page_html(title=t("page.title", lang, name=sections.display_name(model_info)), nav=nav, body=body, lang=lang)


def once(text, repeated: bool):
    """A repeated sample's text (the segment twice, no separator) as its one segment; other text as it is."""
    if not repeated or not isinstance(text, str) or len(text) % 2:
        return text
    half = len(text) // 2
    return text[:half] if text[:half] == text[half:] else text


def page_html(*, title: str, nav: list[tuple[str, str]], body: list[str], lang: str) -> str:
    """The document around the sections: CSP pinned to the one inline script, style, messages for the script."""
    script = viewer_mod.report_script()
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = (
        f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
        "form-action 'none'; base-uri 'none'"
    )
    title = sections.esc(title)
    links = " ".join(f'<a href="#{anchor}">{sections.esc(label)}</a>' for anchor, label in nav)
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
        f"<style>\n{_asset('report.css')}</style>\n</head>\n<body>\n<h1>{title}</h1>\n<nav>{links}</nav>\n"
        + "".join(body)
        + viewer_mod.messages_block(lang)
        + f"\n<script>{script}</script>\n</body>\n</html>\n"
    )
