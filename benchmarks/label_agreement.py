"""Do a real model's labels hold across texts and precisions? And what do its previous-token heads do on
random tokens, where the previous token is known?

1. `shipped`: classify on the shipped held-out texts (English, Spanish, Python), then any `--extra` files
   (e.g. /usr/share/common-licenses/GPL-3), the probes that do not read the text run once (as --compare-texts
   does); per role the heads on each text, Jaccard, flips, the borderline heads of each run; the wall and CPU
   seconds of the load and of each text; for `--watch` heads their positional offset, share with its 95% bootstrap
   interval and stability, and prev_token_score on each text.
2. `random_tokens`: the same positional probe (Voita argmax share, prev_token_score) on the repeated random
   token sequences the repeats probe reads (first repeat only: before any token repeats), for the watched
   heads.
3. `seeds`: the default text at seed 0 and seed 1 (the random tokens and needles change).
4. `precision` (with --precision): classify in float32 and bfloat16 on the default text; Jaccard per role and
   the heads whose label depends on the precision.

    .venv/bin/python benchmarks/label_agreement.py smollm2 --extra /usr/share/common-licenses/GPL-3 \
        --watch 17.8,19.3,19.8 [--precision] [--stages shipped,seeds]
Prints one JSON line per stage as it finishes (shipped; seeds; the extra texts, watched heads and random
tokens; precision). `--stages` runs part of it (a long run split over several processes): `shipped` (with the
extra texts, watched heads and random tokens), `seeds`; `--stages ""` with `--precision` runs the precision
stage alone. Without `shipped`, seed 0's float32 run on the default text is classified afresh.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from previous_token_texts import probe_ids  # benchmarks/ is on sys.path when run as a script

from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify.compare import compare_labels, shipped_documents
from headlens.classify.frame import classify_run
from headlens.load.models import load_model
from headlens.probes.inputs import random_token_range, read_text, repeated_random_tokens


def _watched(frame, heads: list[tuple[int, int]]) -> dict:
    out = {}
    for layer, head in heads:
        row = frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]
        out[f"{layer}.{head}"] = {
            "offset": int(row["positional_offset"]),
            "share": round(float(row["positional_share"]), 4),
            "share_ci": [round(float(row["positional_share_lo"]), 4), round(float(row["positional_share_hi"]), 4)],
            "previous_token_stability": round(float(row["previous_token_stability"]), 4),
            "prev_token_score": round(float(row["prev_token_score"]), 4),
            "labels": list(row["labels"]),
        }
    return out


def random_token_positional(loaded, config, heads) -> dict:
    """Argmax share at offset -1 and prev_token_score on random tokens (no token repeats)."""
    low, high = random_token_range(loaded.spec.d_vocab, config.token_low, config.token_high)
    ids = repeated_random_tokens(16, 255, 1, low, high, None, seed=config.seed).tolist()  # [16, 255]
    return probe_ids(loaded, config, ids, heads)


def _borderline(frame, label: str) -> list[str]:
    return [f"{r.layer}.{r.head}" for r in frame.itertuples() if label in r.borderline]


def _table(results) -> list[dict]:
    """compare_labels' rows, each with `borderline_<name>`: the role's heads borderline on that run."""
    rows = json.loads(compare_labels(results).to_json(orient="records"))
    for row in rows:
        for name, result in results.items():
            row[f"borderline_{name}"] = _borderline(result.frame, row["role"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--extra", nargs="*", default=[])
    parser.add_argument("--watch", default="")
    parser.add_argument("--precision", action="store_true")
    parser.add_argument("--stages", default="shipped,seeds", help="comma-separated: shipped, seeds")
    args = parser.parse_args()
    stages = set(filter(None, args.stages.split(",")))
    heads = [tuple(map(int, h.split("."))) for h in args.watch.split(",") if h]
    config = ClassifyConfig()
    start, cpu = time.perf_counter(), time.process_time()
    loaded = load_model(args.model)
    texts = shipped_documents()
    texts.update({Path(p).stem: read_text(p) for p in args.extra})
    seconds = {"load": [round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)]}
    results, reuse = {}, None
    todo = texts.items() if "shipped" in stages else ()
    for name, text in todo:  # the shipped three first, as --compare-texts runs them
        start, cpu = time.perf_counter(), time.process_time()
        results[name], probes = classify_run(loaded, text, config, reuse=reuse)
        reuse = reuse or probes
        seconds[name] = [round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)]
        if len(results) == 3:
            out = {"model": args.model, "seconds": seconds, "shipped": _table(results)}
            print(json.dumps(out), flush=True)
    if "english" not in results and ("seeds" in stages or args.precision):
        start, cpu = time.perf_counter(), time.process_time()
        results["english"] = classify_heads(loaded, config=config)
        seconds["english"] = [round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)]
    if "seeds" in stages:
        start, cpu = time.perf_counter(), time.process_time()
        other = classify_heads(loaded, config=replace(config, seed=1))
        seconds["seed1"] = [round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)]
        table = _table({"seed0": results["english"], "seed1": other})
        print(json.dumps({"model": args.model, "seconds": seconds, "seeds": table}), flush=True)
    if "shipped" in stages:
        out = {"model": args.model, "seconds": seconds}
        if args.extra:
            names = ("english", *(Path(p).stem for p in args.extra))
            out["english_vs_extra"] = _table({k: results[k] for k in names})
        out["watched"] = {name: _watched(result.frame, heads) for name, result in results.items()}
        out["random_tokens"] = random_token_positional(loaded, config, heads)
        print(json.dumps(out), flush=True)
    if args.precision:
        start, cpu = time.perf_counter(), time.process_time()
        low = classify_heads(load_model(args.model, dtype="bfloat16"), config=config)
        seconds["bfloat16"] = [round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)]
        pair = {"float32": results["english"], "bfloat16": low}
        print(json.dumps({"model": args.model, "seconds": seconds, "precision": _table(pair)}), flush=True)


if __name__ == "__main__":
    main()
