"""Name-mover and negative name-mover heads, on indirect-object-identification (IOI) prompts.

Wang et al. 2022, "Interpretability in the Wild: a Circuit for Indirect Object Identification in
GPT-2 small" (arXiv 2211.00593). An IOI prompt names two people, repeats one (the subject S) and
ends where the other (the indirect object IO) comes next: "When Mary and John went to the store,
John gave a drink to" -> " Mary". Name movers attend from the last token (END) to IO and copy it;
negative name movers attend to IO and write it down (GPT-2 small: 9.9, 10.0, 9.6; negative 10.7,
11.10). Per head:
- `io_attention`: attention from END to IO, mean over prompts; `s_attention` to S1 + S2;
- `ioi_direct_effect`: what the head writes straight into logit(IO) - logit(S) at END, the norms'
  scales frozen (direct logit attribution, headlens.scores.direct_logit), mean over prompts: how
  Wang et al. find their name movers (path patching to the logits) without a pass per head;
- `name_copy_score`: share of the names whose own logit is in the top COPY_TOP_K = 5 of the
  vocabulary under the head's OV circuit (Wang et al.'s copy score); `name_negative_copy_score`:
  share in the bottom 5 (their negative copy score). Wang et al. apply the OV circuit to the
  residual after MLP0 at the name's position in a prompt; we use the effective embedding W_EE
  (headlens.scores.ov_circuit), the same MLP0 output without layer 0's attention.
The model's own IOI logit difference, logit(IO) - logit(S) at END (mean over prompts), says
whether the model does the task at all.

Labels: a head is a name mover when io_attention >= IO_ATTENTION_MIN, io_attention >
s_attention and name_copy_score >= COPY_MIN; a negative name mover with name_negative_copy_score
>= COPY_MIN instead. The paper fixes neither cut-off; ours: IO_ATTENTION_MIN = 0.2 (three times the
~1/15 a head spreading attention over a 15-token prompt puts on one token) and COPY_MIN = 0.5
(Wang et al. report copy scores above 90% for their name movers and under 20% for most heads).

Prompts for any tokenizer: NAMES are kept when " Name" is one token; prompts are built piece by
piece (template text tokenized, each name its single id), so the name positions are known exactly.
The prompts are plain text after BOS, with no chat template, for base and instruct models alike.

The classify probe (`probe_name_mover`, headlens.classify.kind_runs) runs token_budget // 4 prompts (at most
N_PROMPTS; ~18 tokens each) and ranks the names' OV outputs over the whole vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from headlens.errors import ConfigError
from headlens.probes.tokenize import encode
from headlens.scores.direct_logit import head_direct_effects
from headlens.scores.ov_circuit import own_extremes

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

COPY_TOP_K = 5  # Wang et al.: the name among the top 5 logits of the head's OV output
IO_ATTENTION_MIN = 0.2  # ours (see the module docstring)
COPY_MIN = 0.5  # ours
N_PROMPTS = 48
SOURCE_TEMPLATES = "ioi_templates"  # the probe's input: prompts from TEMPLATES and NAMES (seeded)
NAMES = (
    "Mary John Tom James Anne Paul Mark Lisa Sarah David Michael Laura Kate Peter Emma Alice Daniel Susan "
    "Robert Linda Helen Jack George Rachel Adam Karen Steven Amy Brian Jessica"
).split()
# {0} and {1} are the two names in order, {s} the repeated subject; each placeholder stands for
# " Name" (with its space). ABBA prompts put IO first, BABA prompts S first (Wang et al.).
TEMPLATES = (
    "When{0} and{1} went to the store,{s} gave a drink to",
    "When{0} and{1} went to the park,{s} gave a ball to",
    "After{0} and{1} went to the office,{s} handed a letter to",
    "While{0} and{1} were working at the school,{s} gave a book to",
    "Then,{0} and{1} went to the market.{s} gave an apple to",
    "After the meeting,{0} and{1} went to the hospital.{s} gave a flower to",
    "Friends{0} and{1} found a ring at the beach.{s} gave it to",
    "When{0} and{1} got a snack at the cafe,{s} decided to give it to",
)


def name_tokens(tokenizer) -> dict[str, int]:
    """Name -> the single token id of " Name", for the NAMES this tokenizer spells in one token."""
    out = {}
    for name in NAMES:
        ids = encode(tokenizer, " " + name)
        if len(ids) == 1:
            out[name] = int(ids[0])
    return out


def ioi_prompts(tokenizer, bos_id: int | None, n: int = N_PROMPTS, seed: int = 0, templates=TEMPLATES) -> list[dict]:
    """n IOI prompts, half ABBA, half BABA, seeded: dicts with `text`, `ids` (BOS first), `io`,
    `s` (token ids), `io_pos`, `s1_pos`, `s2_pos` (positions in ids) and `target`, `foil` (" IO",
    " S": the prompt format of headlens.ablation.prompts); `templates` a subset of TEMPLATES."""
    names = name_tokens(tokenizer)
    if len(names) < 2:
        raise ConfigError(f"this tokenizer spells {len(names)} of the {len(NAMES)} IOI names as one token; need 2")
    gen = torch.Generator().manual_seed(seed)
    keys = sorted(names)
    prompts = []
    for index in range(n):
        template = templates[int(torch.randint(len(templates), (1,), generator=gen))]
        io, s = (keys[int(i)] for i in torch.randperm(len(keys), generator=gen)[:2])
        order = (io, s) if index % 2 == 0 else (s, io)
        prompts.append(_build(tokenizer, bos_id, template, order, io, s, names))
    return prompts


def _build(tokenizer, bos_id, template, order, io, s, names) -> dict:
    """One prompt, token by token: the template's text pieces tokenized, each name its own id."""
    filled = {"0": order[0], "1": order[1], "s": s}
    ids = [bos_id] if bos_id is not None else []
    where: dict[str, list[int]] = {io: [], s: []}
    rest = template
    while "{" in rest:
        text, _, tail = rest.partition("{")
        slot, _, rest = tail.partition("}")
        ids += encode(tokenizer, text) if text else []
        where[filled[slot]].append(len(ids))
        ids.append(names[filled[slot]])
    ids += encode(tokenizer, rest) if rest else []
    text = template.replace("{0}", " " + order[0]).replace("{1}", " " + order[1]).replace("{s}", " " + s)
    return {
        "text": text,
        "ids": ids,
        "io": names[io],
        "s": names[s],
        "io_pos": where[io][0],
        "s1_pos": where[s][0],
        "s2_pos": where[s][1],
        "target": " " + io,
        "foil": " " + s,
    }


def end_attention(pattern: torch.Tensor, positions: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Attention from each prompt's last position to `positions`: pattern [batch, head, q_pos,
    k_pos], positions [batch, m] key positions (summed), last [batch] -> [batch, head]."""
    rows = pattern[torch.arange(pattern.shape[0]), :, last]  # [batch, head, k_pos]
    return rows.gather(-1, positions[:, None, :].expand(-1, rows.shape[1], -1)).sum(-1)  # [batch, head]


def ioi_run(loaded: LoadedModel, prompts: list[dict]) -> dict:
    """One forward pass over the prompts (right-padded): `io_attention`, `s_attention` and
    `ioi_direct_effect` [n_layers, n_heads] (means over prompts) with their `_std` across prompts,
    and the model's `logit_diff` (mean) and `logit_diffs` [n]; `per_prompt` holds the three scores of
    each prompt, [n, n_layers, n_heads] each."""
    model = loaded.model
    device = next(model.parameters()).device
    length = max(len(p["ids"]) for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, : len(p["ids"])], mask[row, : len(p["ids"])] = torch.tensor(p["ids"]), 1
    last = mask.sum(1) - 1  # [batch]
    ends = torch.unique(last)  # [n_ends] the positions whose logits are read (the LM head runs on these only)
    adapter = loaded.adapter
    at_end = _EndCapture(adapter, last)
    with torch.no_grad(), adapter.hooks() as hooks:
        at_end.register(hooks)
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            output_attentions=True,
            logits_to_keep=ends.to(device),
        )
    io = torch.tensor([[p["io_pos"]] for p in prompts])  # [batch, 1]
    s = torch.tensor([[p["s1_pos"], p["s2_pos"]] for p in prompts])  # [batch, 2]
    io_att = torch.stack([end_attention(a.cpu().double(), io, last) for a in out.attentions])  # [layer, batch, head]
    s_att = torch.stack([end_attention(a.cpu().double(), s, last) for a in out.attentions])  # [layer, batch, head]
    column = torch.searchsorted(ends, last)  # [batch]: each prompt's end among `ends`
    final = out.logits[torch.arange(len(prompts)), column.to(out.logits.device)].double().cpu()  # [batch, d_vocab]
    rows = torch.arange(len(prompts))
    io_ids, s_ids = torch.tensor([p["io"] for p in prompts]), torch.tensor([p["s"] for p in prompts])  # [batch]
    diffs = final[rows, io_ids] - final[rows, s_ids]  # [batch]
    direct = at_end.direct_effects(io_ids, s_ids).cpu()  # [layer, batch, head]
    nan = torch.full(io_att.shape[::2], float("nan"), dtype=torch.float64)  # [layer, head]: no spread of one prompt
    return {
        "io_attention": io_att.mean(1),  # [layer, head]
        "io_attention_std": io_att.std(1) if len(prompts) > 1 else nan,
        "s_attention": s_att.mean(1),
        "s_attention_std": s_att.std(1) if len(prompts) > 1 else nan.clone(),
        "ioi_direct_effect": direct.mean(1),  # [layer, head]
        "ioi_direct_effect_std": direct.std(1) if len(prompts) > 1 else nan.clone(),
        "logit_diff": float(diffs.mean()),
        "logit_diffs": diffs,
        "per_prompt": {
            "io_attention": io_att.transpose(0, 1),  # [batch, layer, head]
            "s_attention": s_att.transpose(0, 1),
            "ioi_direct_effect": direct.transpose(0, 1),
        },
    }


class _EndCapture:
    """What head_direct_effects reads at each prompt's last position, captured during the IOI pass:
    every layer's z, the attention output where a norm follows it, and the final norm's input."""

    def __init__(self, adapter, last: torch.Tensor):
        self.adapter, self.last = adapter, last  # last [batch]
        self.z: dict[int, torch.Tensor] = {}  # layer -> [batch, head, d_head]
        self.attn_out: dict[int, torch.Tensor] = {}  # layer -> [batch, d_model]
        self.final_in: list[torch.Tensor] = []  # [[batch, d_model]]

    def _at_end(self, x: torch.Tensor) -> torch.Tensor:
        return x[torch.arange(x.shape[0], device=x.device), self.last.to(x.device)].detach()  # [batch, ...]

    def register(self, hooks) -> None:
        adapter = self.adapter
        for layer in range(adapter.n_layers):
            hooks.z(layer, self._keeper(self.z, layer))
            if adapter.attn_out_norm_module(layer) is not None:
                hooks.output(adapter.z_module(layer), self._keeper(self.attn_out, layer))
        norm = adapter.final_norm()
        hooks.add(norm.register_forward_pre_hook(lambda module, args: self.final_in.append(self._at_end(args[0]))))

    def _keeper(self, store: dict, layer: int):
        """A hook function keeping a layer's tensor at END in `store` (returns None: nothing replaced)."""

        def keep(x: torch.Tensor) -> None:
            store[layer] = self._at_end(x)

        return keep

    def direct_effects(self, target: torch.Tensor, foil: torch.Tensor) -> torch.Tensor:
        """Each head's direct effect on logit(target) - logit(foil) at END: [layer, batch, head]."""
        layers = range(self.adapter.n_layers)
        attn_out = [self.attn_out[layer] for layer in layers] if self.attn_out else None
        z = [self.z[layer] for layer in layers]
        return head_direct_effects(self.adapter, z, attn_out, self.final_in[-1], target, foil)


def name_mover_scores(loaded: LoadedModel, n: int = N_PROMPTS, seed: int = 0) -> dict:
    """ioi_run's entries plus `name_copy_score`, `name_negative_copy_score` [n_layers, n_heads],
    `name_mover`, `negative_name_mover` (bool [n_layers, n_heads]) and the `prompts`."""
    prompts = ioi_prompts(loaded.tokenizer, loaded.bos_token_id, n, seed)
    result = ioi_run(loaded, prompts)
    names = torch.tensor(sorted(set(name_tokens(loaded.tokenizer).values())))  # [n_names]
    top, bottom = own_extremes(loaded.model, names, COPY_TOP_K)  # [layer, head, n_names] each
    copy, negative = top.double().mean(-1), bottom.double().mean(-1)
    attends = (result["io_attention"] >= IO_ATTENTION_MIN) & (result["io_attention"] > result["s_attention"])
    result.update(
        name_copy_score=copy,
        name_negative_copy_score=negative,
        prompts=prompts,
        name_mover=attends & (copy >= COPY_MIN),
        negative_name_mover=attends & (negative >= COPY_MIN),
    )
    return result


def ablation_prompts(prompts: list[dict]) -> list[dict]:
    """The prompts in headlens.ablation.prompts' format, for ablate_heads(metric="logit-diff")."""
    return [
        {"prompt": p["text"], "target": p["target"], "foil": p["foil"], "line": f"IOI prompt {n}"}
        for n, p in enumerate(prompts, start=1)
    ]


SCORE_KEYS = (
    "io_attention",
    "io_attention_std",
    "s_attention",
    "s_attention_std",
    "ioi_direct_effect",
    "ioi_direct_effect_std",
)
COPY_KEYS = ("name_copy_score", "name_negative_copy_score")
