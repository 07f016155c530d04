"""Where `classify --compare-texts` spends its time: the model load, then each probe on each text.

Runs what the command runs (load_model, then headlens.classify.compare.classify_texts on the shipped
held-out texts, or the given files) with every probe timed: wall seconds and this process's CPU seconds
(all threads), so a run on a loaded machine still shows the work done. Probes that do not read the text
run on the first text only (kinds.Probe.reads_text) and show as shared. Prints one JSON line.

    .venv/bin/python benchmarks/bench_compare_texts.py smollm2 [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from headlens.classify import ClassifyConfig, kinds
from headlens.classify.compare import classify_texts, read_texts, shipped_documents
from headlens.load.models import load_model


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> dict:
    wall, cpu = _clock()
    return {"wall_s": round(wall - start[0], 2), "cpu_s": round(cpu - start[1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("texts", nargs="*")
    args = parser.parse_args()
    spent: list[dict] = []
    original = kinds.Probe.run

    def timed(self, run):
        start = _clock()
        out = original(self, run)
        spent.append({"probe": self.name, **_since(start)})
        return out

    kinds.Probe.run = timed
    load_before = os.getloadavg()
    start = _clock()
    texts = read_texts(args.texts) if args.texts else shipped_documents()
    loaded = load_model(args.model)
    loading = _since(start)
    results = classify_texts(loaded, texts, ClassifyConfig())
    total = _since(start)
    per_text, i = {}, 0
    for n, name in enumerate(texts):
        ran = [p for p in kinds.PROBES.values() if n == 0 or p.reads_text]
        per_text[name] = spent[i : i + len(ran)]
        i += len(ran)
    print(
        json.dumps(
            {
                "model": args.model,
                "texts": list(texts),
                "threads": torch.get_num_threads(),
                "load_s": loading,
                "total": total,
                "probes": per_text,
                "labelled": {name: int(r.frame["labels"].map(len).gt(0).sum()) for name, r in results.items()},
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
