"""The top of the report: what the heads do, per role, with the evidence; and key/value groups.

Findings list, for every role of headlens.labels.LABELS that some head earned, how many heads and
which, strongest first (explain.ROLE_EVIDENCE), with the scores that earned the label and, where
the report ablated that head alone (a sweep or a single-head ablation), the change in loss without
it. Grouped-query models (a `kv_group` column: the key/value head each query head reads) also get
their groups: which query heads share K and V, and whether they took the same role.
"""

from __future__ import annotations

import math

import pandas as pd

from headlens.classify import SOURCE_COLUMNS, SOURCE_DEFAULT, SOURCE_GIVEN
from headlens.labels import LABELS
from headlens.reports import explain
from headlens.reports.i18n import DEFAULT_LANG, has, number, t
from headlens.reports.sections import esc, label_list, section, table


def single_head_ablations(sweep: pd.DataFrame | None, ablation) -> dict[str, dict]:
    """{"L.H": {delta, low, high, metric}} for every head ablated alone; the sweep wins over a single run."""
    found = {}
    results = [] if ablation is None else [ablation] if isinstance(ablation, dict) else list(ablation)
    for result in results:
        if len(result.get("heads", [])) == 1:
            low, high = (result.get("ci95") or [math.nan, math.nan])[:2]
            found[str(result["heads"][0])] = {"delta": float(result["delta_loss"]), "low": float(low),
                                              "high": float(high), "metric": result.get("metric", "text")}
    if sweep is not None:
        metric = sweep.attrs.get("metric", "text")
        for row in sweep.to_dict("records"):
            found[f"{int(row['layer'])}.{int(row['head'])}"] = {
                "delta": float(row["delta_loss"]), "low": float(row.get("ci95_low", math.nan)),
                "high": float(row.get("ci95_high", math.nan)), "metric": row.get("metric", metric)}
    return found


def score_text(row: dict, column: str, lang: str) -> str | None:
    """"prefix matching 0.87" (an offset as an integer); None when the frame lacks the score."""
    value = row.get(column)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    shown = str(int(value)) if column == "positional_offset" else number(value, lang)
    return f"{t(f'short.{column}', lang)} {shown}"


def ablation_text(found: dict, lang: str) -> str:
    """"ablation raises the loss on the text by 2.10 nats/token (95% CI 1.90 to 2.30)"."""
    metric_key = f"metric.{found['metric']}"
    metric = t(metric_key, lang) if has(metric_key, lang) else str(found["metric"])
    key = "findings.ablation_up" if found["delta"] >= 0 else "findings.ablation_down"
    text = t(key, lang, metric=metric, delta=number(abs(found["delta"]), lang))
    if not (math.isnan(found["low"]) or math.isnan(found["high"])):
        text += f" ({t('findings.ci', lang, low=number(found['low'], lang), high=number(found['high'], lang))})"
    return text


def head_line(row: dict, role: str, ablations: dict, lang: str) -> str:
    """One head's evidence for one role: "5.1 induction: prefix matching 0.87, copying 0.64, ablation ..."."""
    head = f"{int(row['layer'])}.{int(row['head'])}"
    pieces = [text for column in explain.ROLE_EVIDENCE[role] if (text := score_text(row, column, lang))]
    if role == "retrieval" and isinstance(row.get("n_needle_tests"), (int, float)) and "n_needle_retrieved" in row:
        pieces.append(t("findings.retrieved", lang, n_retrieved=int(row["n_needle_retrieved"]),
                        n_tests=int(row["n_needle_tests"])))
    if head in ablations:
        pieces.append(ablation_text(ablations[head], lang))
    line = t("findings.head_line", lang, head="\0", label=role, scores=", ".join(pieces))
    before, _, after = esc(line).partition("\0")
    return f'<li data-head="{esc(head)}">{before}<strong>{esc(head)}</strong>{after}</li>'


def findings_section(heads: pd.DataFrame, sweep=None, ablation=None, lang: str = DEFAULT_LANG) -> str:
    """Per role: how many heads and which (strongest first), their key scores, ablation evidence."""
    records = heads.sort_values(["layer", "head"]).to_dict("records")
    labels = [label_list(row.get("labels")) for row in records]
    n_labelled = sum(1 for names in labels if names)
    ablations = single_head_ablations(sweep, ablation)
    intro = t("findings.intro", lang, n_labelled=n_labelled, n_heads=len(records), n_none=len(records) - n_labelled)
    if ablations:
        intro += " " + t("findings.intro_ablation", lang)
    parts = [f"<p>{esc(intro)}</p>" if n_labelled else f"<p>{esc(t('findings.no_roles', lang))}</p>"]
    for role in LABELS:
        rows = [row for row, names in zip(records, labels, strict=True) if role in names]
        if not rows:
            continue
        rows.sort(key=lambda row: -explain.role_strength(row, role))  # stable: (layer, head) breaks ties
        items = "".join(head_line(row, role, ablations, lang) for row in rows)
        heading = t("findings.role_heading", lang, role=t(f"role.{role}", lang), n=len(rows))
        parts.append(f'<div class="role" id="role-{esc(role)}"><h3>{esc(heading)}</h3>'
                     f'<p class="explain">{esc(t(f"role_what.{role}", lang))}</p><ul>{items}</ul></div>')
    parts.append(sources_table(heads, lang))
    parts.append(f"<p>{esc(t('findings.details', lang))}</p>")
    return section("findings", t("findings.title", lang), "\n".join(part for part in parts if part))


def probe_sources(heads: pd.DataFrame) -> dict[str, str]:
    """Probe -> where its input came from: `attrs["sources"]`, else the `*_source` columns (a frame
    read back from CSV or JSON); {} when neither was recorded."""
    sources = dict(heads.attrs.get("sources") or {})
    for probe, column in SOURCE_COLUMNS.items():
        if probe not in sources and column in heads and len(heads):
            sources[probe] = str(heads[column].iloc[0])
    return sources


def sources_table(heads: pd.DataFrame, lang: str) -> str:
    """Where each probe's input came from, a fallback to the shipped text said in words."""
    sources = probe_sources(heads)
    if not sources:
        return ""
    rows = []
    for probe, source in sources.items():
        key = f"source.{source}"
        if probe == "needles" and source == SOURCE_DEFAULT and sources.get("text") == SOURCE_GIVEN:
            key = "source.default_text_fallback"
        rows.append({"probe": t(f"probe.{probe}", lang) if has(f"probe.{probe}", lang) else probe,
                     "source": t(key, lang) if has(key, lang) else source})
    return (f'<div id="probe-sources"><h3>{esc(t("findings.sources_title", lang))}</h3>'
            f"{table(pd.DataFrame(rows), sortable=False, lang=lang)}</div>")


def kv_groups(heads: pd.DataFrame) -> list[dict]:
    """Key/value groups of more than one query head: layer, kv_group, heads ["L.H"], labels per head."""
    if "kv_group" not in heads:
        return []
    groups = []
    for (layer, group), rows in heads.sort_values(["layer", "head"]).groupby(["layer", "kv_group"], sort=True):
        if len(rows) > 1:
            groups.append({"layer": int(layer), "kv_group": int(group),
                           "heads": [f"{int(layer)}.{int(h)}" for h in rows["head"]],
                           "labels": [label_list(v) for v in rows.get("labels", [[]] * len(rows))]})
    return groups


def kv_groups_section(heads: pd.DataFrame, lang: str = DEFAULT_LANG) -> str:
    """Which query heads share keys and values, and whether they took the same role; "" when every
    group has one query head (GPT-2 and other multi-head attention models)."""
    groups = kv_groups(heads)
    if not groups:
        return ""
    rows, verdicts = [], []
    for group in groups:
        kinds = {tuple(names) for names in group["labels"]}
        verdict = "kv.no_roles" if kinds == {()} else "kv.same" if len(kinds) == 1 else "kv.mixed"
        verdicts.append(verdict)
        roles = "; ".join(f"{head}: {', '.join(names) or t('cell.none', lang)}"
                          for head, names in zip(group["heads"], group["labels"], strict=True))
        rows.append({"layer": group["layer"], "kv_head": group["kv_group"], "query_heads": ", ".join(group["heads"]),
                     "labels": roles, "same_role": t(verdict, lang)})
    intro = t("kv.intro", lang, n_groups=len(groups), n_same=verdicts.count("kv.same"),
              n_mixed=verdicts.count("kv.mixed"), n_none=verdicts.count("kv.no_roles"))
    return section("kv-groups", t("kv.title", lang), f"<p>{esc(intro)}</p>" + table(pd.DataFrame(rows), lang=lang))
