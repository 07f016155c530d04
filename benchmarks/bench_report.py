"""Report size and render time for a GPT-2-small-shaped model (12 x 12 heads), worst case for size.

Random weights (no GPT-2 download here), real `sample_patterns` on the shipped held-out text, and
synthetic score frames in which every one of the 144 heads carries a label (so all 144 thumbnails
are drawn) plus a full sweep. Prints bytes per section and seconds per stage.

    .venv/bin/python benchmarks/bench_report.py
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def synthetic_frames(n_layers: int, n_heads: int, seed: int = 0):
    from headlens.reports import explain

    rng = np.random.default_rng(seed)
    rows = [
        {
            "layer": layer,
            "head": head,
            "labels": ["positional", "first_token"],
            "positional_offset": -1,
            **{info.column: float(rng.uniform(info.vmin, info.vmax)) for info in explain.SCORES},
        }
        for layer in range(n_layers)
        for head in range(n_heads)
    ]
    deltas = rng.normal(0, 0.05, len(rows))
    sweep = pd.DataFrame(
        [
            {
                "layer": r["layer"],
                "head": r["head"],
                "n_tokens": 4000,
                "loss": 3.0,
                "loss_ablated": 3.0 + d,
                "delta_loss": d,
                "ci95_low": d - 0.01,
                "ci95_high": d + 0.01,
            }
            for r, d in zip(rows, deltas, strict=True)
        ]
    )
    return pd.DataFrame(rows), sweep


def main() -> None:
    from headlens.classify.samples import sample_patterns
    from headlens.load.models import build_model
    from headlens.probes.inputs import default_text
    from headlens.reports import render_report
    from headlens.reports.viewer import default_viewer_tokens
    from headlens.results import Result

    start = time.perf_counter()
    loaded = build_model(None, seed=0, name="gpt2-shaped-random")
    spec = loaded.spec
    built = time.perf_counter()
    n_tokens = default_viewer_tokens(spec.n_layers, spec.n_heads, spec.n_ctx)
    viewer = sample_patterns(loaded, default_text(), n_tokens, repeat=True)
    sampled = time.perf_counter()
    heads, sweep = synthetic_frames(spec.n_layers, spec.n_heads)
    with tempfile.TemporaryDirectory() as folder:
        path = render_report(
            Path(folder) / "report.html",
            model_info={"name": loaded.name, **spec.__dict__},
            heads=Result("heads", heads),
            sweep=Result("sweep", sweep),
            viewer=viewer,
            command="benchmarks/bench_report.py",
        )
        rendered = time.perf_counter()
        html = path.read_text(encoding="utf-8")
    print(
        f"model build {built - start:.1f} s, sample_patterns ({n_tokens} tokens) {sampled - built:.1f} s, "
        f"render_report {rendered - sampled:.1f} s"
    )
    print(f"total {len(html.encode()) / 1e6:.2f} MB")
    for name, body in re.findall(r'<section id="([^"]+)">(.*?)</section>', html, re.S):
        print(f"  {name:<12} {len(body.encode()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
