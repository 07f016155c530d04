"""AtP* vs plain attribution patching vs the exact sweep: wall time, CPU time, agreement.

Models: the GPT-2-small-shaped model (random weights, seed 0; data as benchmarks/bench_ablate.py:
4 sequences x 128 tokens, every next-token prediction counted), the shipped tiny model (loss on its
held-out text, repeat on repeated random tokens) and the planted model of tests/helpers/planted.py (seed 0,
repeat). Zero ablation; agreement = headlens.ablation.approx.agreement against the exact sweep.

Run: nice -n 10 .venv/bin/python benchmarks/bench_attribution.py  (prints a markdown table)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.helpers

THREADS = 1  # one thread: on a loaded 2-core machine two threads stall on OpenMP barriers (tests/conftest.py)


def _timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def _frame(deltas: torch.Tensor, column: str) -> pd.DataFrame:
    n_layers, n_heads = deltas.shape
    return pd.DataFrame(
        [
            {"layer": layer, "head": head, column: float(deltas[layer, head])}
            for layer in range(n_layers)
            for head in range(n_heads)
        ]
    )


def compare(name: str, model, evalset) -> list[dict]:
    """Exact sweep, atp and atp* on one evaluation set (zero ablation): rows of the table."""
    from headlens.ablation.approx import agreement
    from headlens.ablation.gradients import atp_star_deltas, attribution_deltas
    from headlens.arch import adapter_for
    from headlens.heads import all_heads
    from headlens.intervene.sums import base_sums, sweep_sums

    adapter = adapter_for(model)
    zero = [None] * adapter.n_layers

    def exact_deltas():
        base, found = base_sums(model, evalset), {}
        heads = all_heads(adapter.n_layers, adapter.n_heads)
        sweep_sums(model, evalset, heads, zero, lambda h, s: found.update({h: float((s - base).sum())}))
        return torch.tensor(
            [
                [found[(layer, head)] / evalset.n_tokens for head in range(adapter.n_heads)]
                for layer in range(adapter.n_layers)
            ]
        )

    exact, t_exact, c_exact = _timed(exact_deltas)
    reference = _frame(exact, "delta")
    rows = [{"model": name, "method": "exact sweep", "wall_s": t_exact, "cpu_s": c_exact}]
    for label, fn in (("atp", attribution_deltas), ("atp*", atp_star_deltas)):
        deltas, wall, cpu = _timed(lambda fn=fn: fn(model, evalset, zero))
        found = agreement(reference, _frame(deltas, "delta_approx"))
        rows.append(
            {
                "model": name,
                "method": label,
                "wall_s": wall,
                "cpu_s": cpu,
                "x_faster": t_exact / wall,
                "spearman": found["spearman"],
                "pearson": found["pearson"],
                "top_overlap": found["top10_overlap"],
                "top_k": found["top_k"],
            }
        )
    return rows


def main() -> None:
    from bench_ablate import _setup

    from headlens.intervene.evalset import build_evalset
    from headlens.load.models import load_model
    from tests.helpers.planted import build_planted

    torch.set_num_threads(THREADS)
    rows = []

    def add(found: list[dict]) -> None:
        rows.extend(found)
        print(_markdown(pd.DataFrame(found)), flush=True)  # as it goes: a long run keeps what it measured

    tiny = load_model("tiny")
    for metric in ("loss", "repeat"):
        add(compare(f"tiny, {metric}", tiny.model, build_evalset(tiny, metric)))
    planted = build_planted(0).loaded
    add(compare("planted seed 0, repeat", planted.model, build_evalset(planted, "repeat")))
    loaded, evalset = _setup()
    add(compare("GPT-2-small shape, 4 x 128 tokens", loaded.model, evalset))
    print(_markdown(pd.DataFrame(rows)))


def _markdown(frame: pd.DataFrame) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return "" if value != value else f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
