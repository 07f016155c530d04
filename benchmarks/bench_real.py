"""Real weights: SmolLM2-135M-Instruct (30 layers x 9 query heads = 270 heads, dequantized from
Q4_1; `headlens pull smollm2` first) or, with `--model gemma3-270m`, Gemma 3 270M (18 layers x 4
query heads = 72 heads; `--model tiny`: the shipped tiny model), float32, one thread per process.
Each section runs in its own fresh subprocess (peak memory is the child's own; VmHWM reset after
set-up), its two sides one after the other in that process, so a ratio compares runs under the
same load. Wall and CPU seconds are both given: on a shared machine the CPU-time ratio is the
steadier one.

attribution  exact sweep of all heads vs `atp` and `atp*` under each of `--replacements`
             (zero, mean, resample: headlens.intervene.replace; patch: each head's z from a
             counterfactual run at the same positions, REPLACEMENT_DOC), the same replacement on
             both sides (headlens.ablation.approx's estimators; agreement =
             headlens.ablation.agreement), and AtP*'s GradDrop score (unsigned, unless
             `--no-graddrop`) ranked against |exact delta|; a `why` line per
             metric gives the measured sign flips and underestimates among the exact top 10
             and where atp*'s error |exact - atp*| lies (its largest heads, its share by layer);
             `--step EPS` also sweeps and estimates z + EPS (r - z) and says how well that exact
             small-step effect / EPS (the ceiling of any first-order estimate) ranks the full one;
             loss metric on natural text (the shipped held-out text, `--text-windows` windows of
             `--text-tokens` tokens, BOS first) and repeat metric (`--repeat-seqs` sequences of
             `--repeat-len` random tokens repeated twice). Targets: Spearman >= 0.8, top-10
             recall >= 0.8, AtP* >= 20x faster than the exact sweep (issue 47: Spearman >= 0.9).
classify     headlens's streamed previous-token / duplicate-token / induction ("mul" form) scores
             vs TransformerLens `detect_head` through the bridge (headlens.load.models.boot_bridge), on
             the same token ids (`--prompts` passages of `--passage-chars` characters, each
             repeated twice). Targets: >= 3x faster, <= half the added peak, max |diff| <= 1e-4.
             `--whole` also runs `headlens classify MODEL` under /usr/bin/time (peak RSS) and
             gives the weights' share of it.
sweep        the exact sweep (all heads) vs the TransformerLens `run_with_hooks` loop
             (benchmarks/tl_loop.py) on the attribution section's text, and its wall / CPU time
             vs the FLOP floor (matmul FLOPs the sweep must do, counted for a Llama: smollm2 /
             the best fp32 matmul rate measured in the same process). Targets: >= 1.5x the peer, <= 1.6x the floor.

    nice -n 10 .venv/bin/python benchmarks/bench_real.py [attribution classify sweep] [--whole]
        [--model gemma3-270m] [--replacements zero,mean,resample,patch] [--step 0.01] [--no-graddrop]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pandas as pd
import torch
from peak_memory import reset_peak, status_kb  # benchmarks/ is on sys.path when run as a script
from tl_loop import zero_ablation_deltas

MODELS = {  # --model: the name load_model takes -> what the header says it is
    "smollm2": "SmolLM2-135M-Instruct, Q4_1 dequantized to float32",
    "gemma3-270m": "Gemma 3 270M, 18 layers x 4 query heads = 72 heads, dequantized to float32",
    "tiny": "the shipped tiny model, 2 layers x 4 heads = 8 heads",
}
REPLACEMENTS = ("zero", "mean", "resample", "patch")
REPLACEMENT_DOC = (
    "repeat: the same draw of random tokens with seed 1 (a random prompt pair); "
    "loss: the next text window (the last one takes the first's), so it needs --text-windows >= 2"
)
THREADS = 1  # one thread: on a loaded 2-core machine two threads stall on OpenMP barriers
SECTIONS = ("attribution", "classify", "sweep")
DETECT = ("previous_token_head", "duplicate_token_head", "induction_head")
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576"}  # as in bench_capture.py: RSS follows live tensors


def _load(args):
    from headlens.load.models import load_model

    torch.set_num_threads(THREADS)
    return load_model(args.model)


def _timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def _load_average() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def evalsets(loaded, args) -> dict:
    """The two evaluation sets: natural text (loss) and repeated random tokens (repeat)."""
    from headlens.intervene.evalset import repeat_evalset, text_evalset
    from headlens.probes.inputs import default_text

    return {
        "loss": text_evalset(loaded, default_text(), window=args.text_tokens, max_windows=args.text_windows),
        "repeat": repeat_evalset(loaded, seed=0, n_seq=args.repeat_seqs, seq_len=args.repeat_len),
    }


def exact_deltas(loaded, evalset, reps=None) -> torch.Tensor:
    """Every head ablated alone, exactly (headlens's layer-by-layer sweep), its z replaced by `reps`
    (headlens.intervene.replace; default zero): [layer, head]."""
    from headlens.heads import all_heads
    from headlens.intervene.sums import base_sums, sweep_sums

    spec, found = loaded.spec, {}
    base = base_sums(loaded.model, evalset)  # [n_units]
    sweep_sums(
        loaded.model,
        evalset,
        all_heads(spec.n_layers, spec.n_heads),
        reps or [None] * spec.n_layers,
        lambda h, s: found.update({(h[0], h[1]): float((s - base).sum())}),
    )
    return torch.tensor(
        [[found[(layer, head)] / evalset.n_tokens for head in range(spec.n_heads)] for layer in range(spec.n_layers)]
    )  # [layer, head]


def _frame(deltas: torch.Tensor, column: str) -> pd.DataFrame:
    n_layers, n_heads = deltas.shape
    return pd.DataFrame(
        [
            {"layer": layer, "head": head, column: float(deltas[layer, head])}
            for layer in range(n_layers)
            for head in range(n_heads)
        ]
    )


def counterfactual_ids(loaded, evalset, metric: str, args) -> torch.Tensor:
    """The counterfactual run of `patch` (REPLACEMENT_DOC), in the evaluation set's layout: [n_seq, pos]."""
    from headlens.intervene.evalset import repeat_evalset

    if metric == "repeat":
        return repeat_evalset(loaded, seed=1, n_seq=args.repeat_seqs, seq_len=args.repeat_len).input_ids
    if evalset.input_ids.shape[0] < 2 or not bool(evalset.mask.all()):
        sys.exit("patch on the loss metric needs --text-windows >= 2 full windows")
    return evalset.input_ids.roll(-1, 0)  # [n_seq, pos] window i patched from window i + 1


def replacement_z(loaded, evalset, metric: str, replacement: str, args) -> list:
    """What each head's z becomes under `replacement`, per layer (headlens.intervene.replace's form)."""
    from dataclasses import replace

    from headlens.circuits.paths import counterfactual_replacements
    from headlens.intervene.evalset import BATCH_SIZE
    from headlens.intervene.replace import replacements

    if replacement != "patch":
        return replacements(loaded.model, evalset, replacement, seed=0, batch_size=BATCH_SIZE)
    ids = counterfactual_ids(loaded, evalset, metric, args)
    paired = replace(evalset, reference_ids=ids, reference_mask=evalset.mask.clone())
    return counterfactual_replacements(loaded.model, paired)


def run_attribution(args) -> dict:
    loaded = _load(args)
    out = {}
    for metric, evalset in evalsets(loaded, args).items():
        if metric not in args.metrics.split(","):
            continue
        for replacement in args.replacements.split(","):
            if replacement not in REPLACEMENTS:
                sys.exit(f"unknown replacement {replacement!r}: choose among {', '.join(REPLACEMENTS)}")
            rows = compare_estimates(loaded, evalset, metric, replacement, args)
            out[metric if replacement == "zero" else f"{metric}, {replacement}"] = rows
    return out


def compare_estimates(loaded, evalset, metric: str, replacement: str, args) -> dict:
    """The exact sweep, atp, atp* (and GradDrop, and the first-order step) under one replacement."""
    from headlens.ablation import agreement
    from headlens.ablation.approx import ESTIMATES
    from headlens.ablation.gradients import graddrop_scores

    reps, wall, cpu = _timed(lambda: replacement_z(loaded, evalset, metric, replacement, args))
    rows = {"replacement": {"wall_s": wall, "cpu_s": cpu}}
    exact, wall, cpu = _timed(lambda: exact_deltas(loaded, evalset, reps))
    rows["exact"] = {
        "wall_s": wall,
        "cpu_s": cpu,
        "n_tokens": int(evalset.n_tokens),
        "shape": list(evalset.input_ids.shape),
        "description": evalset.description,
        "deltas": exact.tolist(),
    }
    reference = _frame(exact, "delta")
    for kind in ("atp", "atp*"):
        deltas, wall, cpu = _timed(lambda fn=ESTIMATES[kind]: fn(loaded.model, evalset, reps))
        found = agreement(reference, _frame(deltas, "delta_approx"))
        rows[kind] = {"wall_s": wall, "cpu_s": cpu, **found, "deltas": deltas.tolist()}
    if args.graddrop:  # GradDrop is unsigned: it ranks heads by |effect|, so it is compared with |exact delta|
        dropped, wall, cpu = _timed(lambda: graddrop_scores(loaded.model, evalset, reps))
        found = agreement(_frame(exact.abs(), "delta"), _frame(dropped, "delta_approx"))
        rows["graddrop"] = {"wall_s": wall, "cpu_s": cpu, **found, "deltas": dropped.tolist()}
    if args.step:
        rows["step"] = first_order_step(loaded, evalset, reps, exact, args.step)
    return rows


def first_order_step(loaded, evalset, reps: list, exact: torch.Tensor, eps: float) -> dict:
    """The same sweep and estimates with each z moved only `eps` of the way to its replacement,
    z + eps (r - z): `ceiling`, the agreement of the exact small-step effect / eps (what any
    first-order estimate aims at) with the full effect `exact`; `atp`, `atp*`, each estimate's
    agreement with the exact small step (the estimate inside its linear regime)."""
    from headlens.ablation import agreement
    from headlens.ablation.approx import ESTIMATES
    from headlens.intervene.evalset import BATCH_SIZE
    from headlens.intervene.replace import capture_z, z_change

    stepped: list = [None] * loaded.spec.n_layers

    def keep(layer: int, rows: slice, z: torch.Tensor) -> None:
        if stepped[layer] is None:
            stepped[layer] = torch.zeros(*evalset.mask.shape, *z.shape[2:], dtype=z.dtype)
        rep = reps[layer] if reps[layer] is None or reps[layer].shape[0] == 1 else reps[layer][rows, : z.shape[1]]
        stepped[layer][rows, : z.shape[1]] = z + eps * z_change(z, rep)  # [batch, pos, head, d_head]

    capture_z(loaded.model, evalset.input_ids, evalset.mask, BATCH_SIZE, keep)
    small = exact_deltas(loaded, evalset, stepped)  # [layer, head]
    out = {"eps": eps, "ceiling": agreement(_frame(exact, "delta"), _frame(small / eps, "delta_approx"))}
    out["deltas"] = (small / eps).tolist()
    for kind in ("atp", "atp*"):
        deltas = ESTIMATES[kind](loaded.model, evalset, stepped)  # [layer, head]
        out[kind] = agreement(_frame(small, "delta"), _frame(deltas, "delta_approx"))
    return out


def prompts(args) -> list[str]:
    from headlens.probes.inputs import default_text

    text, n = default_text(), args.passage_chars
    return [text[i * n : (i + 1) * n] * 2 for i in range(args.prompts)]


def _ours_step(loaded, sequences):
    from headlens.capture import iter_batches
    from headlens.classify.runs import stream_heads
    from headlens.scores.duplicate import duplicate_token_reducer
    from headlens.scores.induction import prefix_matching_reducer
    from headlens.scores.positional import prev_token_reducer

    n, h = loaded.spec.n_layers, loaded.spec.n_heads

    def step():
        prev, dup, prefix = prev_token_reducer(n, h), duplicate_token_reducer(n, h), prefix_matching_reducer(n, h)
        stream_heads(loaded.model, iter_batches(sequences, 1, pad_id=loaded.bos_token_id), [prev, dup, prefix])
        return dict(zip(DETECT, (prev.mul_score(), dup.mul_score(), prefix.mul_score()), strict=True))

    return step


def run_classify_side(side: str, args) -> dict:
    from transformer_lens.head_detector import detect_head

    from headlens.load.models import boot_bridge

    loaded, texts = _load(args), prompts(args)
    if side == "ours":
        sequences = [[loaded.bos_token_id] + loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        step = _ours_step(loaded, sequences)
    else:
        bridge = boot_bridge(loaded)
        del loaded  # the bridge holds its own copy: one set of weights on each side
        sequences = [bridge.to_tokens(t)[0].tolist() for t in texts]

        def step():
            with torch.no_grad():
                return {name: detect_head(bridge, texts, name) for name in DETECT}

    step()  # warm-up
    base_kb = reset_peak()
    scores, wall, cpu = _timed(step)
    return {
        "side": side,
        "wall_s": wall,
        "cpu_s": cpu,
        "added_peak_mb": (status_kb("VmHWM") - base_kb) / 1024,
        "tokens": sequences,
        "scores": {k: v.tolist() for k, v in scores.items()},
    }


def weights_mb(args) -> float:
    loaded = _load(args)
    return sum(p.numel() * p.element_size() for p in loaded.model.parameters()) / 2**20


def whole_classify(args) -> dict:
    """`headlens classify MODEL` under /usr/bin/time -v: wall, CPU and peak RSS."""
    cli = os.path.join(os.path.dirname(sys.executable), "headlens")
    start = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-v", cli, "classify", args.model, "--format", "csv"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    fields = dict(line.strip().split(": ", 1) for line in done.stderr.splitlines() if ": " in line)
    cpu = float(fields["User time (seconds)"]) + float(fields["System time (seconds)"])
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": int(fields["Maximum resident set size (kbytes)"]) / 1024}


def matmul_rate(repeats: int = 5) -> dict:
    """fp32 2048^3 matmul on this process's thread(s): best GFLOP/s of wall time and GFLOP per CPU-s."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    best, cpu = float("inf"), time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    flop = 2 * 2048**3
    return {"gflops": flop / best / 1e9, "gflop_per_cpu_s": repeats * flop / (time.process_time() - cpu) / 1e9}


def llama_sweep_flops(config, n_seq: int, pos: int, n_counted: int) -> float:
    """Matmul FLOPs of the exact sweep on a Llama: a prefix walk and a base pass (a full forward
    each, the unembedding only in the base pass), then per head its rank-d_head o_proj update,
    layer L's MLP, every later block and the unembedding of the counted positions."""
    tokens, d, d_mlp = n_seq * pos, config.hidden_size, config.intermediate_size
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    d_head, n_layers = d // n_heads, config.num_hidden_layers
    attn = tokens * 2 * (2 * d * d + 2 * d * n_kv * d_head) + n_seq * n_heads * 2 * (2 * pos * pos * d_head)
    mlp = tokens * 2 * 3 * d * d_mlp
    unembed = n_counted * 2 * d * config.vocab_size
    total = 2 * n_layers * (attn + mlp) + unembed
    for layer in range(n_layers):
        total += n_heads * (tokens * 2 * d_head * d + mlp + (n_layers - 1 - layer) * (attn + mlp) + unembed)
    return total


def run_sweep(args) -> dict:
    from headlens.load.models import boot_bridge

    before = matmul_rate()
    loaded = model = _load(args)
    evalset = evalsets(loaded, args)["loss"]
    n_seq, pos = evalset.input_ids.shape
    assert bool(evalset.mask.all()), "the TL loop scores every position: use full windows"
    exact, wall, cpu = _timed(lambda: exact_deltas(model, evalset))
    ours = {"wall_s": wall, "cpu_s": cpu, "deltas": exact.flatten().tolist()}
    bridge = boot_bridge(loaded)
    n_layers, n_heads = loaded.spec.n_layers, loaded.spec.n_heads
    flops = llama_sweep_flops(loaded.model.config, n_seq, pos, int(evalset.n_tokens))
    del loaded
    deltas, wall, cpu = _timed(lambda: zero_ablation_deltas(bridge, evalset.input_ids, range(n_layers), n_heads))
    after = matmul_rate()
    return {
        "exact": ours,
        "tl": {"wall_s": wall, "cpu_s": cpu, "deltas": deltas},
        "flops": flops,
        "rate": {"before": before, "after": after},
        "shape": [n_seq, pos],
    }


def _child(args: list[str], raw: str | None = None) -> dict:
    """Run a child mode in a fresh process; with `raw`, also append its JSON to that file."""
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env={**os.environ, **CHILD_ENV}
    )
    if done.returncode:
        sys.exit(f"child {args} failed:\n{done.stderr[-3000:]}")
    line = done.stdout.strip().splitlines()[-1]
    if raw:
        with open(raw, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"child": args, "result": json.loads(line)}) + "\n")
    return json.loads(line)


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_attribution(found: dict) -> None:
    print(
        "| metric | data | method | wall s | CPU s | exact / method (wall, CPU) | Spearman | Pearson | "
        "top-10 recall |\n|---|---|---|---|---|---|---|---|---|"
    )
    for metric, rows in found.items():
        exact, made = rows["exact"], rows["replacement"]
        data = f"{exact['shape'][0]} x {exact['shape'][1]} tokens, {exact['n_tokens']} scored"
        print(
            f"| {metric} | {data} | replacement z (both sides) | {made['wall_s']:.2f} | {made['cpu_s']:.2f} | | | | |"
        )
        print(f"| {metric} | {data} | exact sweep | {exact['wall_s']:.2f} | {exact['cpu_s']:.2f} | 1 | | | |")
        for kind in ("atp", "atp*", "graddrop"):
            if kind not in rows:
                continue
            r = rows[kind]
            label = "GradDrop (vs \\|delta\\|)" if kind == "graddrop" else kind
            print(
                f"| {metric} | {data} | {label} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                f"{exact['wall_s'] / r['wall_s']:.1f}x, {exact['cpu_s'] / r['cpu_s']:.1f}x | "
                f"{r['spearman']:.3f} | {r['pearson']:.3f} | {r['top10_overlap']:.1f} (k={r['top_k']}) |"
            )
    for metric, rows in found.items():
        star, speed = rows["atp*"], rows["exact"]["cpu_s"] / rows["atp*"]["cpu_s"]
        print(
            f"{metric}: atp* Spearman {star['spearman']:.3f} (>= 0.9 {_verdict(star['spearman'] >= 0.9)}), "
            f"top-10 recall {star['top10_overlap']:.1f} (>= 0.8 {_verdict(star['top10_overlap'] >= 0.8)}), "
            f"{speed:.1f}x faster in CPU time (>= 20x {_verdict(speed >= 20)})"
        )
        print(f"  why: {_why(rows)}")
        print(f"  error: {_error(rows)}")
        if "step" in rows:
            print(f"  first order: {_first_order(rows['step'])}")


def _why(rows: dict) -> str:
    """The measured reasons behind the agreement figures (headlens.ablation.agreement's counts)."""
    star, plain, k = rows["atp*"], rows["atp"], rows["atp*"]["top_k"]
    exact = torch.tensor(rows["exact"]["deltas"])  # [layer, head]
    top = exact.abs().flatten().topk(k).indices  # the exact top k, flat head indices
    layers = sorted({int(i) // exact.shape[1] for i in top})
    dropped = (
        f"; GradDrop's |.| ranking recalls {rows['graddrop']['top10_overlap']:.1f} of them"
        if "graddrop" in rows
        else ""
    )
    return (
        f"of the exact top {k} (layers {layers}), atp* gives {star['top_flipped']} the wrong sign and "
        f"{star['top_under']} under half their size (atp: {plain['top_flipped']}, {plain['top_under']}){dropped}"
    )


def _first_order(step: dict) -> str:
    ceiling = step["ceiling"]
    return (
        f"the exact effect of a step {step['eps']:g} towards the replacement, / {step['eps']:g}, ranks the full "
        f"effect at Spearman {ceiling['spearman']:.3f}, top-10 recall {ceiling['top10_overlap']:.1f} "
        f"(the ceiling of any first-order estimate); at that step atp / atp* agree with the exact sweep at Spearman "
        f"{step['atp']['spearman']:.3f} / {step['atp*']['spearman']:.3f}"
    )


def _error(rows: dict) -> str:
    """Where atp*'s error |exact - atp*| lies: its three largest heads, the fewest layers holding half
    of it, and the sign agreement on the heads whose |exact| is above the median."""
    exact = torch.tensor(rows["exact"]["deltas"])  # [layer, head]
    star = torch.tensor(rows["atp*"]["deltas"])  # [layer, head]
    error = (exact - star).abs()  # [layer, head]
    n_heads = exact.shape[1]
    worst = error.flatten().topk(min(3, error.numel())).indices.tolist()
    heads = ", ".join(
        f"{i // n_heads}.{i % n_heads} (exact {exact.flatten()[i]:+.3f}, atp* {star.flatten()[i]:+.3f})" for i in worst
    )
    by_layer = error.sum(1)  # [layer]
    order = by_layer.argsort(descending=True)
    half = int((by_layer[order].cumsum(0) < by_layer.sum() / 2).sum()) + 1
    big = exact.abs() > exact.abs().median()  # [layer, head]
    agree = int(((exact * star) > 0)[big].sum())
    return (
        f"largest |exact - atp*|: {heads}; layers {sorted(order[:half].tolist())} hold half of the total "
        f"|exact - atp*| ({float(error.sum()):.3f}); sign right on {agree} of the {int(big.sum())} heads "
        f"with |exact| above the median"
    )


def print_classify(ours: dict, tl: dict, whole: dict | None, weights: float, model: str) -> None:
    same = ours["tokens"] == tl["tokens"]
    diffs = {k: (torch.tensor(ours["scores"][k]) - torch.tensor(tl["scores"][k])).abs().max().item() for k in DETECT}
    lengths = [len(t) for t in ours["tokens"]]
    print(f"{len(lengths)} prompts of {min(lengths)}-{max(lengths)} tokens; same token ids on both sides: {same}")
    print("| side | wall s | CPU s | added peak MB |\n|---|---|---|---|")
    for label, r in (("headlens stream (3 scores)", ours), ("TL detect_head x 3 (bridge)", tl)):
        print(f"| {label} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['added_peak_mb']:.0f} |")
    speed, cpu = tl["wall_s"] / ours["wall_s"], tl["cpu_s"] / ours["cpu_s"]
    mem = ours["added_peak_mb"] / tl["added_peak_mb"]
    worst = max(diffs.values())
    print(
        f"TL / headlens: wall {speed:.2f}x, CPU {cpu:.2f}x (>= 3 {_verdict(cpu >= 3)}); added peak ours / TL "
        f"{mem:.3f} (<= 0.5 {_verdict(mem <= 0.5)}); max |diff| "
        + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
        + f" (<= 1e-4 {_verdict(worst <= 1e-4)})"
    )
    if whole:
        print(
            f"whole `headlens classify {model}`: {whole['wall_s']:.0f} s wall, {whole['cpu_s']:.0f} CPU s, "
            f"peak RSS {whole['peak_rss_mb']:.0f} MB; float32 weights {weights:.0f} MB = "
            f"{weights / whole['peak_rss_mb']:.0%} of it"
        )


def print_sweep(found: dict) -> None:
    exact, tl = found["exact"], found["tl"]
    diff = max(abs(a - b) for a, b in zip(exact["deltas"], tl["deltas"], strict=True))
    rate = max(found["rate"]["before"]["gflops"], found["rate"]["after"]["gflops"])
    per_cpu = max(found["rate"]["before"]["gflop_per_cpu_s"], found["rate"]["after"]["gflop_per_cpu_s"])
    floor, floor_cpu = found["flops"] / (rate * 1e9), found["flops"] / (per_cpu * 1e9)
    n_seq, pos = found["shape"]
    print(
        f"{len(exact['deltas'])} heads, {n_seq} x {pos} tokens of natural text; "
        f"fp32 matmul {rate:.1f} GFLOP/s best wall, "
        f"{per_cpu:.1f} GFLOP per CPU-s; sweep {found['flops'] / 1e12:.2f} TFLOP"
    )
    print("| sweep | wall s | CPU s |\n|---|---|---|")
    print(f"| exact, headlens | {exact['wall_s']:.1f} | {exact['cpu_s']:.1f} |")
    print(f"| TL run_with_hooks loop | {tl['wall_s']:.1f} | {tl['cpu_s']:.1f} |")
    print(f"| FLOP floor | {floor:.1f} | {floor_cpu:.1f} |")
    peer = tl["cpu_s"] / exact["cpu_s"]
    print(
        f"TL / exact: wall {tl['wall_s'] / exact['wall_s']:.2f}x, CPU {peer:.2f}x (>= 1.5 {_verdict(peer >= 1.5)}); "
        f"exact / floor: wall {exact['wall_s'] / floor:.2f}, CPU {exact['cpu_s'] / floor_cpu:.2f} "
        f"(<= 1.6 {_verdict(exact['cpu_s'] / floor_cpu <= 1.6)}); max |delta exact - delta TL| = {diff:.2e}"
    )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", default=list(SECTIONS), help=", ".join(SECTIONS))
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2", help="the pulled model to measure")
    parser.add_argument("--text-tokens", type=int, default=64, help="tokens per natural-text window")
    parser.add_argument("--text-windows", type=int, default=1, help="natural-text windows")
    parser.add_argument("--repeat-seqs", type=int, default=2, help="repeated-random-token sequences")
    parser.add_argument("--repeat-len", type=int, default=25, help="random tokens per copy")
    parser.add_argument("--prompts", type=int, default=4, help="classify: passages")
    parser.add_argument("--passage-chars", type=int, default=200, help="classify: characters per passage copy")
    parser.add_argument("--whole", action="store_true", help="classify: also time a whole `headlens classify`")
    parser.add_argument("--metrics", default="loss,repeat", help="attribution: metrics to compare")
    parser.add_argument("--replacements", default="zero", help=f"attribution: among {', '.join(REPLACEMENTS)}")
    parser.add_argument("--step", type=float, default=None, help="attribution: also sweep z + STEP (r - z)")
    parser.add_argument(
        "--no-graddrop", dest="graddrop", action="store_false", help="attribution: skip the GradDrop score"
    )
    parser.add_argument("--raw", default=None, help="append each child's JSON result to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def child_main(args) -> dict:
    if args.child == "attribution":
        return run_attribution(args)
    if args.child == "sweep":
        return run_sweep(args)
    if args.child == "weights":
        return {"mb": weights_mb(args)}
    if args.child == "whole":
        return whole_classify(args)
    return run_classify_side(args.child, args)


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(child_main(args)))
        return
    passed = [a for a in sys.argv[1:] if a not in SECTIONS]
    print(
        f"{args.model} ({MODELS[args.model]}), {THREADS} thread per process, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    for section in SECTIONS:
        if section not in args.sections:
            continue
        load = _load_average()
        print(f"\n## {section} (load average at start {load})", flush=True)
        if section == "attribution":
            print_attribution(_child(["--child", "attribution", *passed], args.raw))
        elif section == "sweep":
            print_sweep(_child(["--child", "sweep", *passed], args.raw))
        else:
            ours, tl = _child(["--child", "ours", *passed], args.raw), _child(["--child", "tl", *passed], args.raw)
            whole = _child(["--child", "whole", *passed], args.raw) if args.whole else None
            print_classify(ours, tl, whole, _child(["--child", "weights", *passed])["mb"], args.model)
        print(f"(load average at end {_load_average()})", flush=True)


if __name__ == "__main__":
    main()
