"""Gemma 3 (`gemma3_text`): what the family tests do not already pin.

tests/helpers/families.py's "gemma3_text-mqa" runs through every family test: patterns on both capture
paths equal HF eager `output_attentions`, z the o_proj input, `hook_qkv` the tensors eager
attention multiplies (bit for bit), one layer run by the adapter equals the model's own, zero
ablation equals an o_proj hook, the exact sweep equals the hooked full forward (test_arch_families);
validation against HF eager, sdpa and the TransformerLens bridge (test_arch_validate); scores
against `detect_head` (test_arch_scores). Here: the Gemma-specific parts, each against a peer
or a negative control, and the real Gemma 3 270M.

Ground truth is independent of headlens.arch: hooks written here on the Hugging Face module
names, Hugging Face's own modules, TransformerLens's bridge.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headlens.arch import adapter_for
from headlens.arch.gemma3 import Gemma3Adapter
from headlens.capture import Batch, CollectPatterns, run_capture
from headlens.errors import UnsupportedModelError, ValidationFailed
from headlens.heads import Head
from headlens.intervene.evalset import repeat_evalset
from headlens.intervene.sums import ablated_sums
from headlens.load.models import boot_bridge, build_model
from headlens.validate import BUILTIN_TEXT, VALIDATION_ATOL, validate_model
from tests.helpers.families import build_family, gemma3_config, padded_batch
from tests.helpers.gemma_ov import REL_TOL, manual_gemma_ov_logits

# float32 recomputed in another order (our layer split vs the bridge's, hooks vs the model's own
# path): rounding only, ~1e-6 here; a wrong norm, rotary base or mask gives >= 1e-2.
ATOL = 1e-5
TEXT = " ".join([BUILTIN_TEXT] * 3)  # two windows of the 64-token context: a right-padded batch
SLIDING, FULL = "sliding_attention", "full_attention"

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def gemma():
    return build_family("gemma3_text-mqa")


def test_shape_facts_come_from_the_config(gemma):
    adapter, cfg = adapter_for(gemma.model), gemma.model.config
    assert adapter.layer_types() == [SLIDING, SLIDING, FULL, SLIDING]
    assert [adapter.sliding_window(layer) for layer in range(4)] == [5, 5, None, 5]
    assert (adapter.n_heads, adapter.n_kv_heads, adapter.d_head) == (4, 1, 24) != adapter.d_model // adapter.n_heads
    assert adapter.attention_scale(0) == cfg.query_pre_attn_scalar**-0.5 != adapter.d_head**-0.5
    rotary = gemma.model.model.rotary_emb
    for layer, kind in enumerate(adapter.layer_types()):  # each layer reads its own type's frequencies
        assert torch.equal(adapter.attention_weights(layer).inv_freq, getattr(rotary, f"{kind}_inv_freq"))
    assert not torch.allclose(rotary.sliding_attention_inv_freq, rotary.full_attention_inv_freq)


def test_the_site_table_is_llamas_with_gemmas_differences():
    from headlens.arch.llama import LLAMA_SITES
    from headlens.arch.sites import NORMED

    sites = Gemma3Adapter.sites
    changed = {f.name for f in dataclasses.fields(sites) if getattr(sites, f.name) != getattr(LLAMA_SITES, f.name)}
    assert changed == {"rotary", "q", "k", "post_norm"}
    assert sites.q.split.kind == NORMED and sites.q.projection == "self_attn.q_proj"
    assert sites.post_norm == "pre_feedforward_layernorm"


def _validate_with(monkeypatch, gemma, change):
    """validate_model with every layer's AttentionWeights passed through change(layer, weights)."""
    original = Gemma3Adapter.attention_weights
    monkeypatch.setattr(Gemma3Adapter, "attention_weights", lambda self, layer: change(layer, original(self, layer)))
    with pytest.raises(ValidationFailed) as info:
        validate_model(gemma, TEXT)
    failed = info.value.frame[~info.value.frame["passed"]]
    return set(failed["layer"])


def test_validation_needs_each_layers_own_rotary_base(gemma, monkeypatch):
    """Negative control: the other layer type's frequencies fail validation on every layer."""
    rotary = gemma.model.model.rotary_emb
    types = adapter_for(gemma.model).layer_types()
    other = {SLIDING: rotary.full_attention_inv_freq, FULL: rotary.sliding_attention_inv_freq}
    swapped = _validate_with(monkeypatch, gemma, lambda layer, w: dataclasses.replace(w, inv_freq=other[types[layer]]))
    assert swapped == {0, 1, 2, 3}


def test_validation_needs_gemmas_one_plus_w_norm(gemma, monkeypatch):
    """Negative control: q/k norms applied as gain * x (Qwen3's) instead of (1 + gain) * x fail."""
    assert _validate_with(monkeypatch, gemma, lambda layer, w: dataclasses.replace(w, norm_offset=0.0)) == {0, 1, 2, 3}


def test_validation_passes_on_every_layer(gemma):
    frame = validate_model(gemma, TEXT).frame
    assert sorted(frame["layer"].unique()) == [0, 1, 2, 3]
    assert set(frame["reference"]) == {"hf_eager", "sdpa", "transformer_lens"}
    assert (frame["max_abs_error"] <= VALIDATION_ATOL).all()


def _hooked_losses(model, evalset, heads):
    """Per-unit summed loss with each head's slice of the o_proj input zeroed by a hook written here."""
    d_head = model.config.head_dim

    def zero_slice(head):
        def hook(module, args):
            z = args[0].clone()  # [batch, pos, head * d_head]
            z[..., head * d_head : (head + 1) * d_head] = 0
            return (z,)

        return hook

    handles = [
        model.model.layers[h.layer].self_attn.o_proj.register_forward_pre_hook(zero_slice(h.head)) for h in heads
    ]
    try:
        with torch.no_grad():
            logits = model(input_ids=evalset.input_ids, attention_mask=evalset.mask.long()).logits
    finally:
        for handle in handles:
            handle.remove()
    logp = torch.log_softmax(logits[:, :-1], -1)  # [n_seq, pos-1, d_vocab]
    losses = -logp.gather(-1, evalset.input_ids[:, 1:, None])[..., 0]  # [n_seq, pos-1]
    scored = evalset.counted  # [n_seq, pos-1]
    return torch.zeros(evalset.n_units, dtype=torch.float64).index_add(
        0, evalset.units[scored], losses[scored].double()
    )  # [n_units]


@pytest.mark.parametrize(
    "heads", [[Head(2, 1)], [Head(3, 0)], [Head(0, 3), Head(2, 0)]], ids=["global", "sliding", "both"]
)
def test_zero_ablation_on_global_and_sliding_layers_equals_an_o_proj_hook(gemma, heads):
    evalset = repeat_evalset(gemma, seed=4, n_seq=3, seq_len=12)  # 25 tokens: past the window of 5
    ours = ablated_sums(gemma.model, evalset, heads, [None] * 4)  # [n_units]
    expected = _hooked_losses(gemma.model, evalset, heads)
    assert (ours - expected).abs().max() <= ATOL * evalset.counted.sum(-1).max()
    assert (ours - _hooked_losses(gemma.model, evalset, [])).abs().max() > 1e-3  # the ablation did something


def test_w_o_slices_recompose_the_output_projection(gemma):
    ids, mask = padded_batch()
    collect = CollectPatterns(wants=("z",))
    run_capture(gemma.model, [Batch(ids, mask)], [collect])
    adapter = adapter_for(gemma.model)
    for layer in range(4):
        z = collect.zs[layer][0]  # [batch, pos, head, d_head]
        ours = torch.einsum("bphd,hdm->bpm", z, adapter.w_o(layer))  # [batch, pos, d_model]
        theirs = gemma.model.model.layers[layer].self_attn.o_proj(z.flatten(2))  # [batch, pos, d_model]
        assert (ours - theirs).abs().max() <= ATOL


def test_the_layer_split_matches_the_bridge(gemma):
    """attention() ends at o_proj (TransformerLens `attn.hook_out`); finish_block adds the
    post-attention norm, the residual and the sandwich-normed MLP (`hook_resid_post`); the
    bridge's `hook_attn_out` is the post-attention norm's output."""
    ids, mask = padded_batch()
    bridge = boot_bridge(gemma)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids, attention_mask=mask.long())
    adapter = adapter_for(gemma.model)
    real = mask[..., None]  # [batch, pos, 1]
    with torch.no_grad():
        ctx = adapter.context(ids, mask)
        resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
        assert ((resid - cache["blocks.0.hook_resid_pre"]).abs() * real).amax() <= ATOL
        for layer in range(4):
            z, out = adapter.attention(layer, resid, ctx)
            assert ((z - cache[f"blocks.{layer}.attn.hook_z"]).abs() * real[..., None]).amax() <= ATOL
            assert ((out - cache[f"blocks.{layer}.attn.hook_out"]).abs() * real).amax() <= ATOL
            normed = gemma.model.model.layers[layer].post_attention_layernorm(out)  # [batch, pos, d_model]
            assert ((normed - cache[f"blocks.{layer}.hook_attn_out"]).abs() * real).amax() <= ATOL
            resid = adapter.finish_block(layer, resid, out)  # [batch, pos, d_model]
            assert ((resid - cache[f"blocks.{layer}.hook_resid_post"]).abs() * real).amax() <= ATOL * resid.abs().max()


def _circuit_scores(model, post_gain: bool = True) -> torch.Tensor:
    """sum(eig) / sum(|eig|) of each head's full OV circuit written from the Hugging Face modules
    in float64: scaled embedding -> Gemma RMSNorm (1 + w) -> W_V -> W_O -> post-attention norm's
    gain (1 + w; its 1/rms is common to all logits) -> final norm's gain (1 + w) -> W_U."""
    cfg = model.config
    d_head, group = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
    w_u = model.lm_head.weight.double() * (1 + model.model.norm.weight.double())  # [d_vocab, d_model]
    x = model.model.embed_tokens.weight.double() * cfg.hidden_size**0.5  # [d_vocab, d_model]
    out = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads, dtype=torch.float64)
    for layer, block in enumerate(model.model.layers):
        norm = block.input_layernorm
        normed = x / torch.sqrt((x**2).mean(-1, keepdim=True) + norm.eps) * (1 + norm.weight.double())
        w_v = block.self_attn.v_proj.weight.double()  # [kv_head * d_head, d_model]
        w_o = block.self_attn.o_proj.weight.double()  # [d_model, head * d_head]
        if post_gain:
            w_o = w_o * (1 + block.post_attention_layernorm.weight.double())[:, None]  # [d_model, head * d_head]
        for head in range(cfg.num_attention_heads):
            kv = head // group
            values = normed @ w_v[kv * d_head : (kv + 1) * d_head].T  # [d_vocab, d_head]
            small = w_o[:, head * d_head : (head + 1) * d_head].T @ w_u.T @ values  # [d_head, d_head]
            eig = torch.linalg.eigvals(small)
            out[layer, head] = eig.sum().real / eig.abs().sum()
    return out


def test_ov_copying_runs_through_gemmas_norm_gains(gemma):
    from headlens.scores.ov_copying import ov_copying_scores

    with torch.no_grad():
        expected, without = _circuit_scores(gemma.model), _circuit_scores(gemma.model, post_gain=False)
    ours = ov_copying_scores(gemma.model)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0), (ours, expected)  # float32 values vs float64
    assert (without - expected).abs().max() > 1e-2  # the post-attention gain is not a detail


def test_ov_circuit_runs_through_gemmas_norm_gains(gemma):
    """W_U W_OV W_EE of every head (the successor, copy-suppression and name-mover scores' circuit) equals
    tests/helpers/gemma_ov.py's circuit written from the Hugging Face modules; without the attention-output norm's
    gain it would not."""

    from headlens.scores.ov_circuit import ov_logits

    tokens, columns = torch.arange(0, 40), torch.arange(gemma.spec.d_vocab)
    ours = ov_logits(gemma.model, tokens, columns)  # [layer, head, n, d_vocab]
    with torch.no_grad():
        for layer in range(gemma.spec.n_layers):
            manual = manual_gemma_ov_logits(gemma.model, tokens, columns, layer)  # [head, n, d_vocab]
            assert (ours[layer] - manual).abs().max() <= REL_TOL * manual.abs().max(), layer
            gain = 1 + gemma.model.model.layers[layer].post_attention_layernorm.weight.double()  # [d_model]
            assert (gain - 1).abs().max() > 1e-2  # the family model's gains are not all 1: the check has teeth


# Errors


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("final_logit_softcapping", 30.0, "final_logit_softcapping"),
        ("use_bidirectional_attention", True, "bidirectional"),
    ],
)
def test_configs_headlens_cannot_read_are_refused_in_one_line(option, value, words):

    config = gemma3_config()
    setattr(config, option, value)
    with pytest.raises(UnsupportedModelError) as info:
        build_model(config)
    assert words in str(info.value) and "\n" not in str(info.value)


# The real model


@pytest.fixture(scope="module")
def gemma_270m(real_model):
    """Gemma 3 270M pulled into headlens's cache (`make models`), dequantized from its GGUF."""
    return real_model("gemma3-270m")


@pytest.mark.slow
@pytest.mark.real
def test_gemma_270m_validates_on_every_layer(gemma_270m):
    frame = validate_model(gemma_270m).frame
    assert gemma_270m.spec.family == "gemma3_text" and gemma_270m.spec.n_layers == 18
    assert sorted(frame["layer"].unique()) == list(range(18))
    assert set(frame["reference"]) == {"hf_eager", "sdpa", "transformer_lens"}
    assert frame["passed"].all()
