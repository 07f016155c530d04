"""Do the labels hold on another text? Classify on several texts and compare the heads of each role.

`compare_texts` is the one call: it classifies on each text and compares, as a Result of kind "agreement".
`classify_texts` runs classify once per text; the probes that do not read the text (the repeated random
tokens, the weights, the IOI templates: kinds.Probe.reads_text False) run once and are shared.
`compare_labels` gives, per role, the heads labelled on each text, their Jaccard overlap (heads on every
text over heads on any) and the heads that flip (labelled on some texts, not all), each with its ranking
score on every text beside the cut-off. `shipped_texts` names the held-out texts shipped with headlens:
English (the tiny model's held-out books of the King James Version), Spanish prose and Python source
(headlens/data/texts/README.md gives each one's source and licence).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from headlens.classify import kinds
from headlens.classify.frame import classify_run
from headlens.classify.labels import ClassifyConfig, cut_offs, label_list
from headlens.files import shipped_path
from headlens.probes.inputs import DEFAULT_TEXT_NAME, read_text
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

DATA = Path(__file__).resolve().parent.parent / "data" / "texts"
# name -> file of the shipped texts --compare-texts reads by default
SHIPPED = {"english": None, "spanish": DATA / "heldout_es.txt", "code": DATA / "heldout_code.txt"}


def shipped_texts() -> dict[str, Path]:
    """Name -> path of each held-out text shipped with headlens."""
    return {name: path or shipped_path("tiny") / DEFAULT_TEXT_NAME for name, path in SHIPPED.items()}


def shipped_documents() -> dict[str, str]:
    """Name -> text of each held-out text shipped with headlens."""
    return {name: read_text(path) for name, path in shipped_texts().items()}


def read_texts(paths) -> dict[str, str]:
    """Text files -> {name: text}, named by file name (made unique); InputTextError for a bad file."""
    texts: dict[str, str] = {}
    for path in map(Path, paths):
        name, n = path.stem, 1
        while name in texts:
            n += 1
            name = f"{path.stem}_{n}"
        texts[name] = read_text(path)
    return texts


def compare_texts(
    loaded: LoadedModel, texts: dict[str, str], config: ClassifyConfig | None = None, progress: bool = False
) -> Result:
    """Classify `loaded` on each of `texts` ({name: text}) and compare the labels: a Result of kind
    "agreement" whose `.frame` is compare_labels' table (one row per role some text labels), `.meta["texts"]`
    the texts' names in order, and `.tables[name]` each text's classification (classify_heads' frame)."""
    results = classify_texts(loaded, texts, config, progress)
    tables = {name: result.frame for name, result in results.items()}
    return Result("agreement", compare_labels(results), {"texts": list(texts)}, tables=tables)


def classify_texts(
    loaded: LoadedModel, texts: dict[str, str], config: ClassifyConfig | None = None, progress: bool = False
):
    """{name: classify_heads Result} for each text; the probes that do not read the text run once."""
    results, reuse = {}, None
    for name, text in texts.items():
        results[name], probes = classify_run(loaded, text, config, progress, reuse)
        reuse = reuse or probes
    return results


def _heads(frame: pd.DataFrame, label: str) -> set[str]:
    return {f"{r.layer}.{r.head}" for r in frame.itertuples() if label in label_list(r.labels)}


def compare_labels(results: dict) -> pd.DataFrame:
    """One row per role some text labels: `role`, `heads_<text>` (the heads labelled on that text, sorted
    as "L.H" strings), `jaccard` (heads on every text / heads on any), `flips` (heads on some, not all) and
    `flip_scores` ("L.H score/score/... (cut-off c)": the role's ranking score on each text, in order)."""
    names = list(results)
    frames = {name: result.frame for name, result in results.items()}
    rows = []
    for label in kinds.ROLES + kinds.PROPERTIES:
        held = {name: _heads(frames[name], label) for name in names}
        union = set().union(*held.values())
        if not union:
            continue
        common = set.intersection(*held.values())
        flips = sorted(union - common, key=_head_order)
        row = {"role": label, **{f"heads_{n}": sorted(held[n], key=_head_order) for n in names}}
        row.update(jaccard=len(common) / len(union), flips=flips, flip_scores=_flip_scores(results, label, flips))
        rows.append(row)
    return pd.DataFrame(rows)


def _head_order(head: str) -> tuple[int, int]:
    layer, _, index = head.partition(".")
    return int(layer), int(index)


def _flip_scores(results: dict, label: str, flips: list[str]) -> list[str]:
    """Each flipping head's ranking score on every text, and the cut-off it is read against."""
    column = kinds.BY_LABEL[label].score
    cut = cut_offs(next(iter(results.values())).meta).get(column)
    out = []
    for head in flips:
        layer, index = _head_order(head)
        values = []
        for result in results.values():
            frame = result.frame
            values.append(float(frame.loc[(frame["layer"] == layer) & (frame["head"] == index), column].iloc[0]))
        cut_text = f" (cut-off {cut:g})" if cut is not None else ""
        out.append(f"{head} {'/'.join(f'{v:.3f}' for v in values)}{cut_text}")
    return out
