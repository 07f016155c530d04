"""The bfloat16 screen of headlens.scores.rank_scan: how much faster its products run than float32's at
the scan's shapes, and, on a model, what share of a row's entries its margin leaves to float32.

    python benchmarks/bench_rank_scan.py gemma3-270m

1) products: rows x d times d x BLOCK, float32 and bfloat16, best of REPEATS, in GFLOP/s;
2) for the first ROWS sampled tokens of copy suppression's sample and BLOCK seeded columns of the
   vocabulary, per head: the share of entries within rank_scan.MARGIN |x| |c_j| of the row's own entry,
   for the OV rows in the residual basis (z W_O against W_U), against W_O W_U (what
   headlens.scores.ov_rows.product_rows scans) and for the QK criterion's queries against its keys
   (headlens.scores.qk_vocab.own_in_top). Printed as min / median / max over the heads.
"""

from __future__ import annotations

import argparse
import time

import torch

from headlens.arch import adapter_for
from headlens.load.models import load_model
from headlens.scores.ov_copying import folded_unembed, value_change
from headlens.scores.ov_vocab import folded_w_o, self_attention_embedding, vocab_sample
from headlens.scores.qk_vocab import project, query_inputs
from headlens.scores.rank_scan import BLOCK, MARGIN

REPEATS = 5
ROWS = 64
SHAPES = [(64, 64), (64, 256), (256, 256), (64, 640), (512, 640)]  # (rows, d)


def gflops(rows: int, d: int, dtype: torch.dtype) -> float:
    """Best-of-REPEATS GFLOP/s of [rows, d] @ [d, BLOCK] in dtype (seeded normal inputs)."""
    gen = torch.Generator().manual_seed(0)
    x, c = torch.randn(rows, d, generator=gen).to(dtype), torch.randn(d, BLOCK, generator=gen).to(dtype)
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first is a warm-up
        start = time.perf_counter()
        x @ c  # [rows, BLOCK]
        best = min(best, time.perf_counter() - start)
    return 2 * rows * d * BLOCK / best / 1e9


def open_share(x: torch.Tensor, cols: torch.Tensor, own: torch.Tensor) -> float:
    """Share of the entries x_r . c_j (x [m, d], cols [d, b], own [m, d] the rows' own columns) within
    MARGIN |x_r| |c_j| of the own entry."""
    entries = x @ cols  # [m, b]
    mine = (x * own).sum(-1, keepdim=True)  # [m, 1]
    margin = MARGIN * x.norm(dim=-1, keepdim=True) * cols.norm(dim=0)  # [m, b]
    return float(((entries - mine).abs() <= margin).double().mean())


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:.3f} / {ordered[len(ordered) // 2]:.3f} / {ordered[-1]:.3f}"


def model_shares(name: str) -> None:
    adapter = adapter_for(load_model(name).model)
    w_u = folded_unembed(adapter).detach().cpu().float()  # [d_model, d_vocab]
    tokens = vocab_sample(w_u.shape[1], 0, ROWS)  # [m]
    picked = torch.randperm(w_u.shape[1], generator=torch.Generator().manual_seed(1))[:BLOCK]  # [b]
    groups = [adapter.kv_group(h) for h in range(adapter.n_heads)]
    residual, product, qk = [], [], []
    with torch.no_grad():
        w_ee = self_attention_embedding(adapter, tokens).detach()  # [m, d_model]
        queries_in = query_inputs(w_u, tokens)  # [m, d_model]
        keys_in = self_attention_embedding(adapter, torch.cat([tokens, picked])).detach()  # [m + b, d_model]
        for layer in range(adapter.n_layers):
            z = value_change(adapter, layer, w_ee).float().cpu()[:, groups]  # [m, head, d_head]
            w_o = folded_w_o(adapter, layer).float()  # [head, d_head, d_model]
            queries = project(adapter, layer, queries_in, 0)  # [m, head, d_head]
            keys = project(adapter, layer, keys_in, 1)  # [m + b, kv_head, d_head]
            for head in range(adapter.n_heads):
                x = -(z[:, head] @ w_o[head])  # [m, d_model]
                residual.append(open_share(x, w_u[:, picked], w_u[:, tokens].T))
                a = w_o[head] @ w_u  # [d_head, d_vocab]
                product.append(open_share(-z[:, head], a[:, picked], a[:, tokens].T))
                key = keys[:, groups[head]]  # [m + b, d_head]
                qk.append(open_share(queries[:, head], key[ROWS:].T, key[:ROWS]))
    print(f"{name}: share of a row's entries left to float32 (min / median / max over {len(qk)} heads)")
    print(f"  OV, residual basis (z W_O . W_U):  {summary(residual)}")
    print(f"  OV, against W_O W_U (product_rows): {summary(product)}")
    print(f"  QK, queries against keys:          {summary(qk)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a model whose open shares are printed")
    args = parser.parse_args()
    print(f"| rows x d, times d x {BLOCK} | float32 GFLOP/s | bfloat16 GFLOP/s | ratio |")
    print("|---|---|---|---|")
    for rows, d in SHAPES:
        single, half = gflops(rows, d, torch.float32), gflops(rows, d, torch.bfloat16)
        print(f"| {rows} x {d} | {single:.0f} | {half:.0f} | {half / single:.2f}x |")
    if args.model:
        model_shares(args.model)


if __name__ == "__main__":
    main()
