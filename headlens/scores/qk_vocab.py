"""The copy-suppression QK criterion over the vocabulary (McDougall et al. 2023, arXiv 2310.04625,
section 3; the authors' code: callummcdougall/SERI-MATS-2023-Streamlit-pages,
transformer_lens/rs/callum2/ov_qk_circuits/ov_qk_plot_functions.py, `plot_full_matrix_histogram`
with circuit="QK"): a token t counts for a head when, with t's unembedding as the query, the key of
t's own effective embedding ranks among the TOP_K highest of all the vocabulary's keys, the row t of
W_U^T W_Q W_K^T W_EE^T; a head's score is the share of the vocabulary's tokens that count. It is the
attention half of copy suppression: a head attends back to earlier copies of the token the residual
stream predicts.

The circuit, as the authors compute it and as each family's attention reads its input:
- query side: the unembedding column of t with the final norm's gain folded in and the mean column
  subtracted (TransformerLens's fold_ln and center_unembed, which the authors load GPT-2 with),
  scaled to unit rms (the authors divide by its std), then the layer's own input norm, the query
  projection with its bias and, where the family has one (Qwen3, Gemma 3), the per-head query norm;
- key side: W_EE, the effective embedding of headlens.scores.ov_vocab (layer 0's attention locked on
  the token, then MLP0, the authors' "W_E (including MLPs)"), the layer's input norm (the authors
  divide by the std), the key projection with its bias and the per-head key norm; a query head reads
  its group's key head (GQA, MQA);
- no position: the paper's circuit leaves positional embeddings out. For rotary families q.k is
  scored without rotation, which is exactly the attention score at relative offset 0 (R(0) = I):
  rotary position enters only as a rotation by the offset, so the unrotated product is the
  content-only score the paper's position-free circuit measures, and rotation at a nonzero offset
  would add a position term the GPT-2 criterion does not have. The rotary scale (Gemma's, YaRN's)
  multiplies every score of a row alike and leaves the ranks unchanged.
  Measured at offsets 1, 8 and 64 (benchmarks/bench_cs_qk.py): SmolLM2's heads move by <= 0.01,
  Gemma 3 270M's by up to +0.075 (BENCHMARKS.md).
TOP_K = 10 is the OV criterion's k (the bottom 10 of a column); a random head ranks a token's own
key there with chance 10 / d_vocab. Sampling, screening and the 95% Wilson interval are
headlens.scores.ov_vocab's (screened_shares): exact up to VOCAB_SAMPLE tokens, else a seeded sample
with a half-width <= 0.02 for every head scored on the full sample (0 of SCREEN tokens: [0, 0.039]).

Cost: every layer projects the whole vocabulary's W_EE to keys (2 d_vocab d_model kv_heads d_head
FLOPs), then scores each query against every key: 2 d_head d_vocab FLOPs per query token and head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlens.arch import adapter_for, get_module
from headlens.load.devices import onloaded
from headlens.scores.ov_copying import folded_unembed
from headlens.scores.ov_vocab import SCREEN, VOCAB_SAMPLE, screened_shares, self_attention_embedding, vocab_sample
from headlens.scores.rank_scan import Columns, columns, count_above

TOP_K = 10  # the own key among the 10 highest of its row
KEY_CHUNK = 4096  # vocabulary rows per pass through layer 0 and a layer's key projection


def query_inputs(w_u: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The query side's residual vectors: each token's centred unembedding column scaled to unit rms,
    w_u [d_model, d_vocab] (gain folded) -> [n, d_model] float64."""
    cols = (w_u[:, tokens] - w_u.mean(1, keepdim=True)).T.double()  # [n, d_model]: the picked columns, centred
    return cols / cols.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)


def vocab_embedding(adapter) -> torch.Tensor:
    """W_EE of every token of the vocabulary (ov_vocab's self_attention_embedding): [d_vocab, d_model]."""
    n_vocab = adapter.embed().weight.shape[0]
    parts = [
        self_attention_embedding(adapter, torch.arange(start, min(start + KEY_CHUNK, n_vocab))).detach().cpu()
        for start in range(0, n_vocab, KEY_CHUNK)
    ]  # [chunk, d_model] each
    return torch.cat(parts)


def project(adapter, layer: int, resid: torch.Tensor, row: int) -> torch.Tensor:
    """`layer`'s queries (row 0) or keys (row 1) of residual vectors resid [n, d_model], unrotated:
    input norm, projection and bias, per-head norm -> [n, heads | kv_heads, d_head] float32 (cpu)."""
    block = adapter.layer(layer)
    site = (adapter.sites.q, adapter.sites.k)[row]
    norm, head_norm = get_module(block, adapter.sites.input_norm), adapter.qk_norms(layer)[row]
    n_heads = adapter.n_heads if row == 0 else adapter.n_kv_heads
    outs = []
    with onloaded(norm), onloaded(get_module(block, site.projection)):
        weight, bias = adapter.qkv_weights(layer)[row]  # [heads * d_head, d_model], [heads * d_head] | None
        for start in range(0, len(resid), KEY_CHUNK):
            part = resid[start : start + KEY_CHUNK].to(weight.device, weight.dtype)  # [chunk, d_model]
            out = norm(part) @ weight.T  # [chunk, heads * d_head]
            out = (out if bias is None else out + bias).view(len(part), n_heads, adapter.d_head)
            if head_norm is not None:
                with onloaded(head_norm):
                    out = head_norm(out)  # [chunk, heads, d_head]
            outs.append(out.detach().float().cpu())
    return torch.cat(outs)  # [n, heads, d_head]


def own_in_top(queries: torch.Tensor, keys: Columns, tokens: torch.Tensor) -> torch.Tensor:
    """Whether fewer than TOP_K vocabulary keys score strictly above each token's own key, for one head:
    queries [n, d_head] (the tokens' queries), keys its key head's keys as columns (rank_scan.columns of
    [d_head, d_vocab]), tokens [n] -> [n] bool. The own key's column is left out of the count.
    headlens.scores.rank_scan counts the keys above, a block at a time: a token with TOP_K above it
    fails and leaves the scan (most tokens of a head that is not a copy suppressor leave in the first
    block); a token that counts is scanned to the end."""
    return count_above(queries.float(), keys, tokens, TOP_K) < TOP_K  # [n]


def cs_qk_vocab(
    model,
    seed: int = 0,
    screen: int = SCREEN,
    sample: int = VOCAB_SAMPLE,
    layers: Sequence[int] | None = None,
    progress: bool = False,
) -> dict:
    """The QK criterion of every head over the vocabulary (module docstring): `cs_qk_score`, `n`,
    `ci_low`, `ci_high`, `se` [n_layers, n_heads] (NaN, n = 0 outside `layers`), `exact`, `d_vocab`,
    `screen`, `sample`, as headlens.scores.ov_vocab.cs_ov_vocab (the same seeded tokens). `progress`: a
    bar over the layers on stderr."""
    adapter = adapter_for(model)
    w_u = folded_unembed(adapter).detach().cpu()  # [d_model, d_vocab]
    tokens = vocab_sample(w_u.shape[1], seed, sample)  # [m]
    groups = torch.tensor([adapter.kv_group(h) for h in range(adapter.n_heads)])  # [head]
    with torch.no_grad():
        # [d_vocab, d_model]; not built when no layer is scored
        w_ee = vocab_embedding(adapter) if layers is None or len(layers) else w_u.new_empty(0, w_u.shape[0])
        query_resid = query_inputs(w_u, tokens)  # [m, d_model]

        def layer_hits(layer: int):
            queries = project(adapter, layer, query_resid, 0)  # [m, head, d_head]
            keys = project(adapter, layer, w_ee, 1)  # [d_vocab, kv_head, d_head]
            key_heads = [columns(keys[:, g].contiguous().T) for g in range(keys.shape[1])]  # [d_head, d_vocab] each
            return lambda heads, rows: torch.stack(
                [own_in_top(queries[rows, h], key_heads[groups[h]], tokens[rows]).sum() for h in heads.tolist()]
            )  # [k]

        return screened_shares(layer_hits, adapter, tokens, w_u.shape[1], screen, layers, "cs_qk_score", progress)
