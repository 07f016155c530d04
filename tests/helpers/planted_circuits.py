"""A planted induction circuit with a decoy, for the circuits tests.

build_planted(seed) (tests/helpers/planted.py) is built first, unchanged: its previous-token head (the
*source*) writes the previous token's TOK embedding into PREV, the subspace the induction head's
keys read (K-composition, Olsson et al. 2022). Then one free head in a layer before the induction
head becomes a *decoy*: a second previous-token head, planted with the same query/key weights
and the same OV map, except that it writes into the first SUB directions of JUNK, which no
planted head reads. So both heads attend to the previous token and copy it; only the source's
write reaches the induction head's keys.
"""

from __future__ import annotations

import torch

from tests.helpers.planted import D_MODEL, N_HEADS, SUB, Planted, _plant, build_planted, place_roles


def decoy_slot(roles: dict) -> tuple[int, int] | None:
    """The first free head in a layer before the induction head's (None: there is none)."""
    used = set(roles.values())
    for layer in range(roles["induction"][0]):
        for head in range(N_HEADS):
            if (layer, head) not in used:
                return layer, head
    return None


def decoy_seeds(n: int) -> list[int]:
    """The first n seeds whose roles leave a free head before the induction layer."""
    seeds = [seed for seed in range(100) if decoy_slot(place_roles(seed)) is not None]
    return seeds[:n]


def build_planted_decoy(seed: int) -> Planted:
    """The planted model of `seed` with a decoy previous-token head (positions["decoy"])."""
    planted = build_planted(seed)
    layer, head = decoy_slot(planted.positions)
    sub = planted.subspaces
    b_elsewhere = sub["junk"][:, :SUB]  # [d_model, SUB]: read by no planted head
    attn = planted.loaded.model.transformer.h[layer].attn
    with torch.no_grad():
        w_qkv = attn.c_attn.weight.double().clone()  # [d_model, q | k | v]
        b_qkv = attn.c_attn.bias.double().clone()
        w_o = attn.c_proj.weight.double().clone()  # [head * d_head, d_model]
        d_head = D_MODEL // N_HEADS
        cols = slice(head * d_head, (head + 1) * d_head)
        q, k, v = (w_qkv[:, n * D_MODEL :][:, cols] for n in range(3))  # views [d_model, d_head]
        rows = w_o[cols]  # [d_head, d_model] view
        subspaces = (sub["pos"], sub["tok"], b_elsewhere, sub["out"])  # PREV swapped for JUNK
        _plant("previous_token", q, k, v, rows, b_qkv[cols], sub["gain"], sub["s0"], subspaces, 1.0)
        attn.c_attn.weight.copy_(w_qkv.float())
        attn.c_attn.bias.copy_(b_qkv.float())
        attn.c_proj.weight.copy_(w_o.float())
    planted.positions = {**planted.positions, "decoy": (layer, head)}
    return planted
