"""CPU and wall time of each classify probe (headlens.classify.kinds.PROBES) in one process, so every probe
is timed under the same machine load.

`--only copy_suppression,ioi` runs just those probes, with the haystack the text probe would leave
(the first document's tokens, whole) filled in directly.

Run: .venv/bin/python benchmarks/classify_probes.py smollm2 [--only copy_suppression,ioi]
"""

from __future__ import annotations

import argparse
import time

import torch

from headlens.classify import kinds
from headlens.classify.labels import ClassifyConfig
from headlens.classify.runs import SOURCE_DEFAULT, ProbeRun, default_ids, probe_sizes, resolve_text
from headlens.load.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--only", default=None, help="comma-separated PROBES names")
    args = parser.parse_args()
    loaded = load_model(args.model)
    config = ClassifyConfig()
    run = ProbeRun(loaded, config, [resolve_text(None)], SOURCE_DEFAULT, probe_sizes(loaded.spec.n_ctx, config))
    names = args.only.split(",") if args.only else list(kinds.PROBES)
    if "text" not in names:
        run.haystack.extend(default_ids(loaded))
    cpu = {}
    for name in names:
        wall, start = time.perf_counter(), time.process_time()
        result = kinds.PROBES[name].run(run)
        cpu[name] = time.process_time() - start
        print(
            f"{name}: wall {time.perf_counter() - wall:.1f} s, cpu {cpu[name]:.1f} s; facts {result.facts}", flush=True
        )
    print(f"all: cpu {sum(cpu.values()):.1f} s")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
