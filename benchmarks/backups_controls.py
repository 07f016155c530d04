"""Why a head is or is not a backup of SmolLM2's name movers: every head's compensation under every set of 3
layer-23 heads, and the p-values each control design gives.

    .venv/bin/python benchmarks/backups_controls.py run [N_PROMPTS [SEED]]   # 85 ablated passes: under /work/heavy
    .venv/bin/python benchmarks/backups_controls.py table [N_PROMPTS [SEED]]  # the p-values from the saved run

`run` ablates (zero) each of the 84 sets of 3 of layer 23's 9 heads on the IOI task and reads every head's
direct effect (headlens.circuits.direct) twice: through the ablated run's own final norm scale and through the
clean run's. It prints 24.4's and 23.3's changes per set and saves everything to OUT. `table` places the role's
(23.0-23.2) compensation of every head among the controls of two designs, the 39 sets headlens.circuits.backups
drew before (overlapping the role, seed 0) and the 20 sets of the other six heads, at both scales, and lists the
heads that pass (p < ALPHA and at least MIN_SHARE of the lost direct effect).
"""

from __future__ import annotations

import itertools
import sys
import time

import torch

from headlens.circuits import direct
from headlens.circuits.backups import ALPHA, CONTROLS, MIN_SHARE
from headlens.circuits.selfrepair import replacement_for
from headlens.circuits.tasks import ioi_task
from headlens.heads import Head
from headlens.intervene.evalset import batches
from headlens.intervene.stats import control_design
from headlens.load.models import load_model

LAYER, ROLE, WATCH = 23, (0, 1, 2), (Head(24, 4), Head(23, 3))
OUT = "/tmp/backups_controls_{n}_{seed}.pt"


def _seen(loaded, task, replacement) -> dict:
    """What headlens.circuits.direct.decompose reads from one run, kept so it can be read at two scales."""
    device = next(loaded.model.parameters()).device
    parts = [
        direct._run(loaded.adapter, loaded.model, task, rows, replacement, device)
        for rows in batches(task.tokens.shape[0], direct.BATCH)
    ]
    seen = {k: torch.cat([p[k] for p in parts]) for k in parts[0] if k not in ("resid", "z", "attn_out")}
    n_layers = loaded.adapter.n_layers
    for key, count in (("resid", n_layers + 1), ("z", n_layers), ("attn_out", n_layers)):
        seen[key] = [torch.cat([p[key][i] for p in parts]) for i in range(count)]
    return seen


def run(n: int, seed: int) -> None:
    torch.set_num_threads(1)
    loaded = load_model("smollm2")
    task = ioi_task(loaded, n=n, seed=seed)
    start = time.process_time()
    clean_seen = _seen(loaded, task, {})
    clean = direct._decomposition(loaded.adapter, task, clean_seen)
    out = {"clean": clean.heads}
    for chosen in itertools.combinations(range(loaded.spec.n_heads), 3):
        heads = [Head(LAYER, h) for h in chosen]
        seen = _seen(loaded, task, replacement_for(loaded, task, heads, "zero"))
        own = direct._decomposition(loaded.adapter, task, seen).heads
        seen["resid"][-1] = clean_seen["resid"][-1]  # the final norm's scale (and direction) of the clean run
        fixed = direct._decomposition(loaded.adapter, task, seen).heads
        out[chosen] = (own, fixed)
        changes = " | ".join(
            f"{name} {' '.join(f'{h} {float(x[h.layer, h.head] - clean.heads[h.layer, h.head]):+.3f}' for h in WATCH)}"
            for name, x in (("own", own), ("clean-scale", fixed))
        )
        lost = float(sum(clean.heads[LAYER, h] - own[LAYER, h] for h in chosen))
        print(chosen, changes, f"| lost {lost:.3f}", flush=True)
    torch.save(out, OUT.format(n=n, seed=seed))
    print("CPU", time.process_time() - start)


def table(n: int, seed: int) -> None:
    out = torch.load(OUT.format(n=n, seed=seed))
    clean, role = out["clean"], [Head(LAYER, h) for h in ROLE]
    designs = {
        "overlapping, 39 drawn": control_design(role, 9, CONTROLS, 0)["sets"],
        "outside the role, all": control_design(role, 9, CONTROLS, 0, outside=True)["sets"],
    }
    for scale, index in (("own scale", 0), ("clean-run scale", 1)):
        after = out[ROLE][index]
        lost = float(sum(clean[LAYER, h] - after[LAYER, h] for h in ROLE))
        sign = 1.0 if lost >= 0 else -1.0
        comp = sign * (after - clean)  # [layer, head]
        for name, sets in designs.items():
            beaten, counted = torch.zeros_like(comp), torch.zeros_like(comp)
            for chosen in sets:
                control = sign * (out[tuple(h.head for h in chosen)][index] - clean)
                free = torch.ones_like(comp, dtype=torch.bool)
                for h in chosen:
                    free[h.layer, h.head] = False
                beaten += (free & (control >= comp)).double()
                counted += free.double()
            p = (1 + beaten) / (1 + counted)
            passed = [
                f"{layer}.{head} ({float(comp[layer, head]):+.3f}, p {float(p[layer, head]):.3f})"
                for layer in range(comp.shape[0])
                for head in range(comp.shape[1])
                if (layer, head) not in [(LAYER, h) for h in ROLE]
                and p[layer, head] < ALPHA
                and comp[layer, head] >= MIN_SHARE * abs(lost)
            ]
            print(
                f"{scale}, {name} ({len(sets)} sets): lost {lost:.3f}; 24.4 {float(comp[24, 4]):+.3f}, "
                f"p {float(p[24, 4]):.3f} ({int(beaten[24, 4])} of {int(counted[24, 4])} sets as high); "
                f"backups: {', '.join(passed) or 'none'}"
            )


if __name__ == "__main__":
    mode, *rest = sys.argv[1:] or ["table"]
    n, seed = (int(rest[0]) if rest else 48), (int(rest[1]) if len(rest) > 1 else 0)
    {"run": run, "table": table}[mode](n, seed)
