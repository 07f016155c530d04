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

`--retrieval-only --needle-depths 5,10,20 [--seeds 0,1] [--precision]`: the needle probe alone (the haystack
classify would read: the shipped English text), for each needle-depth count (needle tests = depths x 3 test
lengths): the retrieval labels and their bootstrap stability at each seed (float32) and at the first seed in
bfloat16, compared as above (seeds; precision), with each run's CPU seconds, tests retrieved, and the per-head
standard error of the score (sd over retrieved tests / sqrt(tests)) for the heads near the cut-off; one JSON line
per depth count.

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
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch
from previous_token_texts import probe_ids  # benchmarks/ is on sys.path when run as a script

from headlens.classify import ClassifyConfig, classify_heads, kinds
from headlens.classify.compare import compare_labels, shipped_documents
from headlens.classify.frame import _to_frame, classify_run
from headlens.classify.labels import label_head
from headlens.classify.runs import SOURCE_DEFAULT, ProbeResult, ProbeRun, probe_sizes, resolve_text
from headlens.classify.stability import add_columns
from headlens.load.models import load_model
from headlens.probes.corpus import document_windows
from headlens.probes.inputs import random_token_range, read_text, repeated_random_tokens
from headlens.results import Result


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


def needles_only(loaded, config) -> tuple[Result, dict]:
    """The needle probe alone on the haystack classify reads (the shipped text's first document, as the text
    probe leaves it), as a classify Result whose other scores are NaN (so only retrieval is labelled), with
    the bootstrap columns; and its figures: CPU s, tests, retrieved, per-head standard error near the cut-off."""
    spec, sizes = loaded.spec, probe_sizes(loaded.spec.n_ctx, config)
    run = ProbeRun(loaded, config, [resolve_text(None)], SOURCE_DEFAULT, sizes)
    facts = {"n_windows": 0, "n_windows_available": 0, "n_text_tokens": 0, "n_documents": 0}
    bos = loaded.bos_token_id
    for _ in document_windows(
        loaded.tokenizer,
        run.documents,
        sizes["window"],
        bos,
        config.max_windows,
        facts,
        run.haystack,
        haystack_len=sizes["needle_context"],
    ):
        pass
    cpu = time.process_time()
    found = kinds.PROBES["needles"].run(run)
    cpu = time.process_time() - cpu
    nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
    rest = ProbeResult({column: nan for column in [s.column for s in kinds.SCORES] + kinds.STD_COLUMNS})
    frame = _to_frame({"rest": rest, "needles": found}, spec)
    frame.insert(2, "labels", [label_head(row, config) for row in frame.to_dict("records")])
    add_columns(frame, {"needles": found.units}, config)
    per_test = found.units.ratios["retrieval_score"][0]  # [retrieved test, layer, head]
    n = len(per_test)
    score = per_test.mean(0)
    se = per_test.std(0, ddof=1) / np.sqrt(n)  # [layer, head]
    near = (score > config.retrieval_min / 2) & (score < config.retrieval_min * 2)
    se_near = np.sort(se[near]) if near.any() else np.array([np.nan])
    figures = {
        "cpu_s": round(cpu, 1),
        "tests": found.counts["n_needle_tests"],
        "retrieved": n,
        "tokens": found.counts["n_needle_tokens"],
        "heads_near_cut": int(near.sum()),
        "se_near_median": round(float(np.median(se_near)), 4),
        "se_near_max": round(float(se_near.max()), 4),
        "cut_inside_95": int((np.abs(score - config.retrieval_min) < 1.96 * se).sum()),
        # retrieved tests for 1.96 x se <= 0.02 at the median and the widest near-cut head (se ~ 1 / sqrt(tests))
        "retrieved_for_002": [float(np.ceil(n * (1.96 * v / 0.02) ** 2)) for v in (np.median(se_near), se_near.max())],
        "labelled": int(sum("retrieval" in labels for labels in frame["labels"])),
        "borderline": int(sum("retrieval" in b for b in frame["borderline"])),
    }
    meta = {"config": {f.name: getattr(config, f.name) for f in fields(config)}}
    return Result("heads", frame, meta), figures


def retrieval_only(args) -> None:
    """--retrieval-only: per needle-depth count, the seeds' and the precisions' retrieval labels compared."""
    models = {"float32": load_model(args.model)}
    if args.precision:
        models["bfloat16"] = load_model(args.model, dtype="bfloat16")
    seeds = [int(s) for s in args.seeds.split(",")]
    for depths in (int(d) for d in args.needle_depths.split(",")):
        runs, figures = {}, {}
        for dtype, seed in [("float32", s) for s in seeds] + [(d, seeds[0]) for d in models if d != "float32"]:
            config = ClassifyConfig(seed=seed, needle_depths=depths)
            name = f"{dtype}_seed{seed}"
            runs[name], figures[name] = needles_only(models[dtype], config)
        out = {"model": args.model, "needle_depths": depths, "runs": figures}
        out["seeds"] = _role(_table({f"seed{s}": runs[f"float32_seed{s}"] for s in seeds}), "retrieval")
        if args.precision:
            pair = {d: runs[f"{d}_seed{seeds[0]}"] for d in models}
            out["precision"] = _role(_table(pair), "retrieval")
        print(json.dumps(out), flush=True)


def _role(rows: list[dict], role: str) -> dict | None:
    return next((row for row in rows if row["role"] == role), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--extra", nargs="*", default=[])
    parser.add_argument("--watch", default="")
    parser.add_argument("--precision", action="store_true")
    parser.add_argument("--stages", default="shipped,seeds", help="comma-separated: shipped, seeds")
    parser.add_argument("--retrieval-only", action="store_true", help="the needle probe alone (module docstring)")
    parser.add_argument("--needle-depths", default="5", help="comma-separated needle-depth counts (--retrieval-only)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (--retrieval-only)")
    args = parser.parse_args()
    if args.retrieval_only:
        retrieval_only(args)
        return
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
