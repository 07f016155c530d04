"""What a real model has of the newer head kinds: successor, copy suppression, name movers.

Prints a markdown summary: per kind the labelled heads (at the score modules' cut-offs) and the
best-scoring heads with their scores, the model's own IOI logit difference, and the IOI ablation
of the labelled name movers (or, when none is labelled, of the top heads by io_attention x
name_copy_score) against 20 random same-layer-count head sets.

Run: nice -n 10 .venv/bin/python benchmarks/head_kinds.py /tmp/hf/smollm2
"""

from __future__ import annotations

import sys
import time

import torch

from headlens.ablation.ablate import ablate_heads
from headlens.errors import InputTextError
from headlens.heads import Head
from headlens.load.models import load_model
from headlens.probes.inputs import default_text
from headlens.scores.copy_suppression import copy_suppression_scores
from headlens.scores.name_mover import ablation_prompts, name_mover_scores
from headlens.scores.successor import successor_heads, successor_scores, successor_tasks

TOP = 5  # best heads listed per score


def top(scores: torch.Tensor, *also: torch.Tensor, k: int = TOP) -> str:
    n_heads = scores.shape[1]
    values, index = scores.flatten().topk(k)
    cells = []
    for value, i in zip(values.tolist(), index.tolist(), strict=True):
        extra = "".join(f"/{float(t.flatten()[i]):.2f}" for t in also)
        cells.append(f"{i // n_heads}.{i % n_heads} {value:.2f}{extra}")
    return ", ".join(cells)


def main(path: str) -> None:
    loaded = load_model(path)
    start = time.perf_counter()
    tasks = successor_tasks(loaded.tokenizer)
    succ = successor_scores(loaded.model, tasks)
    print(
        f"- successor (tasks: {', '.join(f'{t.name} {len(t.tokens)}' for t in tasks)}): "
        f"labelled {successor_heads(succ)}; top {top(succ)}"
    )
    try:
        cs = copy_suppression_scores(loaded, default_text())
    except InputTextError as err:  # a model that predicts no earlier token of the text (random weights)
        print(f"- copy suppression: not measured: {err}")
    else:
        print(
            f"- copy suppression: labelled {cs['copy_suppression'].nonzero().tolist()}; top cs_ov_score"
            f"/predicted_attention {top(cs['cs_ov_score'], cs['predicted_attention'])}; top predicted_attention"
            f"/cs_ov_score {top(cs['predicted_attention'], cs['cs_ov_score'])}"
        )
    nm = name_mover_scores(loaded)
    io, copy, neg = nm["io_attention"], nm["name_copy_score"], nm["name_negative_copy_score"]
    print(
        f"- IOI logit difference {nm['logit_diff']:.3f} over {len(nm['prompts'])} prompts "
        f"(IO above S in {float((nm['logit_diffs'] > 0).double().mean()):.0%})"
    )
    print(
        f"- name movers: labelled {nm['name_mover'].nonzero().tolist()}, negative "
        f"{nm['negative_name_mover'].nonzero().tolist()}; top io_attention/copy/negative copy "
        f"{top(io, copy, neg)}; top io_attention x copy {top(io * copy, io, copy)}; "
        f"top io_attention x negative copy {top(io * neg, io, neg)}"
    )
    labelled = nm["name_mover"].nonzero().tolist()
    chosen = labelled or [[i // io.shape[1], i % io.shape[1]] for i in (io * copy).flatten().topk(3).indices.tolist()]
    heads = [Head(int(a), int(b)) for a, b in chosen]
    prompts = ablation_prompts(nm["prompts"])
    result = ablate_heads(loaded, heads, metric="logit-diff", prompts=prompts, control=20).meta
    control = result["control"]
    print(
        f"- IOI ablation of {'labelled' if labelled else 'top io x copy'} {[str(h) for h in heads]}: delta "
        f"{result['delta']:.3f} (clean {result['clean']:.3f}); 20 random sets: min {min(control['deltas']):.3f}, "
        f"max {max(control['deltas']):.3f}; rank {control['rank']}, p {control['p_value']:.3f}"
    )
    print(f"- wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hf/smollm2")
