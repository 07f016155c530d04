"""More planted heads on the planted GPT-2 (tests/helpers/planted.py): successor and copy suppression.

build_planted(seed) is built first, unchanged; then two of its free heads are rewritten:
  successor         the ordinal tasks' tokens (headlens.scores.successor.successor_tasks) get
                    rotation codes as their TOK embedding (and unembedding): item k of a task is
                    c_k = (cos w_j k, sin w_j k)_j / sqrt(32) for 32 random frequencies w_j, so one
                    block rotation R maps c_k onto c_{k+1} exactly, for every k and task, while
                    c_k . c_m < 1 for m != k. The head's OV reads TOK and writes R(TOK) into OUT:
                    W_U W_OV W_EE ranks item k + 1 first among the task's tokens. Its output is
                    scaled by SUCCESSOR_GAIN so it barely moves the model's predictions (the
                    succession score is argmax-based and does not see the scale).
  copy_suppression  in a layer after the induction head: q reads OUT (what the model predicts,
                    which the induction head wrote), k reads TOK, so it attends to earlier copies
                    of the predicted token; OV writes minus the attended token into OUT, at half
                    the induction head's gain so the prediction survives (McDougall et al. 2023).
The other heads keep their roles and their background weights.

build_planted_ioi(seed) plants, instead, an indirect-object circuit of two heads (names get a
shared "name" direction f in TOK, e_name = (e + f) / |e + f|; INH is the first SUB directions of
the JUNK subspace):
  name_gatherer     a constant query f, keys TOK: every position attends evenly to the names
                    before it and writes their mean into INH. At END of an IOI prompt that is
                    (e_IO + 2 e_S) / 3: the subject, named twice, weighs twice.
  name_mover        in a later layer: query C1 f - BETA INH, keys TOK, so names score by f and
                    lose by how much of them INH holds: IO beats S. OV copies TOK into OUT
                    (Wang et al.'s name mover: attend to IO, copy it).
"""

from __future__ import annotations

import math

import torch

from headlens.scores.name_mover import name_tokens
from headlens.scores.successor import successor_tasks
from tests.helpers.planted import (
    COPY_GAIN,
    D_HEAD,
    D_MODEL,
    N_HEADS,
    N_LAYERS,
    SUB,
    Planted,
    build_planted,
    place_roles,
)

C1, BETA = 3.0, 2.0  # the name mover's query: C1 f - BETA INH (measured: END puts ~0.6 on IO, ~0.4 on S1 + S2)
SUCCESSOR_GAIN = 0.05  # the successor head's output, relative to the induction head's copy
CS_GAIN = 0.5 * COPY_GAIN  # copy suppression writes half of what the induction head copies
KIND_ROLES = ("successor", "copy_suppression")


def kind_seeds(n: int) -> list[int]:
    """The first n seeds whose induction head leaves a later layer with a free head."""
    seeds = []
    for seed in range(100):
        roles = place_roles(seed)
        used = set(roles.values())
        later = [
            (lay, h)
            for lay in range(roles["induction"][0] + 1, N_LAYERS)
            for h in range(N_HEADS)
            if (lay, h) not in used
        ]
        if later:
            seeds.append(seed)
        if len(seeds) == n:
            return seeds
    raise AssertionError("no seed places the induction head before a free layer")


def kind_slots(roles: dict) -> dict[str, tuple[int, int]]:
    """Free heads for the new roles: copy suppression in the first free head after the induction
    layer, the successor in the first free head left."""
    used = set(roles.values())
    free = [(lay, h) for lay in range(N_LAYERS) for h in range(N_HEADS) if (lay, h) not in used]
    cs = next(slot for slot in free if slot[0] > roles["induction"][0])
    succ = next(slot for slot in free if slot != cs)
    return {"copy_suppression": cs, "successor": succ}


def rotation_codes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes c_k for k < n [n, SUB] (unit norm) and the rotation R [SUB, SUB] with c_k R = c_{k+1}."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    omega = 0.2 + (math.pi - 0.4) * torch.rand(SUB // 2, generator=gen, dtype=torch.float64)  # [freq]
    k = torch.arange(n, dtype=torch.float64)[:, None]  # [n, 1]
    codes = torch.stack([torch.cos(omega * k), torch.sin(omega * k)], -1).reshape(n, SUB) / math.sqrt(SUB // 2)
    rot = torch.zeros(SUB, SUB, dtype=torch.float64)
    for j, w in enumerate(omega.tolist()):
        c, s = math.cos(w), math.sin(w)
        rot[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return codes, rot


def build_planted_kinds(seed: int) -> Planted:
    """build_planted(seed) with a successor head and a copy-suppression head planted in free slots."""
    planted = build_planted(seed)
    sub, model = planted.subspaces, planted.loaded.model
    slots = kind_slots(planted.positions)
    tasks = successor_tasks(planted.loaded.tokenizer)
    codes, rot = rotation_codes(max(len(t.tokens) for t in tasks), seed)
    half = slice(0, SUB)
    with torch.no_grad():
        wte, lm_head = model.transformer.wte.weight, model.lm_head.weight  # [d_vocab, d_model]
        for task in tasks:
            rows = codes[: len(task.tokens)]  # [c, SUB]
            wte[task.tokens] = (rows @ sub["tok"].T).to(wte.dtype)
            lm_head[task.tokens] = (rows @ sub["out"].T).to(lm_head.dtype)
        q, k, v, o = _head_weights(model, *slots["successor"])
        v[:, half] += sub["tok"].to(v.dtype)
        o.zero_()
        o[half] = (SUCCESSOR_GAIN / sub["s0"] * rot @ sub["out"].T).to(o.dtype)
        q, k, v, o = _head_weights(model, *slots["copy_suppression"])
        q[:, half] += (sub["gain"] * sub["out"]).to(q.dtype)  # query: the prediction in OUT
        k[:, half] += (sub["gain"] * sub["tok"]).to(k.dtype)  # key: the token itself
        v[:, half] += sub["tok"].to(v.dtype)
        o.zero_()
        o[half] = (-CS_GAIN / sub["s0"] * sub["out"].T).to(o.dtype)  # minus the attended token
    return Planted(planted.loaded, {**planted.positions, **slots}, sub)


def _head_weights(model, layer: int, head: int, bias: bool = False):
    """Views of one head's Q, K, V columns [d_model, d_head] and W_O rows [d_head, d_model]
    (and, with `bias`, its query bias [d_head])."""
    attn = model.transformer.h[layer].attn
    cols = slice(head * D_HEAD, (head + 1) * D_HEAD)
    w = attn.c_attn.weight  # [d_model, q|k|v]
    q, k, v = (w[:, n * D_MODEL :][:, cols] for n in range(3))
    return (q, k, v, attn.c_proj.weight[cols]) + ((attn.c_attn.bias[cols],) if bias else ())


def ioi_slots(roles: dict) -> dict[str, tuple[int, int]] | None:
    """Free heads for the gatherer and, in a later layer, the name mover (None if there are none)."""
    used = set(roles.values())
    free = [(lay, h) for lay in range(N_LAYERS) for h in range(N_HEADS) if (lay, h) not in used]
    for gatherer in free:
        later = [slot for slot in free if slot[0] > gatherer[0]]
        if later:
            return {"name_gatherer": gatherer, "name_mover": later[0]}
    return None


def build_planted_ioi(seed: int) -> Planted:
    """build_planted(seed) with the two-head indirect-object circuit of the module docstring."""
    planted = build_planted(seed)
    sub, model = planted.subspaces, planted.loaded.model
    slots = ioi_slots(planted.positions)
    gen = torch.Generator().manual_seed(30_000 + seed)
    flag = torch.randn(SUB, generator=gen, dtype=torch.float64)
    flag /= flag.norm()  # f, in TOK coordinates: [SUB]
    b_inh, half = sub["junk"][:, :SUB], slice(0, SUB)
    with torch.no_grad():
        wte, lm_head = model.transformer.wte.weight, model.lm_head.weight  # [d_vocab, d_model]
        names = torch.tensor(sorted(name_tokens(planted.loaded.tokenizer).values()))
        coords = wte[names].double() @ sub["tok"] + flag  # [n_names, SUB]
        coords /= coords.norm(dim=-1, keepdim=True)
        wte[names] = (coords @ sub["tok"].T).to(wte.dtype)
        lm_head[names] = (coords @ sub["out"].T).to(lm_head.dtype)
        q, k, v, o, b_q = _head_weights(model, *slots["name_gatherer"], bias=True)
        b_q[half] += (sub["gain"] * sub["s0"] * flag).to(b_q.dtype)  # a constant query: f
        k[:, half] += (sub["gain"] * sub["tok"]).to(k.dtype)
        v[:, half] += sub["tok"].to(v.dtype)
        o.zero_()
        o[half] = (b_inh.T / sub["s0"]).to(o.dtype)  # the attended names' mean into INH
        q, k, v, o, b_q = _head_weights(model, *slots["name_mover"], bias=True)
        b_q[half] += (C1 * sub["gain"] * sub["s0"] * flag).to(b_q.dtype)
        q[:, half] += (-BETA * sub["gain"] * b_inh).to(q.dtype)  # minus the names INH holds
        k[:, half] += (sub["gain"] * sub["tok"]).to(k.dtype)
        v[:, half] += sub["tok"].to(v.dtype)
        o.zero_()
        o[half] = (COPY_GAIN / sub["s0"] * sub["out"].T).to(o.dtype)  # copy the attended name
    return Planted(planted.loaded, {**planted.positions, **slots}, sub)


def labelled_heads(frame, label: str) -> list[tuple[int, int]]:
    """(layer, head) of the classify frame's heads carrying `label`, in (layer, head) order."""
    return [(int(r.layer), int(r.head)) for r in frame.itertuples() if label in r.labels]


# A rare-word head ---------------------------------------------------------------------------------------------

# Words GPT-2 spells as one token (with a leading space), common to rare; the rare-word text is made of them.
RARE_POOL = (
    "the of and to in that was for with his they from have were said would there when which their time "
    "people water house little number family ship garden letter window river bridge market lantern harbour "
    "ledger barrel anchor ribbon tavern orchard thistle walrus goblet"
).split()
RARE_GAIN = 4.0  # query size, in PEAK_SCORE units: one rank of rarity is worth 4 / (pool - 1) peaks (~4)
RARE_SENTENCES = 60


def rare_pool(tokenizer) -> list[tuple[str, int]]:
    """(word, token id) of RARE_POOL's words that are one token, most frequent first, distinct frequencies."""
    from wordfreq import word_frequency

    pool, seen = [], set()
    for word in RARE_POOL:
        ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        freq = word_frequency(word, "en")
        if len(ids) == 1 and freq not in seen:
            pool.append((word, ids[0], freq))
            seen.add(freq)
    return [(word, tok) for word, tok, _ in sorted(pool, key=lambda p: -p[2])]


def rare_text(tokenizer, seed: int, n: int = RARE_SENTENCES) -> str:
    """n sentences of 6-9 distinct pool words in random order, each ending with a full stop."""
    words = [w for w, _ in rare_pool(tokenizer)]
    gen = torch.Generator().manual_seed(40_000 + seed)
    sentences = []
    for _ in range(n):
        size = int(torch.randint(6, 10, (1,), generator=gen))
        pick = torch.randperm(len(words), generator=gen)[:size].tolist()
        sentences.append(" ".join(words[i] for i in pick) + ".")
    return " ".join(sentences)


def rare_slot(roles: dict) -> tuple[int, int]:
    """The first free head, layer 0 first (where the LayerNorm scale is known)."""
    used = set(roles.values())
    return next((lay, h) for lay in range(N_LAYERS) for h in range(N_HEADS) if (lay, h) not in used)


def build_planted_rare_word(seed: int) -> Planted:
    """build_planted(seed) with a rare-word head: the pool's tokens carry their rarity along a direction
    f of TOK (e = c f + sqrt(1 - c^2) e_perp, c = rank / (pool - 1), the rarest at c = 1), and a free
    head's constant query f against keys TOK (its background Q/K weights cleared) scores every key by
    its c: its maximum falls on the sentence's least frequent word."""
    planted = build_planted(seed)
    sub, model = planted.subspaces, planted.loaded.model
    slot = rare_slot(planted.positions)
    pool = rare_pool(planted.loaded.tokenizer)
    gen = torch.Generator().manual_seed(50_000 + seed)
    flag = torch.randn(SUB, generator=gen, dtype=torch.float64)
    flag /= flag.norm()  # f, in TOK coordinates: [SUB]
    half = slice(0, SUB)
    with torch.no_grad():
        wte = model.transformer.wte.weight  # [d_vocab, d_model]
        ids = torch.tensor([tok for _, tok in pool])  # [n]
        rarity = torch.arange(len(pool), dtype=torch.float64) / (len(pool) - 1)  # [n]: 0 commonest .. 1 rarest
        coords = wte[ids].double() @ sub["tok"]  # [n, SUB]
        perp = coords - (coords @ flag)[:, None] * flag
        perp /= perp.norm(dim=-1, keepdim=True)
        coords = rarity[:, None] * flag + (1 - rarity[:, None] ** 2).sqrt() * perp  # [n, SUB], unit
        wte[ids] = (coords @ sub["tok"].T).to(wte.dtype)
        q, k, v, o, b_q = _head_weights(model, *slot, bias=True)
        q.zero_(), k.zero_()  # no background scores: the key's rarity alone ranks the keys
        b_q[half] += (RARE_GAIN * sub["gain"] * sub["s0"] * flag).to(b_q.dtype)  # a constant query: f
        k[:, half] += (sub["gain"] * sub["tok"]).to(k.dtype)
    return Planted(planted.loaded, {**planted.positions, "rare_word": slot}, sub)
