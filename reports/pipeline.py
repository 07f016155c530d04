"""The report pipeline: a loaded model in, every result a report page shows out, in any language.

    import headlens

    results = headlens.build_report(headlens.load_model("tiny"), heads_to_ablate="1.0,1.2")
    results.render("out/report.html")            # English
    results.render("out/report.es.html", "es")   # Spanish, from the same run: nothing is computed again

`build_report` classifies every head, validates the attention maths, ablates what it is asked to (the
chosen heads alone and together, every head alone with `sweep`, the role sets against random controls),
computes the pruning curve with `prune`, draws how the heads work together (composition from the weights,
direct effects on the induction and IOI tasks: headlens.circuits.overview), and samples the viewer's
patterns. It returns a `ReportResults`, the library's own results (headlens.Result each, schemas in their
functions' docstrings);
`ReportResults.render(path, lang)` writes one page from them (headlens.reports.render.render_report) and
never runs the model. `headlens report`, the notebooks and the explorer call these two.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from headlens.ablation.ablate import ablate_heads, role_experiments, sweep_heads
from headlens.ablation.prune import prune_curve
from headlens.circuits.overview import overview_documents
from headlens.classify import classify_heads
from headlens.classify.roles import frame_labels
from headlens.classify.samples import sample_patterns
from headlens.heads import parse_heads
from headlens.probes.corpus import first_document
from headlens.probes.inputs import default_text
from headlens.reports.facts import model_info
from headlens.reports.i18n import DEFAULT_LANG, t
from headlens.reports.render import render_report
from headlens.reports.viewer import default_viewer_tokens
from headlens.results import Result
from headlens.training import load_training_log
from headlens.validate import validate_model

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel


@dataclass
class ReportResults:
    """Everything one report page shows, computed once; `render` writes it in any language."""

    model_info: dict  # the model's name and shape facts (model_info(loaded))
    heads: Result | None = None  # classify_heads
    sweep: Result | None = None  # sweep_heads: every head alone
    ablation: list[Result] | None = None  # ablate_heads results: chosen heads together, role sets with controls
    pruning: Result | None = None  # prune_curve
    validation: Result | None = None  # validate_model
    training: Result | None = None  # load_training_log's Result, for a model that ships its log
    viewer: Result | None = None  # sample_patterns
    circuits: list[dict] | None = None  # overview_documents: how the heads work together, one per task
    command: str | None = None  # the command line that rebuilds the page
    text_label: str | None = None  # the text's name (None: the shipped default text, named in each language)

    def render(self, path, lang: str = DEFAULT_LANG) -> Path:
        """Write the page in `lang` to `path` (replaced atomically) and return the path."""
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "text_label"}
        return render_report(path, **kept, text_label=self.text_label or t("text_label.default", lang), lang=lang)


def training_logs(loaded: LoadedModel) -> Result | None:
    """load_training_log's Result when the model folder holds a training log (the shipped tiny model does)."""
    folder = loaded.path
    if folder is None or not (folder / "training_log.csv").is_file() or not (folder / "training_heads.csv").is_file():
        return None
    return load_training_log(folder)


def build_report(
    loaded: LoadedModel,
    *,
    text: str | None = None,
    text_label: str | None = None,
    heads_to_ablate=None,
    sweep: bool = False,
    prune: bool = False,
    controls: int = 20,
    viewer_tokens: int | None = None,
    seed: int = 0,
    progress: bool = False,
    command: str | None = None,
    circuits: bool = True,
) -> ReportResults:
    """Classify, validate and ablate `loaded` on `text` (None: the shipped default text) and sample the viewer.

    heads_to_ablate: heads ablated alone and together ("L.H,L.H", "layer:L", `all` or a list of Head);
    sweep: every head alone (sweep_heads; then the chosen heads' single results are its rows);
    prune: the pruning curve (prune_curve); controls: the induction and retrieval heads against this many
    random head sets of the same per-layer counts (0: skip); viewer_tokens: the viewer's sample length
    (None: default_viewer_tokens); circuits: the "How the heads work together" documents from composition and
    one run per task (headlens.circuits.overview). `text_label` names the text on the page, `command` rebuilds it.
    """
    spec = loaded.spec
    chosen = parse_heads(heads_to_ablate, spec.n_layers, spec.n_heads) if isinstance(heads_to_ablate, str) else None
    chosen = chosen or (list(heads_to_ablate) if heads_to_ablate else [])  # a bad spec fails before any work
    heads = classify_heads(loaded, text=text, progress=progress)
    labels = frame_labels(heads.frame)
    swept = sweep_heads(loaded, text=text, seed=seed, progress=progress) if sweep else None
    ablation = chosen_ablations(loaded, chosen, text, seed, progress, alone=swept is None)
    if controls:
        ablation += role_experiments(loaded, control=controls, seed=seed, labels=labels, progress=progress)
    n_sample = viewer_tokens or default_viewer_tokens(spec.n_layers, spec.n_heads, spec.n_ctx)
    induction = [head for head, names in labels.items() if "induction" in names]
    return ReportResults(
        model_info=model_info(loaded),
        heads=heads,
        sweep=swept,
        ablation=ablation or None,
        pruning=prune_curve(loaded, text=text, progress=progress) if prune else None,
        validation=validate_model(loaded, first_document(text), raise_on_failure=False),
        training=training_logs(loaded),
        viewer=sample_patterns(
            loaded, first_document(text) or default_text(), n_sample, repeat=True, induction_heads=induction
        ),
        circuits=overview_documents(loaded, labels, seed) if circuits else None,
        command=command,
        text_label=text_label,
    )


def chosen_ablations(
    loaded: LoadedModel, heads: list, text, seed: int, progress: bool, alone: bool = True
) -> list[Result]:
    """ablate_heads results of `heads`: each alone (when `alone`; a sweep already holds them), then all of
    them together; [] without heads."""
    results = [ablate_heads(loaded, [head], text=text, seed=seed, progress=progress) for head in heads] if alone else []
    if len(heads) > 1:
        results.append(ablate_heads(loaded, heads, text=text, seed=seed, progress=progress))
    return results
