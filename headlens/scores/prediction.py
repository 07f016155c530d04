"""Who wrote this prediction: every head's direct effect on one next-token logit of a text.

At one position of one sequence, the model's next-token logits, and each head's direct effect
(headlens.scores.direct_logit: the head's output through the final norm, its scale frozen, and the
unembedding) on the logit of a target token, by default the model's top prediction there, or on the
difference logit(target) - logit(foil). The activations are those the IOI direct effects read
(headlens.scores.name_mover's capture at a chosen position), on a plain forward pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from headlens.scores.name_mover import _EndCapture

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel


def prediction_direct_effects(
    loaded: LoadedModel, ids: list[int], position: int, target: int | None = None, foil: int | None = None
) -> dict:
    """Direct effects on the prediction after token `position` of `ids` (one sequence, BOS included when
    the caller put it there).

    Returns `target` (the token id: `target`, or the model's top prediction), `foil` (or None),
    `logit` (the model's logit(target) - logit(foil), or logit(target)) and `direct`: float64
    [n_layers, n_heads], each head's direct effect on that same quantity.
    """
    model = loaded.model
    adapter = loaded.adapter
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, pos]
    at_position = _EndCapture(adapter, torch.tensor([position]))
    with torch.no_grad(), adapter.hooks() as hooks:
        at_position.register(hooks)
        out = model(input_ids=input_ids, logits_to_keep=torch.tensor([position], device=device))
    logits = out.logits[0, -1].double().cpu()  # [d_vocab]
    target = int(logits.argmax()) if target is None else int(target)
    foil_ids = None if foil is None else torch.tensor([int(foil)])
    with torch.no_grad():
        direct = at_position.direct_effects(torch.tensor([target]), foil_ids)  # [layer, 1, head]
    value = logits[target] - (logits[int(foil)] if foil is not None else 0.0)
    return {"target": target, "foil": foil, "logit": float(value), "direct": direct[:, 0].cpu()}
