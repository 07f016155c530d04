"""Do a real model's labelled name movers carry the IOI task under Wang et al.'s own ablation? One run.

Wang et al. 2022 (arXiv 2211.00593) knock heads out by mean ablation over the ABC distribution: the same
prompts with the second mention of the subject replaced by a third name, so that nothing in them says which
name is the indirect object. Here each head's z is replaced, position by position, by its mean over ABC
versions of the probe's 48 IOI prompts (headlens.scores.name_mover; 4 third names per prompt, means taken
within each template, whose positions line up) and, beside it, by zero. For the labelled name movers and
negative name movers it prints the change of the IOI logit difference (logit(IO) - logit(S) at END, mean over
prompts), then the same change for (a) `--controls` random sets of the same size from all the other heads
and (b) every set of the same per-layer counts from the other heads of their layers (at most 20), with the
share of control sets that lower it at least as much (p for name movers, which should lower it) and that
raise it at least as much (p for negative name movers).

`--freeze 24.4` holds the given heads at their clean z in every run, the controls' included (and draws no
control set from them): with a self-repairing head frozen, what the tested heads' ablation costs when that
head cannot respond (McDougall et al. 2023, arXiv 2310.04625: copy suppression explains part of the IOI
self-repair).

Run: .venv/bin/python -u benchmarks/ioi_mean_ablation.py smollm2 [--controls 100] [--heads 23.3] [--freeze 24.4]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from name_mover_ablation import disjoint_sets  # benchmarks/ is on sys.path when run as a script

from headlens.heads import Head, parse_heads
from headlens.intervene.replace import ablation_hooks
from headlens.load.models import load_model
from headlens.scores.name_mover import ioi_prompts, name_mover_scores, name_tokens

THIRD_NAMES = 4  # ABC versions per IOI prompt
MAX_SAME_LAYER = 20


def template_key(p: dict) -> tuple:
    """The prompt's ids with its three name positions blanked: equal for prompts of one template."""
    ids = list(p["ids"])
    for at in (p["io_pos"], p["s1_pos"], p["s2_pos"]):
        ids[at] = -1
    return tuple(ids)


def abc_means(loaded, groups: dict[tuple, list[dict]], seed: int = 1) -> dict[tuple, dict[int, torch.Tensor]]:
    """Per template, per layer, z averaged over the ABC versions of its prompts: [pos, head, d_head]."""
    names = sorted(set(name_tokens(loaded.tokenizer).values()))
    gen = torch.Generator().manual_seed(seed)
    adapter = loaded.adapter
    means: dict = {}
    for key, group in groups.items():
        rows = []
        for p in group:
            others = [n for n in names if n not in (p["io"], p["s"])]
            for i in torch.randperm(len(others), generator=gen)[:THIRD_NAMES].tolist():
                ids = list(p["ids"])
                ids[p["s2_pos"]] = others[i]  # "..., C gave a drink to"
                rows.append(ids)
        means[key] = _mean_z(loaded.model, adapter, torch.tensor(rows))
    return means


def _mean_z(model, adapter, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per layer, z averaged over the sequences of `ids` (one template: aligned): [pos, head, d_head]."""
    store: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def hook(z: torch.Tensor) -> torch.Tensor:
            store[layer] = z.mean(0)  # [pos, head, d_head]
            return z

        return hook

    with torch.no_grad(), adapter.hooks() as hooks:
        for layer in range(adapter.n_layers):
            hooks.z(layer, keep(layer))
        model(input_ids=ids)
    return store


def clean_z(loaded, groups, heads: list[Head]) -> dict[tuple, dict[Head, torch.Tensor]]:
    """Per template, each head's z on the clean prompts: [batch, pos, d_head]."""
    adapter = loaded.adapter
    found: dict = {}
    for key, group in groups.items():
        store: dict[int, torch.Tensor] = {}
        with torch.no_grad(), adapter.hooks() as hooks:
            for layer in {h.layer for h in heads}:
                hooks.z(layer, lambda z, layer=layer, store=store: store.__setitem__(layer, z.clone()))
            loaded.model(input_ids=torch.tensor([p["ids"] for p in group]))
        found[key] = {h: store[h.layer][:, :, h.head] for h in heads}
    return found


def logit_diff(loaded, groups, means, heads: list[Head], method: str, frozen=None) -> float:
    """Mean logit(IO) - logit(S) at END with `heads` ablated by `method` (zero | abc-mean) and the heads of
    `frozen` ({template: {head: clean z}}, clean_z) held at their clean z."""
    total, n = 0.0, 0
    with torch.no_grad():
        for key, group in groups.items():
            ids = torch.tensor([p["ids"] for p in group])  # [batch, pos], one template: no padding
            rep = {}
            if method == "abc-mean":
                rep = {h: means[key][h.layer][None, :, h.head] for h in heads}  # [1, pos, d_head]
            held = (frozen or {}).get(key, {})
            rep.update(held)  # [batch, pos, d_head] each
            with ablation_hooks(loaded.model, [*heads, *held], rep or None):
                logits = loaded.model(input_ids=ids, logits_to_keep=1).logits[:, -1].double()  # [batch, d_vocab]
            rows = torch.arange(len(group))
            io, s = torch.tensor([p["io"] for p in group]), torch.tensor([p["s"] for p in group])
            total += float((logits[rows, io] - logits[rows, s]).sum())
            n += len(group)
    return total / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--controls", type=int, default=100, help="random same-size sets")
    parser.add_argument("--heads", default=None, help='heads to test instead of the labelled ones ("23.0,23.3")')
    parser.add_argument("--freeze", default=None, help='heads held at their clean z in every run ("24.4")')
    args = parser.parse_args()
    loaded = load_model(args.model)
    scores = name_mover_scores(loaded)
    prompts = ioi_prompts(loaded.tokenizer, loaded.bos_token_id, 48, 0)
    groups: dict[tuple, list[dict]] = {}
    for p in prompts:
        groups.setdefault(template_key(p), []).append(p)
    means = abc_means(loaded, groups)
    spec = loaded.spec
    everyone = [Head(layer, head) for layer in range(spec.n_layers) for head in range(spec.n_heads)]
    labelled = {
        kind: [Head(int(a), int(b)) for a, b in scores[kind].nonzero().tolist()]
        for kind in ("name_mover", "negative_name_mover")
    }
    if args.heads:
        labelled = {"given heads": parse_heads(args.heads, spec.n_layers, spec.n_heads)}
    held = parse_heads(args.freeze, spec.n_layers, spec.n_heads) if args.freeze else []
    frozen = clean_z(loaded, groups, held) if held else None
    labelled = {kind: [h for h in heads if h not in held] for kind, heads in labelled.items()}
    print("heads:", {kind: [str(h) for h in heads] for kind, heads in labelled.items()}, "frozen:", held)
    for method in ("zero", "abc-mean"):
        start = time.time()
        clean = logit_diff(loaded, groups, means, [], method, frozen)  # frozen at their clean z: the clean run
        print(f"{method}: clean logit diff {clean:.3f}", flush=True)
        for kind, heads in labelled.items():
            if not heads:
                print(f"  no {kind} labelled (or every one frozen)")
                continue
            delta = logit_diff(loaded, groups, means, heads, method, frozen) - clean
            gen = torch.Generator().manual_seed(0)
            others = [h for h in everyone if h not in heads and h not in held]
            same_size = [
                [others[int(i)] for i in torch.randperm(len(others), generator=gen)[: len(heads)]]
                for _ in range(args.controls)
            ]
            same_layer = [s for s in disjoint_sets(heads, spec.n_heads, k=sys.maxsize) if not set(s) & set(held)][
                :MAX_SAME_LAYER
            ]
            print(f"  {kind} {', '.join(map(str, heads))} ablated: delta {delta:+.3f} logits", flush=True)
            for design, sets in (("same-size", same_size), ("same-layer", same_layer)):
                if not sets:
                    continue
                deltas = sorted(logit_diff(loaded, groups, means, s, method, frozen) - clean for s in sets)
                lowered = (1 + sum(d <= delta for d in deltas)) / (1 + len(deltas))
                raised = (1 + sum(d >= delta for d in deltas)) / (1 + len(deltas))
                print(
                    f"    {len(deltas)} {design} sets: min {deltas[0]:+.3f} median {deltas[len(deltas) // 2]:+.3f} "
                    f"max {deltas[-1]:+.3f}; p(lowered at least as much) = {lowered:.3f}, p(raised at least as "
                    f"much) = {raised:.3f}  ({time.time() - start:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
