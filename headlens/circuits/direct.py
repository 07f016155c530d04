"""Every component's direct effect on a task's metric through the logits, adding up to the metric.

At each position the metric reads (headlens.circuits.tasks), the final norm's input is the sum of what
every component wrote into the residual stream: the embeddings, each head's output z_h W_O^h, each
layer's attention bias, each MLP. With the final norm's scale frozen at its value in this run (and the
norm on the attention output where the family has one, Gemma 3), the path from the residual stream to
the metric's linear part is linear, so the components' direct effects add up to it exactly
(Elhage et al. 2021; Wang et al. 2022 measure name movers by this path; headlens.scores.direct_logit):

    direct(x) = (c(x) * g_f / s_f) . (W_U[target] - W_U[foil])      (no foil: W_U[target] - mean_v W_U[v])

plus the final norm's bias and the unembedding bias, which no component writes (`rest["biases"]`). For
IOI the linear part is the metric itself, logit(IO) - logit(S); for induction it is the target's logit
minus the mean logit (the loss adds the log-sum-exp, shared by all components).

`decompose` runs the model once, optionally with some heads' z replaced (headlens.circuits.selfrepair),
and returns the heads' direct effects [layer, head] and the rest, each the mean over read positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from headlens.heads import Head
from headlens.intervene.evalset import batches
from headlens.load.devices import onloaded
from headlens.scores.direct_logit import attn_out_scale, centre, heads_written, readout

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

BATCH = 16  # sequences per forward pass


@dataclass
class Decomposition:
    """One run's direct effects, means over the read positions."""

    heads: torch.Tensor  # [layer, head] float64, each head's direct effect
    rest: dict[str, float]  # "embeddings", "attention bias L", "MLP L", "biases" -> direct effect
    logit_metric: float  # the metric's linear part from the run's logits
    metric: float  # the task's metric from the run's logits
    final: torch.Tensor | None = None  # [n, d_model] the final norm's input at the read positions

    @property
    def total(self) -> float:
        """The sum of every direct effect: equal to logit_metric up to float rounding."""
        return float(self.heads.sum()) + sum(self.rest.values())

    def head(self, head: Head) -> float:
        return float(self.heads[head.layer, head.head])


def decompose(
    loaded: LoadedModel,
    task,
    replacement: dict[Head, torch.Tensor | None] | None = None,
    batch: int = BATCH,
    read_as: Decomposition | None = None,
):
    """The direct effects of one run of `task` (see the module docstring); `replacement` maps heads to what
    their z becomes (None: zero; else a tensor broadcastable to [n_seq, pos, d_head] over the task's
    sequences): their outputs are replaced in the run and their direct effects are those of the replacement.
    `read_as` (another run of the task) reads every component through that run's final norm scale instead
    of this run's: each direct effect then changes only where the component's own write does, and they no
    longer add up to this run's metric."""
    model, adapter = loaded.model, loaded.adapter
    device = next(model.parameters()).device
    parts: list[dict] = []
    for rows in batches(task.tokens.shape[0], batch):
        parts.append(_run(adapter, model, task, rows, replacement or {}, device))
    seen = {key: torch.cat([p[key] for p in parts]) for key in parts[0] if key not in ("resid", "z", "attn_out")}
    seen["resid"] = [torch.cat([p["resid"][i] for p in parts]) for i in range(adapter.n_layers + 1)]
    seen["z"] = [torch.cat([p["z"][i] for p in parts]) for i in range(adapter.n_layers)]
    seen["attn_out"] = [torch.cat([p["attn_out"][i] for p in parts]) for i in range(adapter.n_layers)]
    return _decomposition(adapter, task, seen, None if read_as is None else read_as.final)


def _run(adapter, model, task, rows: slice, replacement: dict, device) -> dict:
    """One forward pass over the task's sequences `rows`; what the decomposition reads at their read
    positions: the residual entering each layer and the final norm (`resid`, n_layers + 1 of [n, d_model]),
    z and the attention output per layer, the final norm's output (`hidden`)."""
    where = task.where[rows].to(device)  # [batch, pos]
    seen: dict = {"resid": {}, "z": {}, "attn_out": {}}

    def at_read(x: torch.Tensor) -> torch.Tensor:
        return x[where].detach()  # [n, ...]

    def on_z(layer: int):
        def edit(z: torch.Tensor):  # [batch, pos, head, d_head]
            mine = {h.head: rep for h, rep in replacement.items() if h.layer == layer}
            if mine:
                z = z.clone()
                for head, rep in mine.items():
                    z[:, :, head] = 0.0 if rep is None else _rows(rep, rows).to(z.device, z.dtype)
            seen["z"][layer] = at_read(z)
            return z if mine else None

        return edit

    def on_layer_input(index: int):
        def keep(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]  # [batch, pos, d_model]
            seen["resid"][index] = at_read(x)

        return keep

    with torch.no_grad(), adapter.hooks() as hooks:
        for layer in range(adapter.n_layers):
            hooks.z(layer, on_z(layer))
            hooks.add(adapter.layer(layer).register_forward_pre_hook(on_layer_input(layer), with_kwargs=True))
            hooks.output(
                adapter.z_module(layer), lambda out, layer=layer: seen["attn_out"].__setitem__(layer, at_read(out))
            )
        hooks.add(adapter.final_norm().register_forward_pre_hook(on_layer_input(adapter.n_layers), with_kwargs=True))
        hidden = adapter.run_trunk(task.tokens[rows].to(device), task.mask[rows].to(device))  # [batch, pos, d_model]
    return {
        "resid": [seen["resid"][i] for i in range(adapter.n_layers + 1)],
        "z": [seen["z"][i] for i in range(adapter.n_layers)],
        "attn_out": [seen["attn_out"][i] for i in range(adapter.n_layers)],
        "hidden": at_read(hidden),  # [n, d_model]
    }


def _rows(rep: torch.Tensor, rows: slice) -> torch.Tensor:
    """A replacement's slice for the sequences `rows` (a [1, ...] replacement is shared by all)."""
    return rep if rep.shape[0] == 1 else rep[rows]


def _decomposition(adapter, task, seen: dict, final: torch.Tensor | None = None) -> Decomposition:
    unembed = adapter.unembed()
    with onloaded(unembed), torch.no_grad():
        w_u = unembed.weight.detach()  # [d_vocab, d_model]
        direction = task.direction(w_u)  # [n, d_model]
        bias = getattr(unembed, "bias", None)
        bias_term = _bias_term(task, None if bias is None else bias.detach().double())  # [n]
        values = task.hidden_values(seen["hidden"], unembed).double()  # [n]
        linear = (seen["hidden"].double() * direction.to(seen["hidden"].device)).sum(-1) + bias_term  # [n]
    resid = seen["resid"]
    along = readout(adapter, resid[-1] if final is None else final, direction)  # [n, d_model]

    def worth(x: torch.Tensor) -> torch.Tensor:  # x [n, ..., d_model] -> [n, ...]
        x = centre(adapter, x.double())
        return (x * along.view(along.shape[0], *([1] * (x.dim() - 2)), -1)).sum(-1)

    heads, rest = [], {"embeddings": float(worth(resid[0]).mean())}
    for layer in range(adapter.n_layers):
        per_head = worth(heads_written(adapter, layer, seen["z"][layer], seen["attn_out"][layer]))  # [n, head]
        attention = worth(seen["attn_out"][layer].double() * attn_out_scale(adapter, layer, seen["attn_out"][layer]))
        block = worth(resid[layer + 1].double() - resid[layer].double())  # [n]
        heads.append(per_head.mean(0))
        rest[f"attention bias {layer}"] = float((attention - per_head.sum(-1)).mean())
        rest[f"MLP {layer}"] = float((block - attention).mean())
    rest["biases"] = float((_final_bias_term(adapter, direction) + bias_term).mean())
    return Decomposition(torch.stack(heads).cpu(), rest, float(linear.mean()), float(values.mean()), resid[-1])


def _bias_term(task, bias: torch.Tensor | None) -> torch.Tensor:
    """The unembedding bias's part of each read position's linear metric: [n] (zeros without a bias)."""
    target = task.target[task.where]  # [n]
    if bias is None:
        return torch.zeros(len(target), dtype=torch.float64)
    bias = bias.cpu()
    other = bias.mean() if task.foil is None else bias[task.foil[task.where]]
    return bias[target] - other  # [n]


def _final_bias_term(adapter, direction: torch.Tensor) -> torch.Tensor:
    """The final norm's bias along each read position's direction: [n] (zeros for a norm without bias)."""
    final = adapter.final_norm()
    with onloaded(final):
        bias = getattr(final, "bias", None)
        if bias is None:
            return torch.zeros(direction.shape[0], dtype=torch.float64)
        return (direction.double() @ bias.detach().double().to(direction.device)).cpu()  # [n]
