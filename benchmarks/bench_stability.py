"""What the label intervals and stabilities cost classify, and what they say, on a real model.

Runs `classify_heads` once with the default bootstrap (headlens.classify.stability.N_RESAMPLES
resamples) and times the bootstrap step (`stability.add_columns`) inside it, so the added share is
measured on the same run: share = bootstrap seconds / (classify seconds - bootstrap seconds). Prints
one JSON line: the model, the times, the units each probe resampled, and per role the labelled heads,
the borderline ones with their stabilities.

    .venv/bin/python benchmarks/bench_stability.py smollm2 [--seed 0] [--text FILE]
"""

from __future__ import annotations

import argparse
import json
import time

from headlens.classify import ClassifyConfig, classify_heads, frame, kinds, stability
from headlens.load.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", default=None)
    args = parser.parse_args()
    loaded = load_model(args.model)
    text = open(args.text, encoding="utf-8").read() if args.text else None
    spent = []
    original = frame.add_columns

    def timed(*a, **k):
        start = time.perf_counter()
        out = original(*a, **k)
        spent.append(time.perf_counter() - start)
        return out

    frame.add_columns = timed
    start = time.perf_counter()
    heads = classify_heads(loaded, text=text, config=ClassifyConfig(seed=args.seed))
    total = time.perf_counter() - start
    rows = heads.frame
    roles = {}
    for kind in kinds.KINDS:
        held = rows[[kind.label in labels for labels in rows["labels"]]]
        weak = held[[kind.label in b for b in held["borderline"]]]
        if len(held):
            roles[kind.label] = {
                "heads": len(held),
                "borderline": {
                    f"{r.layer}.{r.head}": round(float(getattr(r, f"{kind.label}_stability")), 4)
                    for r in weak.itertuples()
                },
            }
    print(
        json.dumps(
            {
                "model": args.model,
                "seed": args.seed,
                "classify_s": round(total, 2),
                "bootstrap_s": round(spent[0], 3),
                "added_share": round(spent[0] / (total - spent[0]), 4),
                "resamples": stability.N_RESAMPLES,
                "stability": heads.meta["probes"]["stability"],
                "roles": roles,
            }
        )
    )


if __name__ == "__main__":
    main()
