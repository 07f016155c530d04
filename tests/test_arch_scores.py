"""Scores, attribution, pruning, classification and `headlens heads` on every family.

Peers: TransformerLens `detect_head` on a bridge of the same model (attention scores), plain
torch on the Hugging Face modules (copying, attribution), HF's own loss (pruning).
"""

from __future__ import annotations

import math

import pytest
import torch

from headlens.ablation.gradients import attribution_deltas
from headlens.ablation.prune import prune_curve
from headlens.capture import CollectPatterns, iter_batches, run_capture
from headlens.intervene.evalset import repeat_evalset, text_evalset
from headlens.intervene.metrics import token_losses
from headlens.load.models import boot_bridge
from headlens.scores.copying import CopyingReducer
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.positional import prev_token_reducer
from headlens.validate import BUILTIN_TEXT
from tests.helpers.families import FAMILY_NAMES, build_family, decoder_layers, o_proj

# Both sides read the same float32 attention; sums over <= 64 x 64 entries differ by rounding only.
PARITY_ATOL = 1e-4
# Gradients from our gate and from retain_grad on the same float32 model: rounding only.
GRAD_RTOL = 1e-4
SAME_LOSS_ATOL = 1e-5  # mean losses from the same float32 forward pass computed two ways

PROMPTS = [
    "The keeper climbed the stairs and trimmed the wick before the storm.",
    "red kettle, seven lanterns, a brass spyglass near the eyepiece. " * 2,
    "Alpha beta gamma delta epsilon zeta eta theta. " * 3,
]

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request):
    return build_family(request.param)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, make",
    [
        ("previous_token_head", prev_token_reducer),
        ("duplicate_token_head", duplicate_token_reducer),
        ("induction_head", prefix_matching_reducer),
    ],
)
def test_attention_scores_equal_detect_head(family, name, make):
    from transformer_lens.head_detector import detect_head

    bridge = boot_bridge(family)
    expected = detect_head(bridge, PROMPTS, name)  # [n_layers, n_heads], mean over prompts
    sequences = [bridge.to_tokens(p)[0].tolist() for p in PROMPTS]
    reducer = make(family.spec.n_layers, family.spec.n_heads)
    run_capture(family.model, iter_batches(sequences, batch_size=2, pad_id=0), [reducer])  # padded batches
    assert reducer.mul_score().shape == expected.shape
    assert torch.allclose(reducer.mul_score(), expected.float(), atol=PARITY_ATOL), (reducer.mul_score(), expected)
    assert expected.abs().sum() > 0


def _final_norm_gain(model) -> tuple[torch.Tensor, bool]:
    """(gain, centres): GPT-NeoX ends in a LayerNorm, the Llama-style families in an RMSNorm,
    Gemma 3 in an RMSNorm that multiplies by 1 + weight."""
    if model.config.model_type == "gpt_neox":
        return model.gpt_neox.final_layer_norm.weight.detach(), True
    if model.config.model_type == "gemma3_text":
        return 1 + model.model.norm.weight.detach(), False
    return model.model.norm.weight.detach(), False


def _attn_out_gain(model, layer: int) -> torch.Tensor | float:
    """Gemma 3 normalises the attention output before the residual add; its 1/rms is common to
    every logit (dropped, like the final norm's), its gain (1 + weight) is on the direct path."""
    if model.config.model_type == "gemma3_text":
        return 1 + model.model.layers[layer].post_attention_layernorm.weight.detach()
    return 1.0


def test_copying_equals_the_direct_path_through_the_whole_vocabulary(family):
    """Per scored query: full direct-path logits (z_h W_O^h -> final-norm gain -> W_U) over every
    token, the attended token's standard score, erf(s / sqrt 2); averaged per head."""
    model, spec = family.model, family.spec
    tokens = torch.randint(1000, 10000, (3, 8), generator=torch.Generator().manual_seed(4))
    tokens = torch.cat([torch.full((3, 1), 50256), tokens, tokens, tokens], dim=1)  # [n_seq, 25]
    scored = lambda b: prefix_matching_targets(b.input_ids).any(-1)  # noqa: E731
    copying = CopyingReducer(model, scored)
    collect = CollectPatterns(wants=("pattern", "z"))
    run_capture(model, iter_batches(tokens, 3), [copying])
    run_capture(model, iter_batches(tokens, 3), [collect])
    gain, centres = _final_norm_gain(model)
    w_u = model.lm_head.weight.detach()  # [d_vocab, d_model]
    queries = scored(next(iter_batches(tokens, 3)))  # [n_seq, pos]
    expected = torch.zeros(spec.n_layers, spec.n_heads)
    for layer in range(spec.n_layers):
        pattern, z = collect.patterns[layer][0], collect.zs[layer][0]  # [b, head, q, k], [b, pos, head, d_head]
        w_o = o_proj(model, layer).weight.detach()  # [d_model, head * d_head]
        for head in range(spec.n_heads):
            cols = w_o[:, head * spec.d_head : (head + 1) * spec.d_head]  # [d_model, d_head]
            scores = []
            for b, q in queries.nonzero().tolist():
                key = int(pattern[b, head, q, 1:].argmax()) + 1  # BOS column excluded
                out = (cols @ z[b, q, head]) * _attn_out_gain(model, layer)  # [d_model]
                u = (out - out.mean() if centres else out) * gain  # [d_model]
                logits = w_u @ u  # [d_vocab]
                s = (logits[tokens[b, key]] - logits.mean()) / logits.std(unbiased=False)
                scores.append(math.erf(float(s) / math.sqrt(2)))
            expected[layer, head] = sum(scores) / len(scores)
    assert torch.allclose(copying.result(), expected, atol=PARITY_ATOL), (copying.result(), expected)
    assert expected.abs().max() > 0.05  # some head's output moves its attended token's logit


def test_attribution_equals_minus_grad_dot_z(family):
    """Peer: z kept with retain_grad at the output projection (hooks written here), plain backward."""
    model, spec = family.model, family.spec
    evalset = repeat_evalset(family, seed=2, n_seq=3, seq_len=10)
    ours = attribution_deltas(model, evalset, [None] * spec.n_layers)  # [layer, head]
    kept = {}

    def keep(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:-1], spec.n_heads, spec.d_head)  # [batch, pos, head, d_head]
            z.retain_grad()
            kept[layer] = z
            return (z.reshape(args[0].shape),)

        return hook

    handles = [o_proj(model, layer).register_forward_pre_hook(keep(layer)) for layer in range(spec.n_layers)]
    try:
        logits = model(input_ids=evalset.input_ids).logits  # [n_seq, pos, d_vocab]
        losses = token_losses(logits, evalset.input_ids, evalset.mask)[evalset.counted]
        losses.mean().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    theirs = torch.stack([-(kept[i].grad * kept[i]).sum((0, 1, 3)) for i in range(spec.n_layers)])  # [layer, head]
    assert torch.allclose(ours, theirs.detach(), rtol=GRAD_RTOL, atol=1e-7)
    assert theirs.abs().max() > 1e-3


@pytest.mark.slow
def test_prune_curve_ends_match_hugging_face(family):
    text = " ".join([BUILTIN_TEXT] * 6)
    curve = prune_curve(family, text=text, step_fraction=0.5).frame
    assert curve.n_removed.iloc[-1] == family.spec.n_layers * family.spec.n_heads
    windows = text_evalset(family, text)  # prune_curve scores the even windows (odd ones rank the heads)
    ids, mask = windows.input_ids[0::2], windows.mask[0::2]
    labels = ids.masked_fill(~mask, -100)
    model = family.model
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    assert abs(curve.loss.iloc[0] - float(hf)) < SAME_LOSS_ATOL
    handles = [
        o_proj(model, layer).register_forward_pre_hook(lambda m, a: (torch.zeros_like(a[0]),))
        for layer in range(len(decoder_layers(model)))
    ]
    try:
        with torch.no_grad():
            zeroed = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    finally:
        for handle in handles:
            handle.remove()
    assert abs(curve.loss.iloc[-1] - float(zeroed)) < SAME_LOSS_ATOL


@pytest.mark.slow
def test_classify_reports_each_query_heads_key_value_group():
    from headlens.classify import ClassifyConfig, classify_heads

    loaded = build_family("llama-gqa")
    frame = classify_heads(loaded, " ".join([BUILTIN_TEXT] * 4), ClassifyConfig(n_seq=2, max_windows=2)).frame
    assert list(frame.columns[:4]) == ["layer", "head", "labels", "kv_group"]
    assert frame["kv_group"].tolist() == [h // 4 for h in frame["head"]]  # 8 query heads over 2 kv heads
    assert frame["copying_score"].notna().all()


def test_heads_command_lists_key_value_groups(tmp_path):
    from click.testing import CliRunner

    from headlens.cli.main import cli
    from headlens.load.models import save_model

    directory = save_model(build_family("llama-mqa"), tmp_path / "mqa")
    result = CliRunner().invoke(cli, ["heads", "layer:1,0.2", "--model", str(directory)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["0.2,1.0,1.1,1.2,1.3", "kv_group 0.0: 0.2", "kv_group 1.0: 1.0,1.1,1.2,1.3"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, window, layers", [("mistral-window", 7, [0, 1, 2]), ("qwen2-window", 6, [1, 2]), ("llama-gqa", None, None)]
)
def test_classify_says_when_probes_reach_past_a_sliding_window(name, window, layers):
    """The narrowest window and the layers that have it come from the config; every probe here is
    longer than 7 tokens, so the probes are not inside the window."""
    from headlens.classify import ClassifyConfig, classify_heads

    loaded = build_family(name)
    heads = classify_heads(loaded, " ".join([BUILTIN_TEXT] * 4), ClassifyConfig(n_seq=2, max_windows=2))
    reach = heads.meta["probes"]["sliding_window"]
    if window is None:
        assert reach is None
        return
    assert (reach["window"], reach["layers"], reach["probes_inside"]) == (window, layers, False)
    assert reach["longest_probe"] > window
