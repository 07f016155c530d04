"""Backups of a role on a real model: which heads make up for it, their p-values, the weights detector's
ROC-AUC against them, and the time each part takes. One run per task.

For each task (ioi: the name movers; induction: the induction heads; labels from classify, kept in headlens's
cache as the explorer keeps them) it runs
headlens.circuits.find_backups and prints one JSON line: the role's heads, the lost direct effect, the
backups with compensation and p, the OV-similarity detector's ROC-AUC over every other head, the detector's
rank of each backup, and the seconds for the clean and ablated runs plus the controls.

Run: .venv/bin/python -u benchmarks/backups_auc.py smollm2 --tasks ioi induction [--controls 39] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time

from headlens.circuits.backups import find_backups
from headlens.circuits.tasks import make_task
from headlens.classify.cache import cached_classification
from headlens.classify.roles import frame_labels
from headlens.load.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tasks", nargs="+", default=["ioi", "induction"])
    parser.add_argument("--controls", type=int, default=39)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    loaded = load_model(args.model)
    start = time.perf_counter()
    labels = frame_labels(cached_classification(loaded))
    print(json.dumps({"model": args.model, "labels_s": round(time.perf_counter() - start, 1)}), flush=True)
    for name in args.tasks:
        task = make_task(loaded, name, seed=args.seed)
        start = time.perf_counter()
        result = find_backups(loaded, task, labels, controls=args.controls, seed=args.seed)
        seconds = time.perf_counter() - start
        frame = result.frame
        ranked = frame.sort_values("ov_similarity", ascending=False, kind="stable")["head"].tolist()
        backups = frame[frame["backup"]]
        top = frame.head(8)[["head", "compensation", "p_value", "ov_similarity"]].round(4).to_dict("records")
        print(
            json.dumps(
                {
                    "task": name,
                    "role": result.meta["role"],
                    "ablated": result.meta["ablated"],
                    "lost": round(result.meta["lost"], 4),
                    "total_effect": round(result.meta["total_effect"], 4),
                    "controls": result.meta["controls"],
                    "p_min": round(result.meta["p_min"], 4),
                    "backups": [
                        {"head": r.head, "compensation": round(r.compensation, 4), "p": round(r.p_value, 4),
                         "detector_rank": ranked.index(r.head) + 1}
                        for r in backups.itertuples()
                    ],
                    "auc": result.meta["auc"],
                    "top_compensation": top,
                    "seconds": round(seconds, 1),
                    "passes": result.meta["controls"] + 2,
                }
            ),
            flush=True,
        )  # fmt: skip


if __name__ == "__main__":
    main()
