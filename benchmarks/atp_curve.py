"""How a head's exact effect bends between its clean z and its replacement r (SmolLM2): each head's z is moved a
fraction eps of the way, z + eps (r - z), alone, and the sweep measures the metric's change at eps = 0.01, 0.25, 0.5,
0.75 and 1, beside exact(0.01) / 0.01 (the derivative every first-order estimate aims at) and the atp / atp*
estimates of the full replacement. Heads: the largest |exact - atp*| of the attribution section of BENCHMARKS.md
(repeat: 2 x 25 tokens; loss: 1 x 32 tokens of the shipped text), zero and mean ablation. One thread.

    /work/heavy .venv/bin/python benchmarks/atp_curve.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from headlens.ablation.gradients import atp_star_deltas, attribution_deltas  # noqa: E402
from headlens.heads import Head  # noqa: E402
from headlens.intervene.evalset import BATCH_SIZE, repeat_evalset, text_evalset  # noqa: E402
from headlens.intervene.replace import capture_z, replacements, z_change  # noqa: E402
from headlens.intervene.sums import base_sums, sweep_sums  # noqa: E402
from headlens.load.models import load_model  # noqa: E402
from headlens.probes.inputs import default_text  # noqa: E402

STEPS = (0.01, 0.25, 0.5, 0.75, 1.0)
PICKS = {
    "repeat": [Head(16, 0), Head(1, 4), Head(1, 5), Head(18, 6)],
    "loss": [Head(1, 5), Head(1, 3), Head(1, 4), Head(0, 2)],
}


def clean_z(loaded, evalset) -> list[torch.Tensor]:
    """Each layer's clean z: [n_seq, pos, head, d_head]."""
    out: list = [None] * loaded.spec.n_layers

    def keep(layer: int, rows: slice, z: torch.Tensor) -> None:
        if out[layer] is None:
            out[layer] = torch.zeros(*evalset.mask.shape, *z.shape[2:])
        out[layer][rows, : z.shape[1]] = z

    capture_z(loaded.model, evalset.input_ids, evalset.mask, BATCH_SIZE, keep)
    return out


def curve(loaded, evalset, heads: list[Head], method: str) -> None:
    """Print each head's exact effect at every step, its derivative and the two estimates."""
    reps = replacements(loaded.model, evalset, method, seed=0, batch_size=BATCH_SIZE)
    clean = clean_z(loaded, evalset)
    base = base_sums(loaded.model, evalset)  # [n_units]
    found: dict = {}
    for eps in STEPS:
        stepped = [z + eps * z_change(z, r) for z, r in zip(clean, reps, strict=True)]  # [n_seq, pos, head, d_head]
        sweep_sums(
            loaded.model,
            evalset,
            heads,
            stepped,
            lambda h, s: found.setdefault(h, []).append(float((s - base).sum()) / evalset.n_tokens),
        )
    star = atp_star_deltas(loaded.model, evalset, reps)  # [layer, head]
    plain = attribution_deltas(loaded.model, evalset, reps)  # [layer, head]
    for h in heads:
        print(
            f"{evalset.metric} {method} {h.layer}.{h.head} exact at eps {'/'.join(f'{e:g}' for e in STEPS)}: "
            + " ".join(f"{v:+.3f}" for v in found[h])
            + f" | exact(0.01)/0.01 {found[h][0] / 0.01:+.3f} atp {plain[h.layer, h.head]:+.3f}"
            f" atp* {star[h.layer, h.head]:+.3f}",
            flush=True,
        )


def main() -> None:
    torch.set_num_threads(1)
    cpu = time.process_time()
    loaded = load_model("smollm2")
    sets = {
        "repeat": repeat_evalset(loaded, seed=0, n_seq=2, seq_len=12),
        "loss": text_evalset(loaded, default_text(), window=32, max_windows=1),
    }
    for metric, evalset in sets.items():
        for method in ("zero", "mean"):
            curve(loaded, evalset, PICKS[metric], method)
    print(f"cpu {time.process_time() - cpu:.1f} s")


if __name__ == "__main__":
    main()
