"""Discovery's stability resamples: scored in the task's own passes against each resample scored anew.

    .venv/bin/python benchmarks/bench_discover_resamples.py smollm2 ioi [METHOD [STEPS]]

One torch thread. For one task and METHOD (eap-ig by default, discover's default; or eap): the reference
run (GraphTask); the task's edge scores alone (GraphTask.scores); the task's and its 5 bootstrap resamples'
scores from the same passes (headlens.circuits.resampled.scored, what discover does); and the first
resample made into a task of its own (take_rows) and scored anew, reference run included (what discover
did for each of the 5). Prints each one's wall and CPU time, the largest difference between the first
resample's two score matrices, and whether their top-k edge sets (k = 100, 1,000) agree.
"""

from __future__ import annotations

import sys
import time

import torch

from headlens.circuits.discover import select
from headlens.circuits.faithfulness import DEFAULT_METHOD, DEFAULT_STEPS, GraphTask
from headlens.circuits.moretasks import circuit_task
from headlens.circuits.resampled import resample_rows, scored
from headlens.circuits.tasks import take_rows
from headlens.load.models import load_model


def timed(label, fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{label}: wall {time.perf_counter() - start:.1f} s, CPU {time.process_time() - cpu:.1f} s", flush=True)
    return out


def main(model: str, task_name: str, method: str = DEFAULT_METHOD, steps: int = DEFAULT_STEPS) -> None:
    torch.set_num_threads(1)
    loaded = load_model(model)
    task = circuit_task(loaded, task_name, None, None, 0)
    print(f"{model} {task_name}, {method} ({steps} steps), {tuple(task.tokens.shape)} tokens", flush=True)
    gt = timed("reference run", lambda: GraphTask(loaded, task))
    alone = timed("the task's scores alone", lambda: gt.scores(method, steps))
    both = timed("the task's and 5 resamples' scores, shared passes", lambda: scored(gt, method, steps, seed=0))
    first = resample_rows(task.tokens.shape[0], 0)[0]

    def anew():
        again = GraphTask(loaded, take_rows(task, first))
        return again.scores(method, steps)

    own = timed("one resample scored anew (its reference run included)", anew)
    shared = both[1][0]
    print(f"task's scores: alone vs shared, max |diff| {float((alone - both[0]).abs().max()):.2e}")
    print(f"first resample: shared vs anew, max |diff| {float((shared - own).abs().max()):.2e}, ", end="")
    print(f"max |score| {float(own.abs().max()):.3f}")
    for k in (100, 1000):
        same = torch.equal(select(gt, shared, k, "top"), select(gt, own, k, "top"))
        print(f"top-{k} edges of the first resample equal: {same}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], *(args[2:3]), *(int(a) for a in args[3:4]))
