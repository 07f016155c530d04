"""A hand-built GPT-2 whose heads we know: planted ground truth for the classifier.

A real `transformers.GPT2LMHeadModel` (GPT-2's modules, LayerNorms, MLPs, learned position
table, the GPT-2 tokenizer's 50,257-token vocabulary) whose weights are written, not trained:

Residual stream: d_model = 384, split by an orthonormal basis orthogonal to the all-ones
vector (so LayerNorm's mean subtraction is a no-op and LN(x) = sqrt(d_model) x / |x|) into
  POS  64  position i as 32 frequency pairs (cos, sin)(pi k i / 32) / sqrt(32): p_i . p_j is a
           Dirichlet kernel, 1 at i == j and 0 or -1/32 elsewhere for |i - j| < 64 = n_ctx
  TOK  64  token v as a random unit vector e_v (the input embedding)
  PREV 64  written by the previous-token head: e of the token one position back
  OUT  64  written by the induction head; the (untied) unembedding reads only OUT
  JUNK     where every other head writes its small random output
Heads (d_head = 128; every head also gets small random "background" Q/K/V weights, so the
un-planted heads are genuinely near-uniform, not special-cased):
  previous_token   q = rotate(p_i by 1), k = p_j -> attends i-1; OV copies TOK into PREV
  offset -2        q = rotate(p_i by 2), k = p_j -> attends i-2
  first_token      q = constant p_0 (bias), k = p_j -> attends position 0 (Gu et al.'s sink)
  duplicate_token  q.k = e_i . e_j - p_i . p_j -> earlier copies of the same token, not itself
  induction        q = e_i (TOK), k = PREV_j: K-composition with the previous-token head
                   (Olsson et al.), attends the token after an earlier copy; OV copies that
                   token's e into OUT, so the logits raise exactly the attended token
MLPs are zero. Embeddings are untied (tie_word_embeddings=False; same modules) so that only
the copying head writes what the unembedding reads: tied, every token's own embedding
would dominate the logits. Position 64 = n_ctx is the one size the 128-dim heads allow
(64 positional dims + 64 token dims per head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

D_MODEL, N_HEADS, N_LAYERS, N_CTX = 384, 3, 4, 64
D_HEAD = D_MODEL // N_HEADS
K_FREQ = N_CTX // 2  # frequency pairs: the kernel is exact for |i - j| < 2 * K_FREQ = N_CTX
SUB = 64  # width of the POS, TOK, PREV and OUT subspaces
PEAK_SCORE = 40.0  # planted pre-softmax score at the target (layer 0 LN scale); e^-40 elsewhere
BACKGROUND_STD = 0.036  # random Q/K/V weights: pre-softmax scores with std ~0.5 (near-uniform)
VALUE_SHARE = 0.25  # background value weights, relative to BACKGROUND_STD
JUNK_GAIN = 0.05  # size of the random outputs every head but the two composing ones writes
COPY_GAIN = 1.0  # norm of the induction head's copy in OUT (the unembedding reads only OUT)

ROLES = ("previous_token", "offset_2", "first_token", "duplicate_token", "induction")
# The labels each planted role must earn from classify_heads (and nothing else).
EXPECTED_LABELS = {
    "previous_token": ["previous_token", "positional"],
    "offset_2": ["positional"],
    "first_token": ["first_token"],
    "duplicate_token": ["duplicate_token"],
    "induction": ["induction", "retrieval"],
}

# Natural text for the planted model's text and needle probes (our own prose; any English works,
# the planted heads do not depend on its meaning).
PLANTED_TEXT = """The lighthouse keeper kept a ledger of every ship that passed the headland. Each
morning he climbed the stairs, trimmed the wick, and wrote the weather in a narrow hand. In
spring the fishing boats came back from the southern banks, low in the water and loud with
gulls. In autumn the storms arrived from the west, and he counted the hours between the
flashes of the beacon on the far island. His daughter learned to read from that ledger. She
knew the names of the schooners before she knew the names of the flowers in the garden, and
she could tell a brig from a barque by the set of its sails at a mile. When the keeper grew
old, the lamp was replaced by an electric light that needed no one to tend it, and the
ledger was carried to the museum in the town, where it lies open under glass. Visitors lean
over it and read about a calm day in June, a wreck in November, a whale seen close to the
rocks, and the quiet line at the bottom of each page: all well, light burning. The museum
also keeps his spyglass, a brass instrument with a dent near the eyepiece, and a map of the
coast on which he marked every reef with a small careful cross. Schoolchildren copy the map
into their notebooks, and some of them, years later, become sailors themselves."""


@dataclass
class Planted:
    """A planted model and where its roles sit."""

    loaded: object  # headlens LoadedModel
    positions: dict[str, tuple[int, int]]  # role -> (layer, head)
    subspaces: dict | None = None  # "pos", "tok", "prev", "out", "junk": bases [d_model, width]; "s0", "gain"


def place_roles(seed: int) -> dict[str, tuple[int, int]]:
    """Random distinct slots for the roles; the induction head sits in a later layer than the
    previous-token head it composes with."""
    gen = torch.Generator().manual_seed(seed)
    prev_layer = int(torch.randint(0, N_LAYERS - 1, (1,), generator=gen))
    ind_layer = int(torch.randint(prev_layer + 1, N_LAYERS, (1,), generator=gen))
    slots = {
        "previous_token": (prev_layer, int(torch.randint(0, N_HEADS, (1,), generator=gen))),
        "induction": (ind_layer, int(torch.randint(0, N_HEADS, (1,), generator=gen))),
    }
    free = [
        (layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS) if (layer, head) not in slots.values()
    ]
    order = torch.randperm(len(free), generator=gen).tolist()
    for role, index in zip(("offset_2", "first_token", "duplicate_token"), order, strict=False):
        slots[role] = free[index]
    return slots


def _positions() -> torch.Tensor:
    """p_i for i < N_CTX: [n_ctx, SUB], unit norm."""
    i = torch.arange(N_CTX, dtype=torch.float64)[:, None]  # [pos, 1]
    omega = math.pi * torch.arange(1, K_FREQ + 1, dtype=torch.float64)[None] / K_FREQ  # [1, freq]
    pairs = torch.stack([torch.cos(omega * i), torch.sin(omega * i)], dim=-1)  # [pos, freq, 2]
    return pairs.reshape(N_CTX, SUB) / math.sqrt(K_FREQ)


def _rotation(offset: int) -> torch.Tensor:
    """M with M p_i = p_{i - offset}: [SUB, SUB], block-diagonal rotations by -omega_k * offset."""
    m = torch.zeros(SUB, SUB, dtype=torch.float64)
    for k in range(K_FREQ):
        angle = -math.pi * (k + 1) / K_FREQ * offset
        c, s = math.cos(angle), math.sin(angle)
        m[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return m


def build_planted(seed: int, copy_sign: float = 1.0) -> Planted:
    """The planted GPT2LMHeadModel for `seed` (which also moves the roles), as a LoadedModel.

    copy_sign = -1 flips the induction head's OV circuit: it still prefix-matches but writes
    minus the attended token, an anti-induction head (and the model no longer retrieves).
    """
    from transformers import GPT2Config

    from headlens.load.models import build_model

    config = GPT2Config(n_layer=N_LAYERS, n_head=N_HEADS, n_embd=D_MODEL, n_positions=N_CTX, tie_word_embeddings=False)
    loaded = build_model(config, seed=seed, name=f"planted-{seed}")
    gen = torch.Generator().manual_seed(10_000 + seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    basis, _ = torch.linalg.qr(
        torch.cat([torch.ones(D_MODEL, 1, dtype=torch.float64), randn(D_MODEL, D_MODEL - 1)], dim=1)
    )  # [d_model, d_model]; column 0 ~ ones
    b_pos, b_tok, b_prev, b_out = (basis[:, 1 + SUB * n : 1 + SUB * (n + 1)] for n in range(4))  # [d_model, SUB]
    b_junk = basis[:, 1 + 4 * SUB :]  # [d_model, rest]
    d_vocab = config.vocab_size
    tok = randn(d_vocab, SUB)
    tok /= tok.norm(dim=-1, keepdim=True)  # e_v, unit: [d_vocab, SUB]
    s0 = math.sqrt(D_MODEL / 2)  # LN scale at layer 0: |x|^2 = |e|^2 + |p|^2 = 2
    gain = math.sqrt(PEAK_SCORE * math.sqrt(D_HEAD)) / s0  # s0^2 g^2 / sqrt(d_head) = PEAK_SCORE
    roles = place_roles(seed)
    at = {slot: role for role, slot in roles.items()}
    with torch.no_grad():
        state = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in loaded.model.named_parameters()}
        state["transformer.wte.weight"] = tok @ b_tok.T  # [d_vocab, d_model]
        state["transformer.wpe.weight"] = _positions() @ b_pos.T  # [n_ctx, d_model]
        state["lm_head.weight"] = tok @ b_out.T  # [d_vocab, d_model]: reads OUT only
        for name in list(state):
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                state[name] = torch.ones_like(state[name])
        for layer in range(N_LAYERS):
            w_qkv = BACKGROUND_STD * randn(D_MODEL, 3 * D_MODEL)  # [d_model, q|k|v]
            w_qkv[:, 2 * D_MODEL :] *= VALUE_SHARE  # quieter values: small outputs everywhere
            b_qkv = torch.zeros(3 * D_MODEL, dtype=torch.float64)
            w_o = torch.zeros(D_MODEL, D_MODEL, dtype=torch.float64)  # [head * d_head, d_model]
            for head in range(N_HEADS):
                cols = slice(head * D_HEAD, (head + 1) * D_HEAD)
                q, k, v = (w_qkv[:, n * D_MODEL :][:, cols] for n in range(3))  # views [d_model, d_head]
                rows = w_o[cols]  # [d_head, d_model] view
                rows += JUNK_GAIN / s0 * randn(D_HEAD, b_junk.shape[1]) @ b_junk.T / math.sqrt(D_HEAD)
                _plant(
                    at.get((layer, head)),
                    q,
                    k,
                    v,
                    rows,
                    b_qkv[cols],
                    gain,
                    s0,
                    (b_pos, b_tok, b_prev, b_out),
                    copy_sign,
                )
            prefix = f"transformer.h.{layer}.attn."
            state[prefix + "c_attn.weight"], state[prefix + "c_attn.bias"] = w_qkv, b_qkv
            state[prefix + "c_proj.weight"] = w_o
        for name, param in loaded.model.named_parameters():
            param.copy_(state[name].to(param.dtype))
    subspaces = {"pos": b_pos, "tok": b_tok, "prev": b_prev, "out": b_out, "junk": b_junk, "s0": s0, "gain": gain}
    return Planted(loaded, roles, subspaces)


def _plant(role, q, k, v, rows, b_q, gain, s0, subspaces, copy_sign) -> None:
    """Write one role's weights into its head's Q/K/V columns, Q bias and W_O rows (in place)."""
    b_pos, b_tok, b_prev, b_out = subspaces
    half = slice(0, SUB)
    if role in ("previous_token", "offset_2"):
        q[:, half] += gain * b_pos @ _rotation(1 if role == "previous_token" else 2).T
        k[:, half] += gain * b_pos
        if role == "previous_token":  # OV: TOK of the attended token -> PREV, unit norm
            v[:, half] += b_tok
            rows[half] = b_prev.T / s0
    elif role == "first_token":
        b_q[half] += gain * s0 * _positions()[0]  # a constant query: p_0, at layer-0 strength
        k[:, half] += gain * b_pos
    elif role == "duplicate_token":
        q[:, half] += gain * b_tok
        k[:, half] += gain * b_tok
        q[:, SUB:] += -gain * b_pos  # minus the current position: earlier copies, not itself
        k[:, SUB:] += gain * b_pos
    elif role == "induction":
        q[:, half] += gain * b_tok
        k[:, half] += gain * b_prev  # K-composition: the key is what the previous-token head wrote
        v[:, half] += b_tok
        rows[half] = copy_sign * COPY_GAIN * b_out.T / s0  # OV: copy the attended token into OUT
