"""Ablation speed and memory, side by side, on the GPT-2-small-shaped model (random weights, seed 0).

Data: 4 sequences x 128 tokens (BOS + 127 random ids in [1000, 10000)), every next-token
prediction counted (the `text` metric's shape). Sections, each in its own child process so
peak memory is its own (VmHWM reset through /proc/self/clear_refs after setup):
- matmul: fp32 rate of a 2048 x 2048 matmul (before and after the sweeps);
- exact: our exact 144-head zero-ablation sweep (headlens.intervene.sums), its FLOPs counted;
- tl_loop: TransformerLens bridge `run_with_hooks(return_type="loss")`, zeroing hook_z[:, :, h],
  one full forward per head, written the usual way;
- attribution: attribution patching (one forward + one backward);
- passes: heads stacked per forward pass (1, 2, 4) on layer 9's heads (the default: sweep.stack_count);
- tiny: exact vs attribution on the shipped tiny model, if it is there.

Run: nice -n 10 .venv/bin/python benchmarks/bench_ablate.py  (prints a markdown summary)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch
from tl_loop import zero_ablation_deltas  # benchmarks/ is on sys.path when run as a script

THREADS = 2  # the machine's cores
N_SEQ, SEQ_LEN = 4, 128
PASSES_LAYER = 9  # heads of this layer time the heads-per-pass choice (3 blocks + unembed each)


def _hwm_reset() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the peak RSS counter (Linux >= 4.0)


def _hwm_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _setup():
    from headlens.intervene.evalset import EvalSet
    from headlens.load.models import build_model

    loaded = build_model(None, seed=0, name="gpt2-shaped-random")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 10000, (N_SEQ, SEQ_LEN), generator=gen)  # [n_seq, pos]
    ids[:, 0] = loaded.bos_token_id
    mask = torch.ones_like(ids, dtype=torch.bool)  # [n_seq, pos]
    counted = torch.ones((N_SEQ, SEQ_LEN - 1), dtype=torch.bool)  # [n_seq, pos-1]
    return loaded, EvalSet(ids, mask, counted, "loss", "bench", f"{N_SEQ} x {SEQ_LEN} random tokens")


def matmul_rate(repeats: int = 5) -> dict:
    """fp32 rate of a 2048 x 2048 @ 2048 x 2048 matmul: best GFLOP/s of wall time, and GFLOP
    per CPU-second over all repeats (the machine is shared: CPU time is robust to load)."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    best = float("inf")
    cpu = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    flop = 2 * 2048**3
    return {"gflops": flop / best / 1e9, "gflop_per_cpu_s": repeats * flop / (time.process_time() - cpu) / 1e9}


def sweep_flops(spec, n_seq: int, pos: int, n_counted: int) -> float:
    """Matmul FLOPs the exact sweep must do: one prefix walk and a base pass (a full forward
    each), then per head: its rank-d_head c_proj update, layer L's MLP, every later block, and
    the unembedding of the counted positions."""
    tokens = n_seq * pos
    d, d_mlp, n_heads = spec.d_model, 4 * spec.d_model, spec.n_heads
    attn = tokens * (2 * d * 3 * d + 2 * d * d) + n_seq * n_heads * 2 * (2 * pos * pos * spec.d_head)
    mlp = tokens * 2 * (2 * d * d_mlp)
    unembed = n_counted * 2 * d * spec.d_vocab
    total = 2 * spec.n_layers * (attn + mlp) + unembed  # walk + base pass (the walk has no unembed)
    for layer in range(spec.n_layers):
        per_head = tokens * 2 * spec.d_head * d + mlp + (spec.n_layers - 1 - layer) * (attn + mlp) + unembed
        total += n_heads * per_head
    return total


def section_exact(heads_per_pass: int | None = None, layer: int | None = None) -> dict:
    from headlens.heads import Head, all_heads
    from headlens.intervene.sums import base_sums, stack_count, sweep_sums

    loaded, evalset = _setup()
    spec = loaded.spec
    heads = all_heads(spec.n_layers, spec.n_heads) if layer is None else [Head(layer, h) for h in range(spec.n_heads)]
    k = heads_per_pass or stack_count(evalset)
    _hwm_reset()
    rss0 = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    base = base_sums(loaded.model, evalset)
    found = {}
    sweep_sums(
        loaded.model, evalset, heads, [None] * spec.n_layers, lambda h, s: found.update({h: s}), heads_per_pass=k
    )
    wall = time.perf_counter() - start
    deltas = [float((found[h] - base).sum() / evalset.n_tokens) for h in heads]
    flops = sweep_flops(spec, N_SEQ, SEQ_LEN, evalset.n_tokens) if layer is None else None
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "peak_mb": _hwm_mb() - rss0,
        "deltas": deltas,
        "flops": flops,
        "heads_per_pass": k,
    }


def section_tl_loop() -> dict:
    from headlens.load.models import boot_bridge

    loaded, evalset = _setup()
    bridge = boot_bridge(loaded)
    tokens = evalset.input_ids
    _hwm_reset()
    rss0 = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    deltas = zero_ablation_deltas(bridge, tokens, range(loaded.spec.n_layers), loaded.spec.n_heads)
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "peak_mb": _hwm_mb() - rss0,
        "deltas": deltas,
    }


def section_attribution() -> dict:
    from headlens.ablation.gradients import attribution_deltas

    loaded, evalset = _setup()
    _hwm_reset()
    rss0 = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    deltas = attribution_deltas(loaded.model, evalset, [None] * loaded.spec.n_layers)
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "peak_mb": _hwm_mb() - rss0,
        "deltas": deltas.flatten().tolist(),
    }


def section_tiny() -> dict:
    from headlens.ablation.ablate import sweep_heads
    from headlens.ablation.approx import agreement, approx_sweep
    from headlens.files import shipped_path
    from headlens.load.models import load_model

    if not (shipped_path("tiny") / "config.json").is_file():
        return {"missing": True}
    loaded = load_model("tiny")
    out = {}
    for metric in ("text", "repeat"):
        start = time.perf_counter()
        exact = sweep_heads(loaded, metric=metric).frame
        t_exact = time.perf_counter() - start
        start = time.perf_counter()
        approx = approx_sweep(loaded, metric=metric, approx="atp")
        t_approx = time.perf_counter() - start
        out[metric] = {
            "exact_s": t_exact,
            "approx_s": t_approx,
            **agreement(exact, approx),
            "n_tokens": int(exact.n_tokens.iloc[0]),
        }
    return out


def _child(name: str, *args: str) -> dict:
    cmd = [sys.executable, __file__, "--section", name, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spearman(x, y) -> float:
    import pandas as pd

    return float(pd.Series(x).rank().corr(pd.Series(y).rank()))


def main(quick: bool = False) -> None:
    """Every section; `quick` (--quick) skips the TransformerLens loop and the heads-per-pass runs."""
    import pandas as pd

    before = _child("matmul")
    exact = _child("exact")
    tl = exact if quick else _child("tl_loop")
    attribution = _child("attribution")
    passes = {} if quick else {k: _child("exact_layer", str(k))["wall_s"] for k in (1, 2, 4)}
    after = _child("matmul")
    tiny = _child("tiny")
    rate_before, rate_after = before["gflops"], after["gflops"]
    rate = max(rate_before, rate_after)
    floor = exact["flops"] / (rate * 1e9)
    per_cpu = max(before["gflop_per_cpu_s"], after["gflop_per_cpu_s"])
    print(
        f"CPU-time view: exact sweep {exact['cpu_s']:.1f} CPU s vs floor {exact['flops'] / per_cpu / 1e9:.1f} "
        f"CPU s at {per_cpu:.1f} GFLOP per CPU-second: ratio {exact['cpu_s'] * per_cpu * 1e9 / exact['flops']:.2f}"
    )
    diff = max(abs(a - b) for a, b in zip(exact["deltas"], tl["deltas"], strict=True))
    x, y = exact["deltas"], attribution["deltas"]
    print(f"fp32 matmul 2048^2: {rate_before:.1f} GFLOP/s before, {rate_after:.1f} after")
    print("| sweep (144 heads, 4 x 128 tokens) | wall s | CPU s | peak MB above model | wall vs exact |")
    print("|---|---|---|---|---|")
    for label, res in (
        (f"exact, headlens (heads/pass {exact['heads_per_pass']})", exact),
        ("TransformerLens run_with_hooks loop", tl),
        ("attribution patching", attribution),
    ):
        print(
            f"| {label} | {res['wall_s']:.2f} | {res['cpu_s']:.2f} | {res['peak_mb']:.0f} | "
            f"{res['wall_s'] / exact['wall_s']:.3f} |"
        )
    print(f"max |delta exact - delta TL| = {diff:.2e}")
    print(
        f"exact sweep FLOPs {exact['flops'] / 1e12:.2f} TFLOP; floor at {rate:.1f} GFLOP/s = {floor:.1f} s; "
        f"wall / floor = {exact['wall_s'] / floor:.2f}"
    )
    print(
        f"TL loop / exact: wall {tl['wall_s'] / exact['wall_s']:.2f}x, CPU {tl['cpu_s'] / exact['cpu_s']:.2f}x; "
        f"exact / attribution: wall {exact['wall_s'] / attribution['wall_s']:.1f}x, "
        f"CPU {exact['cpu_s'] / attribution['cpu_s']:.1f}x"
    )
    print(f"attribution vs exact: pearson {pd.Series(x).corr(pd.Series(y)):.3f}, spearman {_spearman(x, y):.3f}")
    print(
        f"heads per pass, layer-{PASSES_LAYER} heads only (wall s): "
        + ", ".join(f"{k}: {v:.2f}" for k, v in passes.items())
    )
    print(f"tiny model: {json.dumps(tiny)}")


if __name__ == "__main__":
    torch.set_num_threads(THREADS)
    if len(sys.argv) > 2 and sys.argv[1] == "--section":
        name = sys.argv[2]
        if name == "matmul":
            result = matmul_rate()
        elif name == "exact":
            result = section_exact()
        elif name == "exact_layer":
            result = section_exact(heads_per_pass=int(sys.argv[3]), layer=PASSES_LAYER)
        elif name == "tl_loop":
            result = section_tl_loop()
        elif name == "attribution":
            result = section_attribution()
        else:
            result = section_tiny()
        print(json.dumps(result))
    else:
        main(quick="--quick" in sys.argv)
