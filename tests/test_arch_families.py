"""Every supported family through one adapter: capture, z, one layer run, ablation, sweep.

Ground truth is independent of headlens.arch: Hugging Face eager `output_attentions`, forward
hooks written here on the Hugging Face module names (tests/helpers/families.py), and the model's own
decoder layers.
"""

from __future__ import annotations

import pytest
import torch

from headlens.arch import adapter_for
from headlens.capture import Batch, CollectPatterns, run_capture
from headlens.capture import lean as capture_lean
from headlens.heads import all_heads
from headlens.intervene.evalset import repeat_evalset
from headlens.intervene.replace import replacements
from headlens.intervene.sums import ablated_sums, base_sums, sweep_sums
from tests.helpers.families import FAMILY_NAMES, build_family, decoder_layers, o_proj, padded_batch

# float32 attention recomputed in another order (sdpa forward + our softmax, or hooks vs the
# model's own path) differs by rounding only, ~1e-7 here; a wrong mask or rotation gives >= 1e-2.
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request):
    return build_family(request.param)


def _hf_eager(model, ids, mask):
    """Per layer: HF eager attention weights [batch, head, q_pos, k_pos] and o_proj inputs z."""
    zs, handles = {}, []
    for layer in range(model.config.num_hidden_layers):

        def keep(module, args, layer=layer):
            zs[layer] = args[0].detach().clone()  # [batch, pos, head * d_head]

        handles.append(o_proj(model, layer).register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    return out.attentions, zs, out.logits


def test_shape_facts_and_kv_groups(family):
    adapter = adapter_for(family.model)
    cfg = family.model.config
    assert adapter.n_heads == cfg.num_attention_heads
    assert adapter.n_kv_heads == getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    groups = [adapter.kv_group(h) for h in range(adapter.n_heads)]
    per_group = adapter.n_heads // adapter.n_kv_heads
    assert groups == [h // per_group for h in range(adapter.n_heads)]  # consecutive query heads share K/V
    assert family.spec.n_kv_heads == adapter.n_kv_heads and family.spec.family == cfg.model_type
    assert adapter.w_o(0).shape == (adapter.n_heads, adapter.d_head, adapter.d_model)


class CollectBlocks(CollectPatterns):
    """CollectPatterns that also takes the lean path's blocks of query rows (kept in order)."""

    row_blocks = True

    def update(self, layer, batch, pattern=None, z=None, q_start=0):
        super().update(layer, batch, pattern=pattern, z=z)


@pytest.mark.parametrize("lean", [False, True])
def test_patterns_and_z_equal_hf_eager(family, lean, monkeypatch):
    """Both capture paths: per query head, patterns equal `output_attentions`, z the o_proj input."""
    ids, mask = padded_batch()
    attentions, zs, _ = _hf_eager(family.model, ids, mask)
    monkeypatch.setattr(capture_lean, "BLOCK_ELEMENTS", 3 * 8 * 6 * 20)  # blocks of 6 or 12 rows of 20
    collect = CollectBlocks(wants=("pattern", "z"))
    run_capture(family.model, [Batch(ids, mask)], [collect], recompute_patterns=lean)
    spec = family.spec
    real = mask[:, None, :, None]  # [batch, 1, q_pos, 1]: padded query rows are not compared
    for layer in range(spec.n_layers):
        blocks = collect.patterns[layer]
        assert len(blocks) > 1 if lean else len(blocks) == 1
        pattern = torch.cat(blocks, dim=2)  # [batch, head, q_pos, k_pos]
        assert pattern.shape == (3, spec.n_heads, 20, 20)
        assert ((pattern - attentions[layer]).abs() * real).amax() <= ATOL, layer
        z = collect.zs[layer][0]
        assert z.shape == (3, 20, spec.n_heads, spec.d_head)
        if lean:  # sdpa ran the model: its z rounds differently from eager's
            assert ((z.reshape(3, 20, -1) - zs[layer]).abs() * mask[..., None]).amax() <= ATOL
        else:
            assert torch.equal(z.reshape(3, 20, -1), zs[layer])  # the very tensor the o_proj received


def test_sliding_window_is_respected(family):
    adapter = adapter_for(family.model)
    ids, mask = padded_batch()
    attentions, _, _ = _hf_eager(family.model, ids, mask)
    windows = [adapter.sliding_window(layer) for layer in range(adapter.n_layers)]
    expected = {"mistral-window": [7, 7, 7], "qwen2-window": [None, 6, 6], "gemma3_text-mqa": [5, 5, None, 5]}.get(
        family.name, [None] * len(windows)
    )
    assert windows == expected
    for layer, window in enumerate(windows):
        if window is not None:  # no weight on keys window or more positions back
            q, k = torch.meshgrid(torch.arange(20), torch.arange(20), indexing="ij")
            outside = ((q - k) >= window)[None, None] & mask[:, None, :, None]  # [batch, 1, q_pos, k_pos], real rows
            assert (attentions[layer] * outside).abs().max() == 0


def test_a_layer_run_by_the_adapter_equals_the_models_own_layer(family):
    model = family.model
    ids, mask = padded_batch()
    seen, handles = {}, []
    for layer, block in enumerate(decoder_layers(model)):
        handles.append(
            block.register_forward_pre_hook(
                lambda m, args, kwargs, layer=layer: seen.__setitem__(("in", layer), args[0].detach().clone()),
                with_kwargs=True,
            )
        )
        handles.append(
            block.register_forward_hook(
                lambda m, args, out, layer=layer: seen.__setitem__(
                    ("out", layer), (out[0] if isinstance(out, tuple) else out).detach().clone()
                )
            )
        )
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask.long()).logits
    finally:
        for handle in handles:
            handle.remove()
    adapter = adapter_for(model)
    ctx = adapter.context(ids, mask)
    real = mask[:, :, None]
    last = adapter.n_layers - 1
    with torch.no_grad():
        assert torch.equal(adapter.embed_tokens(ctx), seen[("in", 0)])
        for layer in range(adapter.n_layers):
            ours = adapter.block(layer, seen[("in", layer)], ctx)  # [batch, pos, d_model]
            assert ((ours - seen[("out", layer)]).abs() * real).amax() <= ATOL, layer
        _, attn_out = adapter.attention(0, seen[("in", 0)], ctx)  # [batch, pos, d_model]
        final = adapter.run_from(0, seen[("in", 0)], attn_out, ctx)  # [batch, pos, d_model]
        assert ((final - seen[("out", last)]).abs() * real).amax() <= ATOL
        ours_logits = adapter.unembed()(adapter.final_norm()(seen[("out", last)]))  # [batch, pos, d_vocab]
    assert ((ours_logits - logits).abs() * real).amax() <= ATOL


def test_zero_ablation_equals_an_independent_hook_on_the_output_projection(family):
    """ablated_sums with two heads zeroed == the HF forward with those z slices zeroed by hand."""
    model, spec = family.model, family.spec
    evalset = repeat_evalset(family, seed=2, n_seq=3, seq_len=8)
    heads = [all_heads(spec.n_layers, spec.n_heads)[i] for i in (1, spec.n_heads + spec.n_heads - 1)]
    ours = ablated_sums(model, evalset, heads, [None] * spec.n_layers)  # [n_units]
    d_head = spec.d_head

    def zero_slice(head):
        def hook(module, args):
            z = args[0].clone()  # [batch, pos, head * d_head]
            z[..., head * d_head : (head + 1) * d_head] = 0
            return (z,)

        return hook

    handles = [o_proj(model, h.layer).register_forward_pre_hook(zero_slice(h.head)) for h in heads]
    try:
        with torch.no_grad():
            logits = model(input_ids=evalset.input_ids, attention_mask=evalset.mask.long()).logits
    finally:
        for handle in handles:
            handle.remove()
    logp = torch.log_softmax(logits[:, :-1], -1)  # [n_seq, pos-1, d_vocab]
    losses = -logp.gather(-1, evalset.input_ids[:, 1:, None])[..., 0]  # [n_seq, pos-1]
    scored = evalset.counted  # [n_seq, pos-1]; ablated_sums sums per bootstrap unit (token blocks here)
    expected = torch.zeros(evalset.n_units, dtype=torch.float64).index_add(
        0, evalset.units[scored], losses[scored].double()
    )  # [n_units]
    assert (ours - expected).abs().max() <= ATOL * evalset.counted.sum(-1).max()
    base = ablated_sums(model, evalset, [], [None] * spec.n_layers)
    assert (ours - base).abs().max() > 1e-3  # the ablation did something


@pytest.mark.parametrize(
    "method", ["zero", pytest.param("mean", marks=pytest.mark.slow), pytest.param("resample", marks=pytest.mark.slow)]
)
def test_exact_sweep_equals_the_naive_loop(family, method):
    model, spec = family.model, family.spec
    evalset = repeat_evalset(family, seed=1, n_seq=5, seq_len=10)
    reps = replacements(model, evalset, method, seed=3, batch_size=4)
    heads = all_heads(spec.n_layers, spec.n_heads)
    base_naive = ablated_sums(model, evalset, [], reps)
    base_fast = base_sums(model, evalset)
    found = {}
    sweep_sums(model, evalset, heads, reps, lambda h, s: found.update({h: s}))
    biggest = 0.0
    for head in heads:
        naive = float((ablated_sums(model, evalset, [head], reps) - base_naive).sum() / evalset.n_tokens)
        fast = float((found[head] - base_fast).sum() / evalset.n_tokens)
        assert abs(fast - naive) <= ATOL, head
        biggest = max(biggest, abs(naive))
    assert biggest > 100 * ATOL  # the heads matter enough for the comparison to mean something


def test_stacked_sweep_on_a_padded_batch_equals_the_naive_loop(family):
    """Three heads per pass (the batch stacked as copies: masks, sliding windows and rotary
    cos/sin broadcast over copies), batches of 2, right-padded sequences."""
    from headlens.intervene.evalset import EvalSet

    model, spec = family.model, family.spec
    ids, mask = padded_batch(seed=5)
    evalset = EvalSet(ids, mask, mask[:, 1:] & mask[:, :-1], "loss", "padded", "right-padded random tokens")
    reps = [None] * spec.n_layers
    heads = all_heads(spec.n_layers, spec.n_heads)
    base_naive, base_fast = ablated_sums(model, evalset, [], reps), base_sums(model, evalset, batch_size=2)
    found = {}
    sweep_sums(model, evalset, heads, reps, lambda h, s: found.update({h: s}), batch_size=2, heads_per_pass=3)
    for head in heads:
        naive = float((ablated_sums(model, evalset, [head], reps) - base_naive).sum() / evalset.n_tokens)
        assert abs(float((found[head] - base_fast).sum() / evalset.n_tokens) - naive) <= ATOL, head


# Errors


def test_an_unsupported_model_type_is_one_line_naming_the_supported_families(tmp_path):
    from click.testing import CliRunner
    from transformers import BertConfig

    from headlens.arch import SUPPORTED_TYPES
    from headlens.cli.main import cli
    from headlens.errors import UnsupportedModelError
    from headlens.load.models import build_model

    with pytest.raises(UnsupportedModelError) as info:
        build_model(BertConfig(num_hidden_layers=1))
    message = str(info.value)
    assert "\n" not in message and "'bert' is not supported" in message
    assert all(name in message for name in ("gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"))
    assert set(SUPPORTED_TYPES) == {"gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"}
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    result = CliRunner().invoke(cli, ["heads", "all", "--model", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'bert' is not supported" in lines[0] and "qwen3" in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_hook_qkv_hands_over_what_the_attention_multiplies(family, monkeypatch):
    """q, k, v from the adapter equal, bit for bit, the tensors the family's eager attention
    function receives (after rotary and q/k norm; keys and values before repeat_kv)."""
    import sys

    model = family.model
    adapter = adapter_for(model)
    module = sys.modules[type(adapter.attn(0)).__module__]
    original = module.eager_attention_forward
    received = []

    def spy(attn_module, query, key, value, *args, **kwargs):
        received.append((query.detach().clone(), key.detach().clone(), value.detach().clone()))
        return original(attn_module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", spy)
    handed = []
    handles = [
        h
        for layer in range(adapter.n_layers)
        for h in adapter.hook_qkv(layer, lambda q, k, v: handed.append((q, k, v)))
    ]
    ids, mask = padded_batch()
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask.long())
    finally:
        for handle in handles:
            handle.remove()
    assert len(received) == len(handed) == adapter.n_layers
    for (q, k, v), (q_ref, k_ref, v_ref) in zip(handed, received, strict=True):
        assert q.shape == (3, adapter.n_heads, 20, adapter.d_head) and k.shape[1] == adapter.n_kv_heads
        assert torch.equal(q, q_ref) and torch.equal(k, k_ref) and torch.equal(v, v_ref)
