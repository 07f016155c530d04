"""Copy suppression's QK criterion over the vocabulary (headlens.scores.qk_vocab): CPU and wall seconds
of one cs_qk_vocab run per model, the heads ranked by it beside their OV criterion (cs_ov_vocab, same
seeded tokens), and, for the heads named with --heads, the share on the sample's first --tokens tokens
with the query rotated to relative offsets 1, 8 and 64 (rotary families) beside the unrotated one.

    .venv/bin/python benchmarks/bench_cs_qk.py smollm2 [gemma3-270m ...] [--heads 24.4,23.3] [--tokens 400]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from headlens.arch import adapter_for
from headlens.load.models import load_model
from headlens.scores.ov_copying import folded_unembed
from headlens.scores.ov_vocab import cs_ov_vocab, vocab_sample
from headlens.scores.qk_vocab import cs_qk_vocab, own_in_top, project, query_inputs, vocab_embedding
from headlens.scores.rank_scan import columns

OFFSETS = (0, 1, 8, 64)
SHOWN = 8  # heads listed per model, by QK score


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def rotated(query: torch.Tensor, inv_freq: torch.Tensor, offset: int) -> torch.Tensor:
    """Queries [n, d_head] rotated by `offset` positions (Llama's rotate-half pairs), the keys at 0."""
    angle = offset * inv_freq.float().cpu()  # [d_head / 2]
    angle = torch.cat([angle, angle])  # [d_head]
    half = query.shape[-1] // 2
    turned = torch.cat([-query[..., half:], query[..., :half]], -1)  # [n, d_head]
    return query * angle.cos() + turned * angle.sin()


def offset_shares(model, heads: list[tuple[int, int]], n_tokens: int) -> None:
    adapter = adapter_for(model)
    if not hasattr(adapter, "rotary_tables"):
        return
    w_u = folded_unembed(adapter).cpu()  # [d_model, d_vocab]
    tokens = vocab_sample(w_u.shape[1], 0, n_tokens)  # [n]
    with torch.no_grad():
        w_ee, resid = vocab_embedding(adapter), query_inputs(w_u, tokens)  # [d_vocab, d_model], [n, d_model]
        for layer, head in heads:
            query = project(adapter, layer, resid, 0)[:, head]  # [n, d_head]
            keys = project(adapter, layer, w_ee, 1)[:, adapter.kv_group(head)].contiguous()  # [d_vocab, d_head]
            keys = columns(keys.T)  # [d_head, d_vocab]
            inv_freq = adapter.rotary_tables(layer)[0]
            shares = [float(own_in_top(rotated(query, inv_freq, o), keys, tokens).double().mean()) for o in OFFSETS]
            print(
                f"  {layer}.{head} on {n_tokens} tokens at offsets {OFFSETS}: " + " ".join(f"{s:.3f}" for s in shares)
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--heads", default="", help="L.H,L.H: heads whose offset shares are printed")
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    for name in args.names:
        model = load_model(name).model
        wall, cpu, qk = timed(lambda model=model: cs_qk_vocab(model))
        ov = cs_ov_vocab(model)
        print(f"{name}: cs_qk_vocab {wall:.1f} s wall, {cpu:.1f} CPU s; d_vocab {qk['d_vocab']}, exact {qk['exact']}")
        scores, n_heads = qk["cs_qk_score"].flatten(), qk["cs_qk_score"].shape[1]
        for i in scores.argsort(descending=True)[:SHOWN].tolist():
            layer, head = divmod(i, n_heads)
            print(
                f"  {layer}.{head} qk {float(scores[i]):.3f} [{float(qk['ci_low'][layer, head]):.3f},"
                f" {float(qk['ci_high'][layer, head]):.3f}] n={int(qk['n'][layer, head])}"
                f" ov {float(ov['cs_ov_score'][layer, head]):.3f}"
            )
        best = ov["cs_ov_score"].flatten().argsort(descending=True)[:3].tolist()
        for i in best:
            layer, head = divmod(i, n_heads)
            ov_score, qk_score = float(ov["cs_ov_score"][layer, head]), float(qk["cs_qk_score"][layer, head])
            print(f"  by OV: {layer}.{head} ov {ov_score:.3f} qk {qk_score:.3f}")
        heads = [tuple(int(x) for x in h.split(".")) for h in args.heads.split(",") if h]
        offset_shares(model, heads, args.tokens)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
