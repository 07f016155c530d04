"""Do a model's watched previous-token heads feed its induction heads through their keys?

The causal check of a previous-token label (Olsson et al. 2022: a previous-token head's write is what an
induction head's key reads): exact path patching (headlens.circuits.paths.path_patch, zero ablation) of
every sender -> induction-head key edge on the induction task (random tokens repeated twice; the metric is
the loss on the second copy, so a positive effect is loss the key path carries), the senders being every
head of the watched heads' layers. The induction heads come from attention on repeated random tokens
(tests/helpers/circuits_roles.attention_roles, score >= 0.4), not from headlens's labels.

Reported:
- the watched set's mean effect over (sender, later induction head) pairs against 100 random sets with
  the same heads per layer (permutation p, tests/helpers/circuits_roles.permutation_p);
- each watched head alone: its mean effect and its rank among the heads of its layer (the other heads
  of the layer are its controls: same depth, same receivers);
- the same two readings from the weights (K-composition, headlens.circuits.composition).

    .venv/bin/python benchmarks/previous_token_causal.py smollm2 --watch 17.8,19.3,19.8 [--reference 16.0]
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.helpers

from headlens.circuits.composition import composition_scores  # noqa: E402
from headlens.circuits.paths import path_patch  # noqa: E402
from headlens.circuits.tasks import induction_task  # noqa: E402
from headlens.heads import Head  # noqa: E402
from headlens.load.models import load_model  # noqa: E402
from tests.helpers.circuits_roles import attention_roles, pair_mean, permutation_p  # noqa: E402


def _heads(text: str) -> list[Head]:
    return [Head(*map(int, h.split("."))) for h in text.split(",") if h]


def per_head(values: dict, heads: list[Head], receivers: list[Head], n_heads: int) -> dict:
    """Each head's mean over its later receivers, and its rank (1 = largest) among its layer's heads."""
    out = {}
    for head in heads:
        layer = [Head(head.layer, h) for h in range(n_heads)]
        means = {str(h): pair_mean(values, [h], receivers) for h in layer}
        ordered = sorted(means, key=means.get, reverse=True)
        others = [v for k, v in means.items() if k != str(head)]
        out[str(head)] = {
            "mean": round(means[str(head)], 5),
            "rank_in_layer": ordered.index(str(head)) + 1,
            "layer_others_max": round(max(others), 5),
            "layer_others_median": round(sorted(others)[len(others) // 2], 5),
        }
    return out


def reading(values: dict, watch: list[Head], reference: list[Head], receivers: list[Head], n_heads: int) -> dict:
    out = {
        "set": {
            k: round(v, 5) if isinstance(v, float) else v
            for k, v in permutation_p(values, watch, receivers, n_heads).items()
        }
    }
    out["heads"] = per_head(values, watch + reference, receivers, n_heads)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--watch", required=True)
    parser.add_argument("--reference", default="", help="heads read alone beside the watched ones")
    parser.add_argument("--n", type=int, default=8, help="induction task sequences")
    parser.add_argument("--seq-len", type=int, default=24)
    args = parser.parse_args()
    watch, reference = _heads(args.watch), _heads(args.reference)
    loaded = load_model(args.model)
    n_heads = loaded.spec.n_heads
    prev, induction = attention_roles(loaded)
    first = min(h.layer for h in watch + reference)
    receivers = sorted(h for h in induction if h.layer > first)
    layers = sorted({h.layer for h in watch + reference})
    senders = [Head(layer, h) for layer in layers for h in range(n_heads)]
    start = time.perf_counter()
    task = induction_task(loaded, n=args.n, seq_len=args.seq_len, seed=5)
    frame = path_patch(loaded, task, senders=senders, receivers=receivers, via=("k",)).frame
    patched = dict(zip(zip(frame["sender"], frame["receiver"], strict=True), frame["effect"], strict=True))
    patch_s = time.perf_counter() - start
    comp = composition_scores(loaded).frame
    comp = comp[comp["via"] == "k"]
    weights = dict(zip(zip(comp["sender"], comp["receiver"], strict=True), comp["composition"], strict=True))
    out = {
        "model": args.model,
        "attention_previous_token": [str(h) for h in prev],
        "receivers": [str(h) for h in receivers],
        "task": task.description,
        "path_patching_k": reading(patched, watch, reference, receivers, n_heads),
        "k_composition": reading(weights, watch, reference, receivers, n_heads),
        "composition_baseline": round(float(comp["composition_baseline"].iloc[0]), 5),
        "path_patching_s": round(patch_s, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
