"""Backups: the heads that make up for a role's heads when those are ablated, each with its measured
compensation, a p-value against random head sets, and a cheap detector from the weights scored against them.

A role's heads (the labels' `role`, by default ROLE_OF_TASK: name movers on IOI, induction heads on induction) are
ablated together (headlens.circuits.selfrepair.replacement_for) and every other head's direct effect on the task's
metric is measured in the clean and the ablated run (headlens.circuits.direct), both read through the clean run's
final norm scale: a head's change is then its own write's change (it attends or computes otherwise), not the final
norm rescaling every head once the role's writes are gone (Rushing & Nanda 2024, arXiv 2402.15390, separate that
LayerNorm share of self-repair from the heads'). A head's *compensation* is that change, signed so that positive
means it moves the metric the way the ablated heads wrote it (their lost direct effect): it makes up for them. Wang
et al. 2022 (arXiv 2211.00593) name such heads in GPT-2 small's IOI circuit "backup name movers"; McGrath et al.
2023 (arXiv 2307.15771) find whole layers that do it (the Hydra effect).

Is a head's compensation more than ablating other heads would cause? CONTROLS random sets with the role's per-layer
counts drawn from the other heads of those layers (headlens.intervene.stats.control_design with `outside`, seeded;
all of them when there are no more) are ablated the same way: random heads, none of the role's (a set holding some
of the role's heads ablates part of the role itself, which a backup answers). A head's p-value is one-sided, (1 +
#{controls without it whose compensation of it is >= its own}) / (1 + #{controls without it}) (Phipson & Smyth
2010). A head is a backup of the role, labelled BACKUP_PREFIX + role ("backup_name_mover"), when p < ALPHA and its
compensation is at least MIN_SHARE of the role's lost direct effect (a change smaller than that makes up for nothing
worth naming, however unusual). Every head is tested and nothing corrects for that: about ALPHA of the heads with no
backup role pass by chance.

The cheap detector reads only the weights: how much a head's OV circuit W_OV = W_V W_O (norms, GQA groups
and the output norm folded in: headlens.circuits.composition.head_weights) lies along the role's summed OV
circuit, |<W_OV^h, sum_r W_OV^r>_F| / (||W_OV^h||_F ||sum_r W_OV^r||_F): a head that maps what it reads to
what the role's heads write, with either sign (a negative mover that attends less once the movers are gone
compensates as well as a positive one that attends more). It is scored against the measured backups by
ROC-AUC over every head outside the role (the Mann-Whitney statistic, ties counted half). Conditional
co-ablation (CoAx; Gong et al. 2026, arXiv 2607.01940) reports 0.91 against GPT-2 small's documented IOI
backups for its score, which costs one ablated pass per candidate head, where single-head ablation gives 0.33.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from headlens.bounds import shown
from headlens.circuits.direct import Decomposition, decompose
from headlens.circuits.selfrepair import replacement_for
from headlens.errors import ConfigError, InputTextError
from headlens.files import read_json
from headlens.heads import Head, all_heads
from headlens.intervene.stats import control_design
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

ROLE_OF_TASK = {"ioi": "name_mover", "induction": "induction"}
BACKUP_PREFIX = "backup_"
ALPHA = 0.05  # a head with p below this is a backup
MIN_SHARE = 0.02  # ... and making up at least this share of the role's lost direct effect
CONTROLS = 39  # random control sets: the smallest p-value is 1 / 40
COLUMNS = ["head", "layer", "head_index", "clean", "ablated", "compensation", "p_value", "controls"]
COLUMNS += ["ov_similarity", "backup"]
# A backups Result's meta, in this order.
BACKUP_META = (
    "task",  # the task's name
    "role",  # the role whose heads were ablated
    "label",  # the label its backups carry (BACKUP_PREFIX + role)
    "ablated",  # the role's heads ("L.H")
    "method",  # zero | mean | resample
    "unit",  # the direct effects' unit ("logits")
    "lost",  # the role's direct effect clean minus ablated: what the backups make up for
    "total_effect",  # the task metric's change with the role ablated
    "controls",  # control sets ablated
    "exact",  # True when they are every set with the role's per-layer counts
    "p_min",  # 1 / (1 + controls)
    "alpha",  # ALPHA
    "min_share",  # MIN_SHARE
    "seed",  # the controls' seed
    "backups",  # the backups, largest compensation first
    "detector",  # the cheap detector's name
    "auc",  # its ROC-AUC against the backups (None when there are none or only backups)
)


def role_heads(labels: dict[Head, list[str]], role: str) -> list[Head]:
    """The heads labelled `role`, sorted."""
    return sorted(h for h, names in labels.items() if role in names)


def find_backups(
    loaded: LoadedModel,
    task,
    labels: dict[Head, list[str]] | None = None,
    role: str | None = None,
    heads: list[Head] | None = None,
    method: str = "zero",
    controls: int = CONTROLS,
    seed: int = 0,
    clean: Decomposition | None = None,
) -> Result:
    """The backups of `role` on `task` (see the module docstring): a Result of kind "backups", `.frame` one row
    per head outside the role (COLUMNS, largest compensation first), `.meta` BACKUP_META. The role's heads are
    `heads` when given, else the heads `labels` give the role; `clean` reuses a clean run already decomposed.
    ConfigError when the role has no head or `controls` < 1."""
    role = role or ROLE_OF_TASK.get(task.name, "")
    primary = sorted(heads) if heads else role_heads(labels or {}, role)
    if not primary:
        raise ConfigError(f"no head is labelled {role!r}: there is no role to find backups of")
    if controls < 1:
        raise ConfigError(f"backups need at least one random control set (got {controls})")
    spec = loaded.spec
    clean = clean if clean is not None else decompose(loaded, task)
    after = decompose(loaded, task, replacement_for(loaded, task, primary, method, seed), read_as=clean)
    lost = sum(clean.head(h) - after.head(h) for h in primary)
    sign = 1.0 if lost >= 0 else -1.0
    compensation = sign * (after.heads - clean.heads)  # [layer, head]
    design = control_design(primary, spec.n_heads, controls, seed, outside=True)
    beaten, counted = _control_counts(loaded, task, clean, design["sets"], compensation, sign, method, seed)
    p_values = (1 + beaten) / (1 + counted)  # [layer, head]
    similarity = ov_similarity(loaded, primary)  # [layer, head]
    rows = []
    for h in all_heads(spec.n_layers, spec.n_heads):
        if h in primary:
            continue
        comp, p = float(compensation[h]), float(p_values[h])
        rows.append(
            (str(h), h.layer, h.head, clean.head(h), after.head(h), comp, p, int(counted[h]), float(similarity[h]))
        )
    frame = pd.DataFrame(rows, columns=COLUMNS[:-1])
    frame["backup"] = (frame["compensation"] >= MIN_SHARE * abs(lost)) & (frame["p_value"] < ALPHA)
    order = frame["compensation"].sort_values(ascending=False, kind="stable").index
    frame = frame.loc[order].reset_index(drop=True)
    meta = {
        "task": task.name,
        "role": role,
        "label": BACKUP_PREFIX + role,
        "ablated": [str(h) for h in primary],
        "method": method,
        "unit": "logits",
        "lost": float(lost),
        "total_effect": after.metric - clean.metric,
        "controls": len(design["sets"]),
        "exact": design["exact"],
        "p_min": 1 / (1 + len(design["sets"])),
        "alpha": ALPHA,
        "min_share": MIN_SHARE,
        "seed": seed,
        "backups": list(frame.loc[frame["backup"], "head"]),
        "detector": "ov_similarity",
        "auc": roc_auc(frame["ov_similarity"].tolist(), frame["backup"].tolist()),
    }
    return Result("backups", frame, meta)


def _control_counts(
    loaded: LoadedModel, task, clean: Decomposition, sets, compensation, sign: float, method: str, seed: int
):
    """Per head [layer, head]: how many control sets (not holding it) made it compensate at least as much as the
    role did, and how many control sets did not hold it."""
    beaten = torch.zeros_like(compensation)  # [layer, head]
    counted = torch.zeros_like(compensation)  # [layer, head]
    for index, chosen in enumerate(sets):
        after = decompose(loaded, task, replacement_for(loaded, task, chosen, method, seed + 1 + index), read_as=clean)
        control = sign * (after.heads - clean.heads)  # [layer, head]
        free = torch.ones_like(compensation, dtype=torch.bool)  # [layer, head]
        for h in chosen:
            free[h] = False
        beaten += (free & (control >= compensation)).double()
        counted += free.double()
    return beaten, counted


def ov_similarity(loaded: LoadedModel, primary: list[Head]) -> torch.Tensor:
    """|cosine| of every head's OV circuit with the summed OV circuit of `primary`, Frobenius: [layer, head]
    (float64). <V_a O_a, V_b O_b>_F = sum((V_a^T V_b) * (O_a O_b^T)), so only [d_head, d_head] products."""
    from headlens.circuits.composition import head_weights

    adapter = loaded.adapter
    weights = [head_weights(adapter, layer) for layer in range(adapter.n_layers)]
    v = torch.stack([w["v"] for w in weights])  # [layer, head, d_model, d_head]
    o = torch.stack([w["o"] for w in weights])  # [layer, head, d_head, d_model]
    ref_v = torch.stack([v[h] for h in primary])  # [n_primary, d_model, d_head]
    ref_o = torch.stack([o[h] for h in primary])  # [n_primary, d_head, d_model]
    vv = torch.einsum("lhmd,rme->lhrde", v, ref_v)  # [layer, head, n_primary, d_head, d_head]
    oo = torch.einsum("lhdm,rem->lhrde", o, ref_o)  # [layer, head, n_primary, d_head, d_head]
    inner = (vv * oo).sum((2, 3, 4))  # [layer, head]: <W_OV^h, sum_r W_OV^r>_F
    own = ((v.transpose(-1, -2) @ v) * (o @ o.transpose(-1, -2))).sum((-1, -2))  # [layer, head]: ||W_OV^h||_F^2
    ref_vv = torch.einsum("rmd,sme->rsde", ref_v, ref_v)  # [n_primary, n_primary, d_head, d_head]
    ref_oo = torch.einsum("rdm,sem->rsde", ref_o, ref_o)  # [n_primary, n_primary, d_head, d_head]
    ref = (ref_vv * ref_oo).sum()  # ||sum_r W_OV^r||_F^2
    return (inner.abs() / (own * ref).sqrt().clamp_min(1e-30)).double()


def roc_auc(scores: list[float], positives: list[bool]) -> float | None:
    """The probability that a positive outscores a negative (ties count half): the Mann-Whitney U over the
    product of the class sizes. None when either class is empty."""
    pos = torch.tensor([s for s, p in zip(scores, positives, strict=True) if p], dtype=torch.float64)
    neg = torch.tensor([s for s, p in zip(scores, positives, strict=True) if not p], dtype=torch.float64)
    if len(pos) == 0 or len(neg) == 0:
        return None
    wins = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()  # [pos, neg]
    return float(wins.mean())


def to_document(result: Result) -> dict:
    """A backups Result as JSON-ready data: its meta (BACKUP_META) and `heads`, every row (COLUMNS)."""
    heads = [
        {**r, "layer": int(r["layer"]), "head_index": int(r["head_index"]), "backup": bool(r["backup"])}
        for r in result.frame[COLUMNS].to_dict("records")
    ]
    return {**{key: result.meta[key] for key in BACKUP_META}, "heads": heads}


def attach(document: dict, result: Result) -> dict:
    """A circuit document (headlens.circuits.circuit.to_document) with `backups` (to_document of `result`) and
    each backup's label added to its head's `labels`."""
    label = result.meta["label"]
    found = set(result.meta["backups"])
    heads = [
        {**h, "labels": [*h["labels"], label] if h["head"] in found else list(h["labels"])} for h in document["heads"]
    ]
    return {**document, "heads": heads, "backups": to_document(result)}


def read_backups(path) -> dict[str, list[dict]]:
    """ "L.H" -> what it backs up ({role, label, task, compensation, p_value}, one per role) from a file written
    by `headlens circuit --backups --format json` (its `backups` object) or holding that object alone.
    InputTextError naming the file when it is neither."""
    from pathlib import Path

    path = Path(path)
    data = read_json(path, "--backups", InputTextError)  # a regular file under the cap, JSON in one line's error
    try:
        found = data.get("backups", data) if isinstance(data, dict) else None
        out: dict[str, list[dict]] = {}
        for row in found["heads"]:
            if row["backup"] is True:
                layer, head = (int(x) for x in str(row["head"]).split("."))
                entry = {"role": str(found["role"]), "label": str(found["label"]), "task": str(found["task"])}
                entry.update(compensation=float(row["compensation"]), p_value=float(row["p_value"]))
                out.setdefault(f"{layer}.{head}", []).append(entry)
        return out
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        raise InputTextError(
            f"{shown(str(path))} holds no backups: give the JSON of `headlens circuit MODEL --backups --format json`"
        ) from None
