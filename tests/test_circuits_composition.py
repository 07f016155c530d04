"""Composition scores (headlens.circuits.composition) against:
1. an independent computation in this file: the full [d_model, d_model] W_OV and W_QK of every head
   built from the Hugging Face modules by their own names (not through headlens.arch), norm gains
   and LayerNorm centring folded in by hand, on every family of tests/helpers/families.py and GPT-2;
2. the random baseline sampled here with full matrices;
3. the planted induction circuit with a decoy (tests/helpers/planted_circuits.py): the source previous-token
   head K-composes with the induction head far above random, the decoy does not.
"""

from __future__ import annotations

import functools

import pytest
import torch

from headlens.circuits.composition import composition_scores, random_baseline
from tests.helpers.families import FAMILY_NAMES, build_family
from tests.helpers.planted_circuits import build_planted_decoy, decoy_seeds

# float32 Gram products: a score near 0 comes from a difference of sums of ~d_model^2 products, whose
# float32 rounding (2^-24 relative each) leaves ~1e-3 absolute on the score; above ~0.1 it is far closer.
SCORE_ATOL = 2e-3
Z_SOURCE = 10.0  # the planted source must stand this many random-baseline deviations above the mean
Z_RANDOM = 3.0  # a head whose write the receiver does not read stays within 3 deviations of random


def _gain(norm, offset: float = 0.0) -> torch.Tensor:
    return norm.weight.detach().double() + offset


def _hf_weights(model, layer: int) -> dict[str, torch.Tensor]:
    """W_Q, W_K, W_V [head, d_model, d_head] and W_O [head, d_head, d_model] read from the modules by
    their Hugging Face names, gains folded (row-vector convention)."""
    cfg = model.config
    kind = cfg.model_type
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    d_model = cfg.hidden_size
    d_head = getattr(cfg, "head_dim", None) or d_model // n_heads
    offset = 1.0 if kind == "gemma3_text" else 0.0
    centre = kind in ("gpt2", "gpt_neox")
    if kind == "gpt2":
        block = model.transformer.h[layer]
        w = block.attn.c_attn.weight.detach().double()  # [d_model, 3 d_model] Conv1D
        q, k, v = w[:, :d_model], w[:, d_model : 2 * d_model], w[:, 2 * d_model :]
        o = block.attn.c_proj.weight.detach().double()  # [d_model (heads), d_model]
        gain, qn, kn, out_gain = _gain(block.ln_1), None, None, None
    elif kind == "gpt_neox":
        block = model.gpt_neox.layers[layer]
        w = block.attention.query_key_value.weight.detach().double().view(n_heads, 3, d_head, d_model)
        q, k, v = (w[:, i].reshape(n_heads * d_head, d_model).T for i in range(3))
        o = block.attention.dense.weight.detach().double().T  # [heads * d_head, d_model]
        gain, qn, kn, out_gain = _gain(block.input_layernorm), None, None, None
    else:
        block = model.model.layers[layer]
        attn = block.self_attn
        q, k, v = (m.weight.detach().double().T for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        o = attn.o_proj.weight.detach().double().T
        gain = _gain(block.input_layernorm, offset)
        qn = _gain(attn.q_norm, offset) if hasattr(attn, "q_norm") else None
        kn = _gain(attn.k_norm, offset) if hasattr(attn, "k_norm") else None
        out_gain = _gain(block.post_attention_layernorm, offset) if kind == "gemma3_text" else None

    def read(m, heads, norm_gain):
        m = gain[:, None] * m
        if centre:
            m = m - m.mean(0, keepdim=True)
        m = m.reshape(d_model, heads, d_head).permute(1, 0, 2)  # [heads, d_model, d_head]
        return m if norm_gain is None else m * norm_gain

    group = torch.arange(n_heads) // (n_heads // n_kv)
    w_o = o.reshape(n_heads, d_head, d_model)
    if out_gain is not None:
        w_o = w_o * out_gain
    if centre:
        w_o = w_o - w_o.mean(-1, keepdim=True)
    return {"q": read(q, n_heads, qn), "k": read(k, n_kv, kn)[group], "v": read(v, n_kv, None)[group], "o": w_o}


def _expected(model) -> dict[tuple[str, str, str], float]:
    """Every score from full matrices: (sender, receiver, via) -> score."""
    n_layers = model.config.num_hidden_layers
    per_layer = [_hf_weights(model, layer) for layer in range(n_layers)]
    out = {}
    for rl in range(n_layers):
        r = per_layer[rl]
        for rh in range(r["q"].shape[0]):
            qk = r["q"][rh] @ r["k"][rh].T  # [d_model, d_model]
            ov_r = r["v"][rh] @ r["o"][rh]
            for sl in range(rl):
                s = per_layer[sl]
                for sh in range(s["q"].shape[0]):
                    ov = s["v"][sh] @ s["o"][sh]
                    for via, right in (("q", qk), ("k", qk.T), ("v", ov_r)):
                        score = torch.linalg.norm(ov @ right) / (torch.linalg.norm(ov) * torch.linalg.norm(right))
                        out[(f"{sl}.{sh}", f"{rl}.{rh}", via)] = float(score)
    return out


def _gpt2():
    from transformers import GPT2Config

    from headlens.load.models import build_model

    loaded = build_model(GPT2Config(n_layer=3, n_head=4, n_embd=64, n_positions=64), seed=0, name="gpt2-small")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in loaded.model.parameters():
            if param.dim() == 1:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))  # gains and biases away from 1 and 0
    return loaded


# One model per weight layout: GPT-2 (fused Conv1D, LayerNorm), Llama with GQA (Mistral and Qwen2 share its
# modules), Qwen3 (per-head q/k norms, head_dim != d_model / n_heads), GPT-NeoX (per-head fused QKV,
# LayerNorm), Gemma 3 ((1 + w) norms, the norm on the attention output, MQA).
LAYOUTS = ["gpt2", "llama-gqa", "qwen3-mqa", "gpt_neox-parallel", "gemma3_text-mqa"]


@functools.cache
def _model(name: str):
    return _gpt2() if name == "gpt2" else build_family(name)


@pytest.mark.slow
def test_composition_runs_on_every_family():
    for name in FAMILY_NAMES:
        if name not in LAYOUTS:
            frame = composition_scores(build_family(name), samples=8).frame
            assert frame["composition"].between(0, 1).all(), name


@pytest.mark.parametrize("name", LAYOUTS)
def test_composition_equals_full_matrix_scores(name):
    loaded = _model(name)
    frame = composition_scores(loaded, samples=16).frame
    expected = _expected(loaded.model)
    assert len(frame) == len(expected)
    got = {(r.sender, r.receiver, r.via): r.composition for r in frame.itertuples()}
    assert got.keys() == expected.keys()
    worst = max(abs(got[key] - expected[key]) for key in expected)
    assert worst < SCORE_ATOL, worst
    assert frame[["effect", "attribution"]].isna().all().all()


def test_random_baseline_matches_full_random_matrices():
    d_model, d_head, n = 48, 8, 400
    mean, std = random_baseline(d_model, d_head, samples=n, seed=3)
    gen = torch.Generator().manual_seed(7)
    scores = []
    for _ in range(n):
        a, c, d = (torch.randn(d_model, d_head, generator=gen, dtype=torch.float64) for _ in range(3))
        b = torch.randn(d_head, d_model, generator=gen, dtype=torch.float64)
        ov, right = a @ b, c @ d.T
        scores.append(float(torch.linalg.norm(ov @ right) / (torch.linalg.norm(ov) * torch.linalg.norm(right))))
    ref = torch.tensor(scores)
    # two independent samples of n: their means differ by ~std * sqrt(2 / n); 4 such errors bound it
    assert abs(mean - float(ref.mean())) < 4 * float(ref.std()) * (2 / n) ** 0.5
    assert 0.7 < std / float(ref.std()) < 1.3  # sample standard deviations of n = 400 agree within ~7% each


def test_random_weights_score_like_the_baseline():
    """A random-weight model's heads are the random matrices the baseline describes (Gaussian init):
    their mean score sits within one baseline deviation of the baseline's mean."""
    frame = composition_scores(_model("llama-gqa"), samples=128).frame
    base, spread = frame["composition_baseline"].iloc[0], frame["composition_baseline_std"].iloc[0]
    assert abs(frame["composition"].mean() - base) < spread


@pytest.mark.parametrize("seed", decoy_seeds(1))
def test_planted_source_k_composes_and_the_decoy_does_not(seed):
    planted = build_planted_decoy(seed)
    ind = "{}.{}".format(*planted.positions["induction"])
    source = "{}.{}".format(*planted.positions["previous_token"])
    decoy = "{}.{}".format(*planted.positions["decoy"])
    frame = composition_scores(planted.loaded).frame
    into = frame[frame["receiver"] == ind]
    top = into.loc[into["composition"].idxmax()]
    assert (top["sender"], top["via"]) == (source, "k")
    assert top["composition_z"] > Z_SOURCE
    decoy_k = into[(into["sender"] == decoy) & (into["via"] == "k")].iloc[0]
    assert decoy_k["composition_z"] < Z_RANDOM
