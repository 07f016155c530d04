"""The top of the report: what the heads do, per role, with the evidence; and key/value groups.

Findings open with a layers x heads map coloured by role, then list, for every role of the registry
(headlens.classify.kinds.ROLES) that some head earned, how many heads and the strongest TOP_HEADS (ranked by
the kind's first evidence score), with the scores that earned the label and, where the report
ablated that head alone (a sweep or a single-head ablation), the change of its metric without
it, in the metric's unit; where the page ablated a role's heads together (against random head
sets), the role's block cites that result and its control. The roles no head earned follow, each
with the head that scored highest on the kind's ranking score and its scores beside the cut-offs.
First-token sinks are a property, not a role (headlens.classify.labels): they are summarised in one
paragraph and never counted as heads with a role. Then the probe sizes under the token budget
and where each probe's input came from. Grouped-query models (a `kv_group` column: the key/value
head each query head reads) also get their groups: which query heads share K and V, and whether
they took the same role.
"""

from __future__ import annotations

import math

import pandas as pd

from headlens.classify import kinds
from headlens.classify.labels import ROLES, absent_roles, head_strength, label_list, roles_of
from headlens.classify.runs import SOURCE_DEFAULT, SOURCE_GIVEN
from headlens.reports import explain
from headlens.reports.circuits import role_lines
from headlens.reports.headmap import head_map, overlaps, role_counts
from headlens.reports.headpanel import head_facts
from headlens.reports.i18n import DEFAULT_LANG, has, integer, percent, quantity, short_number, t
from headlens.reports.scatter import role_scatter
from headlens.reports.sections import details, esc, metric_words, result_delta, results_list, section, table
from headlens.results import Result

SOURCE_COLUMNS = kinds.SOURCE_COLUMNS
TOP_HEADS = 10  # heads listed per role, strongest first (the label table lists them all)
TOP_OPEN = 3  # of which shown open; the others folded
CIRCUIT_OPEN = 0  # circuit-evidence lines per role shown open (the others folded under a line counting them)
SINK_EXAMPLES = 5  # strongest first-token sinks named in their summary
KV_OPEN_ROWS = 12  # key/value groups with a role shown open up to this many (more are folded)


def single_head_ablations(sweep: Result | None, ablation) -> dict[str, dict]:
    """{"L.H": {delta, low, high, metric}} for every head ablated alone; the sweep wins over a single run."""
    found = {}
    for result in results_list(ablation):
        if len(result.get("heads", [])) == 1:
            low, high = (result.get("ci95") or [math.nan, math.nan])[:2]
            found[str(result["heads"][0])] = {
                "delta": result_delta(result),
                "low": float(low),
                "high": float(high),
                "metric": result.get("metric", "text"),
            }
    if sweep is not None:
        metric = sweep.meta.get("metric", "text")
        for row in sweep.frame.to_dict("records"):
            found[f"{int(row['layer'])}.{int(row['head'])}"] = {
                "delta": result_delta(row),
                "low": float(row.get("ci95_low", math.nan)),
                "high": float(row.get("ci95_high", math.nan)),
                "metric": row.get("metric", metric),
            }
    return found


def score_text(row: dict, column: str, lang: str) -> str | None:
    """ "prefix matching 0.87" (an offset as an integer); None when the frame lacks the score."""
    value = row.get(column)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    shown = str(int(value)) if column == "positional_offset" else quantity(value, lang)
    return f"{t(f'short.{column}', lang)} {shown}"


def ablation_text(found: dict, lang: str) -> str:
    """ "ablation raises the loss on the text by 2.10 nats/token (95% CI 1.90 to 2.30)"."""
    metric, unit = metric_words(found["metric"], lang)
    key = "findings.ablation_up" if found["delta"] >= 0 else "findings.ablation_down"
    text = t(key, lang, metric=metric, unit=unit, delta=quantity(abs(found["delta"]), lang))
    if not (math.isnan(found["low"]) or math.isnan(found["high"])):
        text += f" ({t('findings.ci', lang, low=quantity(found['low'], lang), high=quantity(found['high'], lang))})"
    return text


def head_line(row: dict, role: str, ablations: dict, lang: str) -> str:
    """One head's evidence for one role: "5.1 induction: prefix matching 0.87, copying 0.64, ablation ..."."""
    head = f"{int(row['layer'])}.{int(row['head'])}"
    pieces = [text for column in kinds.BY_LABEL[role].evidence if (text := score_text(row, column, lang))]
    if head in ablations:
        pieces.append(ablation_text(ablations[head], lang))
    line = t("findings.head_line", lang, head="\0", label=role, scores=", ".join(pieces))
    before, _, after = esc(line).partition("\0")
    return f'<li data-head="{esc(head)}">{before}<strong>{esc(head)}</strong>{after}</li>'


def role_evidence(result: dict, lang: str) -> str:
    """A role's heads ablated together, and where that change falls among its control sets."""
    metric, unit = metric_words(result.get("metric", "text"), lang)
    delta = result_delta(result)
    change = t(
        "findings.together_up" if delta >= 0 else "findings.together_down",
        lang,
        metric=metric,
        unit=unit,
        delta=quantity(abs(delta), lang),
    )
    low, high = (result.get("ci95") or [math.nan, math.nan])[:2]
    if not (math.isnan(float(low)) or math.isnan(float(high))):
        change += f" ({t('findings.ci', lang, low=quantity(low, lang), high=quantity(high, lang))})"
    text = t("findings.role_ablation", lang, n=len(result["heads"]), change=change)
    control = result.get("control")
    if control:
        key = "findings.role_control_exact" if control.get("exact") else "findings.role_control_random"
        text += " " + t(
            key,
            lang,
            k=control["k"],
            n_possible=integer(control.get("n_possible", control["k"]), lang),
            rank=control["rank"],
            n_sets=control["k"] + 1,
            p=quantity(control["p_value"], lang),
            p_min=quantity(control.get("p_min", 1 / (1 + control["k"])), lang),
        )
    return text


def role_results(role: str, heads: list[str], ablation) -> list[dict]:
    """The results that ablated this role's heads together: chosen for the role, or exactly its heads when
    chosen for no role. A result chosen for another role tests that role (its own metric), so it is cited
    there, even when the two roles hold the same heads."""
    return [
        r
        for r in results_list(ablation)
        if r.get("role") == role
        or (r.get("role") is None and len(r.get("heads", [])) > 1 and sorted(map(str, r["heads"])) == sorted(heads))
    ]


def findings_section(
    heads: Result, sweep=None, ablation=None, lang: str = DEFAULT_LANG, circuits: list[dict] | None = None
) -> str:
    """The head map, then per role how many heads and the strongest (with their key scores and
    ablation evidence), then the first-token sinks summarised, the probe sizes and sources, of a
    classification (classify_heads' Result)."""
    frame = heads.frame
    records = frame.sort_values(["layer", "head"]).to_dict("records")
    labels = [label_list(row.get("labels")) for row in records]
    n_roles = sum(1 for names in labels if roles_of(names))
    ablations = single_head_ablations(sweep, ablation)
    intro = t(
        "findings.intro", lang, n_labelled=n_roles, n_heads=len(records), n_none=len(records) - n_roles, top=TOP_HEADS
    )
    intro += overlap_text(frame, n_roles, lang)
    if ablations:
        intro += " " + t("findings.intro_ablation", lang)
    parts = [
        f"<p>{esc(intro)}</p>" if n_roles else f"<p>{esc(t('findings.no_roles', lang))}</p>",
        head_map(frame, lang, facts=head_facts(frame, heads.meta, circuits, lang)),
    ]
    for role in ROLES:
        rows = [row for row, names in zip(records, labels, strict=True) if role in names]
        if rows:
            plot = role_scatter(frame, role, heads.meta, lang)
            parts.append(role_block(role, rows, ablations, lang, ablation, circuits, plot))
    parts.append(absent_block(heads, lang))
    parts.append(sinks_block(records, labels, heads.meta, lang))
    parts.append(ioi_text(heads, lang))
    probes = sizes_text(heads.meta, lang) + syntactic_text(heads, lang)
    if probes:  # how the probes were sized and which did not run: folded under one line
        parts.append(details(t("findings.probes_open", lang), probes))
    parts.append(sources_table(heads, lang))
    parts.append(f"<p>{esc(t('findings.details', lang))}</p>")
    return section("findings", t("findings.title", lang), "\n".join(part for part in parts if part))


def overlap_text(heads: pd.DataFrame, n_labelled: int, lang: str) -> str:
    """ " 19 of these heads carry more than one role, so the role counts add up to 63 ...": how the per-role
    counts (headmap.role_counts) relate to the heads with a role; "" when no head has two roles."""
    combos = overlaps(heads)
    if not combos:
        return ""
    items = "; ".join(
        t("findings.overlap_item", lang, n=n, roles=role_names(roles, lang))
        for roles, n in sorted(combos.items(), key=lambda item: -item[1])
    )
    return " " + t(
        "findings.overlap",
        lang,
        n_multi=sum(combos.values()),
        n_pairs=sum(role_counts(heads).values()),
        n_labelled=n_labelled,
        combos=items,
    )


def role_names(roles: tuple[str, ...], lang: str) -> str:
    """ "current-token heads and positional heads": the roles' names as a sentence reads them (the identifiers
    stay in the tables)."""
    names = [t(kinds.BY_LABEL[role].name_key, lang) for role in roles]
    names = [name[0].lower() + name[1:] for name in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + t("findings.and", lang) + names[-1]


def role_note(role: str, rows: list[dict], lang: str) -> str:
    """What a role's block says once for the model: the needle count (retrieval), the overlap with
    previous- and current-token heads (positional); "" for other roles."""
    if role == "retrieval" and isinstance(rows[0].get("n_needle_tests"), (int, float)):
        text = t(
            "findings.retrieved_model",
            lang,
            n_retrieved=int(rows[0]["n_needle_retrieved"]),
            n_tests=int(rows[0]["n_needle_tests"]),
        )
        return f'<p class="explain">{esc(text)}</p>'
    if role == "positional" and any(
        {"previous_token", "current_token"} & set(label_list(row.get("labels"))) for row in rows
    ):
        return f'<p class="explain">{esc(t("findings.positional_note", lang))}</p>'
    return ""


def role_block(
    role: str, rows: list[dict], ablations: dict, lang: str, ablation=None, circuits=None, plot: str = ""
) -> str:
    """One role: its name, what it means, its TOP_HEADS strongest heads, how many more, the ablation of
    its heads together (with its control) where the page holds one, and the circuit evidence of its heads
    (reports/circuits.py role_lines: the heads feeding them) where the page draws circuits; `plot`: the role's
    scatter of its two deciding scores (reports/scatter.py), when its rule has two, beside the heads and evidence."""
    rows = sorted(rows, key=lambda row: -head_strength(row, role))  # stable: (layer, head) breaks ties
    lines = [head_line(row, role, ablations, lang) for row in rows[:TOP_HEADS]]
    items = "".join(lines[:TOP_OPEN])
    if len(lines) > TOP_OPEN:  # the rest of the strongest folded, so a long list does not push the page down
        folded = details(
            t("findings.more_open", lang, n=len(lines) - TOP_OPEN), f"<ul>{''.join(lines[TOP_OPEN:])}</ul>"
        )
        items += f'<li class="fold">{folded}</li>'
    more = (
        f'<p class="more">{esc(t("findings.more", lang, n=len(rows) - TOP_HEADS))}</p>' if len(rows) > TOP_HEADS else ""
    )
    heading = t("findings.role_heading", lang, role=t(kinds.BY_LABEL[role].name_key, lang), n=len(rows))
    names = [f"{int(row['layer'])}.{int(row['head'])}" for row in rows]
    evidence = "".join(
        f'<p class="evidence">{esc(role_evidence(result, lang))}</p>' for result in role_results(role, names, ablation)
    )
    fed = [f'<p class="evidence">{esc(line)}</p>' for line in role_lines(circuits, role, lang)]
    evidence += "".join(fed[:CIRCUIT_OPEN])
    if len(fed) > CIRCUIT_OPEN:  # the other heads' circuit evidence folded, as the heads' list is
        evidence += details(t("findings.more_open", lang, n=len(fed) - CIRCUIT_OPEN), "".join(fed[CIRCUIT_OPEN:]))
    return (
        f'<div class="role" id="role-{esc(role)}"><h3>{esc(heading)}</h3>'
        f'<p class="explain">{esc(t(kinds.BY_LABEL[role].what_key, lang))}</p>{role_note(role, rows, lang)}'
        f'<div class="role-body"><div class="role-list"><ul>{items}</ul>{more}{evidence}</div>{plot}</div></div>'
    )


def absent_block(heads: Result, lang: str, anchor: str | None = "roles-absent") -> str:
    """The roles no head earned (headlens.classify.labels.absent_roles), each with the head highest on the kind's
    ranking score and its scores beside their cut-offs (folded under a line naming the roles), in a div with id
    `anchor` (None: no id, for inline views that may repeat); "" when every role was found."""
    absent = absent_roles(heads.frame, heads.meta)
    if not absent:
        return ""
    items = []
    for absence in absent:
        role = t(kinds.BY_LABEL[absence.label].name_key, lang)
        if absence.head is None:
            items.append(f"<li>{esc(t('findings.absent_unscored', lang, role=role))}</li>")
            continue
        pieces = []
        for column, value, cut in absence.values:
            shown = score_text({column: value}, column, lang) or ""
            if cut is not None:
                shown = t("findings.cut_off", lang, score=shown, cut=short_number(cut, lang))
            pieces.append(shown)
        line = t("findings.absent_line", lang, role=role, head="\0", scores=", ".join(pieces))
        before, _, after = esc(line).partition("\0")
        items.append(f"<li>{before}<strong>{esc(absence.head)}</strong>{after}</li>")  # no data-head: no role
    ident = f' id="{esc(anchor)}"' if anchor else ""
    names = ", ".join(t(kinds.BY_LABEL[absence.label].name_key, lang) for absence in absent)
    body = f"<p>{esc(t('findings.absent_intro', lang))}</p><ul>{''.join(items)}</ul>"
    return (
        f'<div class="role absent"{ident}><h3>{esc(t("findings.absent_title", lang))}</h3>'
        f"{details(t('findings.absent_open', lang, n=len(absent), roles=names), body)}</div>"
    )


def sinks_block(records: list[dict], labels: list[list[str]], meta: dict, lang: str) -> str:
    """First-token sinks, a property: how many, how many have no role, the strongest few."""
    sinks = [(row, names) for row, names in zip(records, labels, strict=True) if "first_token" in names]
    if not sinks:
        return ""
    sinks.sort(key=lambda pair: -head_strength(pair[0], "first_token"))
    threshold = explain.score_thresholds(meta).get("first_token_score")
    strongest = ", ".join(
        f"{int(row['layer'])}.{int(row['head'])} ({quantity(row['first_token_score'], lang)})"
        for row, _ in sinks[:SINK_EXAMPLES]
    )
    text = t(
        "findings.sinks",
        lang,
        n_sinks=len(sinks),
        n_heads=len(records),
        threshold=short_number(threshold, lang) if threshold is not None else "?",
        n_sink_only=sum(1 for _, names in sinks if not roles_of(names)),
        heads=strongest,
    )
    return (
        f'<div class="role property" id="role-first_token"><h3>{esc(t("findings.sinks_title", lang))}</h3>'
        f"<p>{esc(text)}</p></div>"
    )


def sizes_text(meta: dict, lang: str) -> str:
    """What the token budget made of each probe ("" for a frame without the record)."""
    sizes = (meta.get("probes") or {}).get("sizes")
    if not isinstance(sizes, dict):
        return ""
    key = "findings.sizes_capped" if sizes.get("capped") else "findings.sizes"
    text = t(
        key,
        lang,
        budget=sizes.get("token_budget", "?"),
        n_ctx=sizes.get("n_ctx", "?"),
        window=sizes.get("window", "?"),
        needle=sizes.get("needle_context", "?"),
    )
    return f'<p id="probe-sizes">{esc(text)}</p>'


def syntactic_text(heads: Result, lang: str) -> str:
    """That the syntactic probe did not run and how to run it; "" when it ran (or the frame predates it)."""
    if not (heads.meta.get("probes") or {}).get("syntactic_missing"):
        return ""
    return f'<p id="syntactic">{esc(t("findings.syntactic_not_run", lang))}</p>'


def ioi_text(heads: Result, lang: str) -> str:
    """Whether the model does the IOI task: its own logit difference (the `ioi_logit_diff` column, the
    same on every row), or why no prompt was built; "" for a frame without the IOI probe."""
    probes, frame = heads.meta.get("probes") or {}, heads.frame
    if probes.get("ioi_missing") and "ioi_names_total" in probes:
        text = t("findings.ioi_missing_names", lang, n=probes["ioi_names"], total=probes["ioi_names_total"])
        return f'<p id="ioi">{esc(text)}</p>'
    if probes.get("ioi_missing"):  # a frame without the counts: the reason as the probe wrote it
        return f'<p id="ioi">{esc(t("findings.ioi_missing", lang, reason=probes["ioi_missing"]))}</p>'
    if "ioi_logit_diff" not in frame or not len(frame) or not math.isfinite(float(frame["ioi_logit_diff"].iloc[0])):
        return ""
    share = probes.get("ioi_correct_share")
    text = t(
        "findings.ioi",
        lang,
        diff=quantity(float(frame["ioi_logit_diff"].iloc[0]), lang),
        n=int(frame["n_ioi_prompts"].iloc[0]) if "n_ioi_prompts" in frame else "?",
        share=percent(share, lang) if isinstance(share, float) else "?",
    )
    return f'<p id="ioi">{esc(text)}</p>'


def probe_sources(heads: Result) -> dict[str, str]:
    """Probe -> where its input came from: `meta["sources"]`, else the `*_source` columns (a classification
    read back from CSV or JSON); {} when neither was recorded."""
    sources, frame = dict(heads.meta.get("sources") or {}), heads.frame
    for probe, column in SOURCE_COLUMNS.items():
        if probe not in sources and column in frame and len(frame):
            sources[probe] = str(frame[column].iloc[0])
    return sources


def sources_table(heads: Result, lang: str) -> str:
    """Where each probe's input came from, a fallback to the shipped text said in words."""
    sources = probe_sources(heads)
    if not sources:
        return ""
    rows = []
    for probe, source in sources.items():
        key = f"source.{source}"
        if probe == "needles" and source == SOURCE_DEFAULT and sources.get("text") == SOURCE_GIVEN:
            key = "source.default_text_fallback"
        rows.append(
            {
                "probe": t(f"probe.{probe}", lang) if has(f"probe.{probe}", lang) else probe,
                "source": t(key, lang) if has(key, lang) else source,
            }
        )
    sources = table(pd.DataFrame(rows), sortable=False, lang=lang)
    return f'<div id="probe-sources">{details(t("findings.sources_title", lang), sources)}</div>'


def kv_groups(heads: pd.DataFrame) -> list[dict]:
    """Key/value groups of more than one query head: layer, kv_group, heads ["L.H"], labels per head."""
    if "kv_group" not in heads:
        return []
    groups = []
    for (layer, group), rows in heads.sort_values(["layer", "head"]).groupby(["layer", "kv_group"], sort=True):
        if len(rows) > 1:
            groups.append(
                {
                    "layer": int(layer),
                    "kv_group": int(group),
                    "heads": [f"{int(layer)}.{int(h)}" for h in rows["head"]],
                    "labels": [label_list(v) for v in rows.get("labels", [[]] * len(rows))],
                }
            )
    return groups


def kv_groups_section(heads: pd.DataFrame, lang: str = DEFAULT_LANG) -> str:
    """Which query heads share keys and values, and whether they took the same role; "" when every
    group has one query head (GPT-2 and other multi-head attention models)."""
    groups = kv_groups(heads)
    if not groups:
        return ""
    rows, verdicts = [], []
    for group in groups:
        found = {tuple(roles_of(names)) for names in group["labels"]}  # properties (sinks) left out
        verdict = "kv.no_roles" if found == {()} else "kv.same" if len(found) == 1 else "kv.mixed"
        verdicts.append(verdict)
        roles = "; ".join(
            f"{head}: {', '.join(names) or t('cell.none', lang)}"
            for head, names in zip(group["heads"], group["labels"], strict=True)
        )
        rows.append(
            {
                "layer": group["layer"],
                "kv_head": group["kv_group"],
                "query_heads": ", ".join(group["heads"]),
                "labels": roles,
                "same_role": t(verdict, lang),
            }
        )
    intro = t(
        "kv.intro",
        lang,
        n_groups=len(groups),
        n_same=verdicts.count("kv.same"),
        n_mixed=verdicts.count("kv.mixed"),
        n_none=verdicts.count("kv.no_roles"),
    )
    frame = pd.DataFrame(rows)
    with_roles = frame[[verdict != "kv.no_roles" for verdict in verdicts]]
    body = f"<p>{esc(intro)}</p>"
    if 0 < len(with_roles) <= KV_OPEN_ROWS:
        body += f"<p>{esc(t('kv.with_roles', lang))}</p>" + table(with_roles.reset_index(drop=True), lang=lang)
    elif len(with_roles):
        body += details(
            t("kv.with_roles_folded", lang, n=len(with_roles)), table(with_roles.reset_index(drop=True), lang=lang)
        )
    body += details(t("kv.all_groups", lang, n=len(frame)), table(frame, lang=lang))
    return section("kv-groups", t("kv.title", lang), body)
