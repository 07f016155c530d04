"""Per-token view of an ablation on a text: each token's loss before and after, and the top next-token
predictions at one position before and after.

The evaluation set, the replacements and the forward passes are `ablate_heads`'s own
(headlens.intervene.evalset.build_evalset, headlens.intervene.replace.replacements and
headlens.intervene.sums.ablated_hidden with metric `loss`), so the mean of the per-token losses here is
`ablate_heads(loaded, heads, method, "loss", text, seed)`'s `loss` and `loss_ablated`, up to the order
of a float64 sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from headlens.arch import adapter_for
from headlens.arch.kernels import no_pattern_kernels
from headlens.classify.roles import resolve_heads
from headlens.errors import ConfigError
from headlens.intervene.evalset import build_evalset
from headlens.intervene.metrics import check_choice
from headlens.intervene.replace import replacements
from headlens.intervene.sums import ablated_hidden, scored_values
from headlens.load.devices import onloaded
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

TOP_K = 5  # next-token predictions listed at the chosen position


def token_ablation(
    loaded: LoadedModel,
    text: str,
    heads,
    method: str = "zero",
    seed: int = 0,
    position: int | None = None,
    top_k: int = TOP_K,
    labels: dict | None = None,
    clean: Result | None = None,
) -> Result:
    """Each next-token prediction's loss (nats) with `heads` kept and ablated, on `text` cut as `ablate_heads`
    cuts it (windows of the model's context, BOS first).
    heads: as ablate_heads takes them (a list of Head, "3.4,5.1", "layer:3", `all`, a role with `labels`).
    position: a position of the first window (0 = BOS) whose next-token predictions are listed (None: the last).
    clean: a result of this function on the same text, position and top_k, whose unablated losses and
    `top_clean` are reused instead of recomputed (they depend on neither the heads nor the method).
    Returns a Result of kind "tokens": its frame one row per scored prediction, windows in order (`index`: row i
    predicts the window's token i + 1; `clean` and `ablated`: its loss); its meta `heads` (["L.H"]), `method`,
    `ids` (the first window's token ids), `loss` and `loss_ablated` (the losses' means), `position`, and
    `top_clean` / `top_ablated`: [(token id, probability)] * top_k at that position.
    """
    check_choice(method, "loss")
    heads, _ = resolve_heads(loaded, heads, labels)
    evalset = build_evalset(loaded, "loss", text, seed)
    width = int(evalset.mask[0].sum())
    position = width - 1 if position is None else position
    if not 0 <= position < width:
        raise ConfigError(f"position {position} is outside the text's {width} positions (0-{width - 1})")
    reps = replacements(loaded.model, evalset, method, seed, batch_size=None)
    ids = evalset.input_ids[0, :width].tolist()
    before = clean.meta if clean is not None else None
    if before is not None and (before["ids"], before["position"], len(before["top_clean"])) == (ids, position, top_k):
        base = torch.tensor(clean.frame["clean"].tolist(), dtype=torch.float64)  # [n]
        top_clean = list(before["top_clean"])
    else:
        base, top_clean = _losses_and_top(loaded.model, evalset, [], reps, position, top_k)
    ablated, top_ablated = _losses_and_top(loaded.model, evalset, heads, reps, position, top_k)
    meta = {"heads": [str(h) for h in heads], "method": method, "ids": ids}
    meta.update(loss=float(base.sum() / len(base)), loss_ablated=float(ablated.sum() / len(ablated)), position=position)
    meta.update(top_clean=top_clean, top_ablated=top_ablated)
    pairs = zip(base.tolist(), ablated.tolist(), strict=True)  # [n] each
    rows = [{"index": i, "clean": c, "ablated": a} for i, (c, a) in enumerate(pairs)]
    return Result("tokens", meta=meta, rows=rows)


def _losses_and_top(model, evalset, heads, reps, position: int, top_k: int) -> tuple[torch.Tensor, list]:
    """Every scored position's loss [n] (float64, windows in order) and the top_k (token id, probability)
    at `position` of the first window, with `heads` ablated."""
    adapter = adapter_for(model)
    values, top = [], []
    with torch.no_grad(), no_pattern_kernels(model):  # the kernel ablate_heads runs on
        for rows in evalset.row_batches(None):
            hidden = ablated_hidden(model, evalset, rows, heads, reps)  # [batch, width, d_model]
            seq, pos = torch.nonzero(evalset.counted[rows].to(hidden.device), as_tuple=True)  # scored pairs
            values.append(scored_values(hidden[seq, pos], adapter.unembed(), evalset, rows, seq, pos).double().cpu())
            if rows.start == 0:
                top = top_predictions(adapter.unembed(), hidden[0, position], top_k)
    return torch.cat(values), top  # [n]


def top_predictions(lm_head, hidden: torch.Tensor, k: int = TOP_K) -> list[tuple[int, float]]:
    """The k most probable next tokens from one final hidden state [d_model]: [(token id, probability)]."""
    with onloaded(lm_head):
        logits = lm_head(hidden[None]).float()[0]  # [d_vocab]
    probs = torch.softmax(logits, dim=-1)  # [d_vocab]
    best = torch.topk(probs, min(k, probs.shape[-1]))
    return [(int(i), float(p)) for i, p in zip(best.indices.tolist(), best.values.tolist(), strict=True)]
