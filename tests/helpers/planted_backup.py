"""A planted backup: a two-layer GPT-2 whose backup head wakes up only when the primary heads are gone.

A real `transformers.GPT2LMHeadModel` (10 heads of 64 dims a layer, LayerNorms, zero MLPs) with written
weights. The residual stream is split, by an orthonormal basis orthogonal to the all-ones vector (so
LayerNorm only rescales: LN(x) = sqrt(d_model) x / |x|), into POS (position i as its own unit vector),
TOK (token v as a random unit vector e_v, the input embedding), OUT (the unembedding reads only OUT: logit
v = e_v . OUT), FLAG (one direction) and the rest.

The task: BOS and N_TOKENS random tokens; at the last position the model should predict the token at
position 1 (the metric: its loss there). Heads:
  primary 0.0, 0.1  a constant query matched by position 1's POS key: attend to position 1 and copy its
                    e_v into OUT (half the copy each); a value bias writes FLAG at every position, whatever
                    they attend to;
  backup  1.0       the same query and copy (the whole copy) but a second query term reads FLAG and is
                    matched by position 0's POS key: while either primary head writes FLAG, it looks at
                    BOS and copies BOS's token; with both ablated FLAG is gone, it looks at position 1 and
                    writes what the two wrote. Its compensation is caused by their absence;
  decoy   0.2       the primaries' query and copy (half) without FLAG: it always writes the answer, and its
                    OV circuit is theirs (the cheap detector cannot tell it apart); in layer 0 its output
                    depends on nothing ablated, only on the final norm's scale;
  the others        small random Q/K/V/O weights everywhere: random decoys.
A control ablates a pair of layer 0's other heads: FLAG stays and the backup sleeps. Ten heads a layer, so
that those pairs (28) allow a p-value of 1/29, under 0.05.
"""

from __future__ import annotations

import math

import torch

from headlens.circuits.tasks import Task
from tests.helpers.planted import Planted

N_LAYERS, N_HEADS, D_HEAD = 2, 10, 64
D_MODEL = N_HEADS * D_HEAD
N_CTX, N_TOK_DIMS = 16, 48
N_TOKENS = 12  # random tokens after BOS
PEAK = 40.0  # pre-softmax score of the attended position (nominal layer-0 scale)
WAKE = 4.0  # the FLAG term's score with one primary's FLAG present, in PEAK units (before LN rescaling)
COPY = 1.0  # the copy's norm in OUT
FLAG = 0.1  # each primary's FLAG write (small: LayerNorm's scale barely sees it)
RANDOM_STD = 0.005  # background weights: each random head writes ~0.1 (its output grows as RANDOM_STD^2)
PRIMARY, BACKUP, DECOY = ((0, 0), (0, 1)), (1, 0), (0, 2)


def build_planted_backup(seed: int = 0) -> Planted:
    """The planted model of the module docstring (positions "primary" (a list), "backup", "decoy")."""
    from transformers import GPT2Config

    from headlens.load.models import build_model

    config = GPT2Config(n_layer=N_LAYERS, n_head=N_HEADS, n_embd=D_MODEL, n_positions=N_CTX, tie_word_embeddings=False)
    loaded = build_model(config, seed=seed, name=f"planted-backup-{seed}")
    gen = torch.Generator().manual_seed(20_000 + seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    basis, _ = torch.linalg.qr(torch.cat([torch.ones(D_MODEL, 1, dtype=torch.float64), randn(D_MODEL, D_MODEL - 1)], 1))
    b_pos = basis[:, 1 : 1 + N_CTX]  # [d_model, n_ctx]
    b_tok = basis[:, 1 + N_CTX : 1 + N_CTX + N_TOK_DIMS]  # [d_model, 48]
    b_out = basis[:, 1 + N_CTX + N_TOK_DIMS : 1 + N_CTX + 2 * N_TOK_DIMS]  # [d_model, 48]
    flag = basis[:, 1 + N_CTX + 2 * N_TOK_DIMS]  # [d_model]
    tok = randn(config.vocab_size, N_TOK_DIMS)
    tok /= tok.norm(dim=-1, keepdim=True)  # e_v: [d_vocab, 48]
    s0 = math.sqrt(D_MODEL / 2)  # LN scale at layer 0: |e_v + p_i|^2 = 2
    gain = math.sqrt(PEAK * math.sqrt(D_HEAD)) / s0  # (s0 gain)^2 / sqrt(d_head) = PEAK
    state = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in loaded.model.named_parameters()}
    state["transformer.wte.weight"] = tok @ b_tok.T
    state["transformer.wpe.weight"] = b_pos.T.clone()  # [n_ctx, d_model]
    state["lm_head.weight"] = tok @ b_out.T
    for name in state:
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            state[name] = torch.ones_like(state[name])
    for layer in range(N_LAYERS):
        w_qkv = RANDOM_STD * randn(D_MODEL, 3 * D_MODEL)  # [d_model, q | k | v]
        b_qkv = torch.zeros(3 * D_MODEL, dtype=torch.float64)
        w_o = RANDOM_STD * randn(D_MODEL, D_MODEL)  # [head * d_head, d_model]
        for head in range(N_HEADS):
            cols = slice(head * D_HEAD, (head + 1) * D_HEAD)
            q, k, v = (w_qkv[:, n * D_MODEL :][:, cols] for n in range(3))  # views [d_model, d_head]
            b_q, b_v = b_qkv[cols], b_qkv[2 * D_MODEL :][cols]  # views [d_head]
            rows = w_o[cols]  # [d_head, d_model] view
            slot = (layer, head)
            if slot not in (*PRIMARY, BACKUP, DECOY):
                continue
            b_q[0] = gain * s0  # a constant query (dim 0) ...
            k[:, 0] = gain * b_pos[:, 1]  # ... matched by position 1's key
            v[:, 1 : 1 + N_TOK_DIMS] = b_tok  # the attended token's e_v
            share = {BACKUP: 1.0, DECOY: 0.5}.get(slot, 0.5)
            rows.zero_()
            rows[1 : 1 + N_TOK_DIMS] = share * COPY / s0 * b_out.T  # copied into OUT
            if slot in PRIMARY:
                b_v[D_HEAD - 1] = 1.0  # FLAG, whatever the head attends to
                rows[D_HEAD - 1] = FLAG * flag
            if slot == BACKUP:  # FLAG in the query, matched by position 0's key (dim D_HEAD - 1)
                q[:, D_HEAD - 1] = WAKE * gain * flag / FLAG
                k[:, D_HEAD - 1] = gain * b_pos[:, 0]
        prefix = f"transformer.h.{layer}.attn."
        state[prefix + "c_attn.weight"], state[prefix + "c_attn.bias"] = w_qkv, b_qkv
        state[prefix + "c_proj.weight"] = w_o
    with torch.no_grad():
        for name, param in loaded.model.named_parameters():
            param.copy_(state[name].to(param.dtype))
    return Planted(loaded, {"primary": list(PRIMARY), "backup": BACKUP, "decoy": DECOY}, {"s0": s0, "gain": gain})


def planted_task(loaded, n: int = 16, seed: int = 0) -> Task:
    """`n` sequences of BOS and N_TOKENS random tokens; the metric is the loss at the last position on the
    token at position 1."""
    gen = torch.Generator().manual_seed(seed)
    body = torch.randint(1000, 20000, (n, N_TOKENS), generator=gen)  # [n, N_TOKENS]
    tokens = torch.cat([torch.full((n, 1), loaded.bos_token_id), body], 1)  # [n, pos]
    where = torch.zeros_like(tokens, dtype=torch.bool)
    where[:, -1] = True
    target = torch.zeros_like(tokens)
    target[:, -1] = tokens[:, 1]
    mask = torch.ones_like(tokens, dtype=torch.bool)
    return Task("planted", tokens, mask, where, target, None, None, "loss", "nats", False, "planted backup task")
