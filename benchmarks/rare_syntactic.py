"""What a model has of rare-word and syntactic heads, and what the two probes cost.

Runs the two classify probes (headlens.scores.rare_word, headlens.scores.syntactic) as classify runs
them (default ClassifyConfig, the shipped held-out text and the shipped parsed sample), timing each,
and prints a markdown summary: the labelled heads, the best heads, the sentences scored, the
rare-word positional baselines, and per relation its direction, instances, best fixed-offset
baseline and best head.

Run: .venv/bin/python benchmarks/rare_syntactic.py smollm2 [rare_word|syntactic]
"""

from __future__ import annotations

import sys
import time

from headlens.classify import kinds
from headlens.classify.labels import ClassifyConfig
from headlens.classify.runs import SOURCE_DEFAULT, ProbeRun, probe_sizes, resolve_text
from headlens.load.models import load_model
from headlens.scores import syntactic
from headlens.scores.syntactic import load_treebank, relation_accuracy, syntactic_frame, syntax_sample

TOP = 5


def best(scores, k: int = TOP) -> str:
    flat = scores.flatten()
    order = flat.argsort(descending=True)[:k].tolist()
    n_heads = scores.shape[1]
    return ", ".join(f"{i // n_heads}.{i % n_heads} {float(flat[i]):.2f}" for i in order)


def main(name: str, only: str | None = None) -> None:
    loaded = load_model(name)
    config = ClassifyConfig()
    run = ProbeRun(loaded, config, [resolve_text(None)], SOURCE_DEFAULT, probe_sizes(loaded.spec.n_ctx, config))
    if only != "syntactic":
        rare_word(loaded, config, run, name)
    if only != "rare_word":
        syntax(loaded, config, run, name)


def rare_word(loaded, config, run, name: str) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    rare = kinds.PROBES["rare_word"].run(run)
    rare_s, rare_cpu = time.perf_counter() - start, time.process_time() - cpu
    facts, scores = rare.facts["rare_word"], rare.scores["rare_word_score"]
    labelled = [f"{l_}.{h}" for l_, h in (scores >= config.rare_word_min).nonzero().tolist()]
    print(f"## {name}: rare-word heads ({rare_s:.1f} s wall, {rare_cpu:.1f} s CPU)\n")
    print(f"- sentences {facts['n_sentences']}, skipped {facts['skipped']}")
    print(f"- chance {facts['chance']:.3f}, last word is the rarest {facts['last_word']:.3f}")
    print(f"- labelled (>= {config.rare_word_min}): {', '.join(labelled) or 'none'}; best: {best(scores)}\n")


def syntax(loaded, config, run, name: str) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    window = run.sizes["window"]
    sample = syntax_sample(
        loaded.tokenizer,
        load_treebank(),
        loaded.bos_token_id,
        window,
        int(syntactic.TOKEN_SHARE * config.max_windows * window),
    )
    accuracy = relation_accuracy(loaded, sample, config.batch_size)
    syn_s, syn_cpu = time.perf_counter() - start, time.process_time() - cpu
    frame = syntactic_frame(accuracy, sample.relations, config.syntactic_min)
    print(f"## {name}: syntactic heads ({syn_s:.1f} s wall, {syn_cpu:.1f} s CPU; {len(sample.sentences)} sentences)\n")
    print("| relation | direction | n | baseline (offset) | best head: accuracy | heads >= 10 points |")
    print("|---|---|---|---|---|---|")
    for rel, rows in frame.groupby("relation", sort=True):
        top = rows.sort_values("margin", ascending=False).iloc[0]
        passed = rows[rows["syntactic"]].sort_values("margin", ascending=False)
        names = ", ".join(f"{r.layer}.{r.head}" for r in passed.itertuples()) or "none"
        print(
            f"| {rel} | {top['direction']} | {top['n']} | {top['baseline']:.2f} ({top['offset']}) | "
            f"{top['layer']}.{top['head']}: {top['accuracy']:.2f} | {names} |"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "smollm2", sys.argv[2] if len(sys.argv) > 2 else None)
