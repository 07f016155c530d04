"""Edge attribution against exact path patching where the answer is known from the arithmetic.

- Linear model: a Llama with grouped-query attention whose norms are identities and whose MLPs write
  nothing, scored by a logit difference. A direct edge then moves the metric linearly, and so does a
  value edge into the last layer (its receiver's pattern is computed from clean queries and keys, and
  every step after its z is linear), so EAP equals exact patching there, to float64 rounding; query
  and key edges go through the softmax and EAP misses them (the check is not vacuous), while EAP*
  (headlens.circuits.receivers), whose receiver z is exact and only what follows it linear, equals
  exact patching on every edge into the last layer.
- One sender changed: in the model with its RMSNorms, scored by the loss, only one last-layer head's z
  is replaced (every other head's replacement is its own clean z) and the last MLP writes nothing. Its
  only path to the metric is then its direct edge, and integrated gradients along that one change is
  its exact effect, which the test computes with its own
  hooks on the transformers model (the final norm's input moved by the head's write change). EAP, the
  gradient at the clean end, misses it; EAP-IG's Gauss-Legendre points converge to it.
- Counterfactual patching (PATCH): each sender's z is the corrupted run's at the same position (checked
  against a capture of the corrupted sequences one at a time); with a corrupted run equal to the clean
  one, every effect and every attribution, EAP-IG over the input embeddings included, is zero.
"""

from __future__ import annotations

import copy

import pytest
import torch

from headlens.circuits.attribution import attribution_tensors, ig_points
from headlens.circuits.paths import PATCH, counterfactual_replacements, patch_edges, task_replacements
from headlens.circuits.receivers import exact_receiver_tensors
from headlens.heads import all_heads
from headlens.intervene.evalset import EvalSet
from headlens.intervene.replace import capture_z
from tests.helpers.families import family_configs

VOCAB = 1000


def _loaded(linear: bool):
    from headlens.load.models import build_model

    config = copy.deepcopy(family_configs()["llama-gqa"])
    config.vocab_size = VOCAB
    loaded = build_model(config, seed=0, name="llama-gqa")
    model = loaded.model
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
        if linear:
            model.model.norm = torch.nn.Identity()
            for block in model.model.layers:
                block.input_layernorm = torch.nn.Identity()
                block.post_attention_layernorm = torch.nn.Identity()
                block.mlp.down_proj.weight.zero_()
    model.double()
    return loaded


def _evalset(metric: str, seed: int = 0) -> EvalSet:
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(10, VOCAB, (3, 6), generator=gen)  # [seq, 6] random tokens, repeated
    ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), half, half], 1)  # [seq, 13]
    counted = torch.zeros(3, 12, dtype=torch.bool)  # [seq, 12]
    counted[:, 7:] = True
    foils = torch.randint(10, VOCAB, (3, 12), generator=gen) if metric == "logit-diff" else None
    mask = torch.ones_like(ids, dtype=torch.bool)
    return EvalSet(ids, mask, counted, metric, "test", "repeated tokens", foils=foils)


def _estimate(got: dict, sender, receiver: str, via: str) -> float:
    if via == "direct":
        return float(got["direct"][sender.layer, sender.head])
    layer, head = map(int, receiver.split("."))
    return float(got["edges"][sender.layer, sender.head, layer, head, "qkv".index(via)])


def test_eap_and_eap_star_equal_exact_patching_where_the_path_is_linear():
    loaded = _loaded(linear=True)
    evalset = _evalset("logit-diff")
    reps = [None] * loaded.spec.n_layers  # zero ablation
    heads = all_heads(loaded.spec.n_layers, loaded.spec.n_heads)
    last = [h for h in heads if h.layer == loaded.spec.n_layers - 1]
    exact = patch_edges(loaded.model, evalset, reps, heads, last, ("q", "k", "v", "direct"))
    eap = attribution_tensors(loaded.model, evalset, reps, "eap")
    star = exact_receiver_tensors(loaded.model, evalset, reps)
    scale = max(abs(v) for v in exact.values())

    def worst(got, vias):
        return max(abs(_estimate(got, *edge) - v) for edge, v in exact.items() if edge[2] in vias) / scale

    assert worst(eap, ("v", "direct")) < 1e-9
    assert worst(eap, ("q", "k")) > 1e-5  # query and key edges go through the softmax: EAP estimates them
    assert worst(star, ("q", "k", "v", "direct")) < 1e-9  # EAP*'s receiver is exact, the rest linear


def _own_direct_effect(loaded, evalset, head) -> float:
    """The metric's change (mean loss over the counted predictions) when `head`'s write z_h W_O^h is
    taken out of the final norm's input only: plain transformers forward with two hooks."""
    model = loaded.model
    block = model.model.layers[head.layer]
    d_head = loaded.spec.d_head
    cols = slice(head.head * d_head, (head.head + 1) * d_head)
    seen = {}

    def take_z(_module, args):
        seen["z"] = args[0][..., cols]  # [seq, pos, d_head]

    def remove_write(_module, args):
        return (args[0] - seen["z"] @ block.self_attn.o_proj.weight[:, cols].T,)

    def loss(logits):  # [seq, pos, vocab]
        lp = torch.log_softmax(logits[:, :-1], -1)  # [seq, pos - 1, vocab]
        target = evalset.input_ids[:, 1:]  # [seq, pos - 1]
        return -lp.gather(-1, target[..., None])[..., 0][evalset.counted].mean()

    with torch.no_grad():
        clean = loss(model(evalset.input_ids).logits)
        hooks = [block.self_attn.o_proj.register_forward_pre_hook(take_z)]
        hooks.append(model.model.norm.register_forward_pre_hook(remove_write))
        try:
            patched = loss(model(evalset.input_ids).logits)
        finally:
            for hook in hooks:
                hook.remove()
    return float(patched - clean)


def test_eap_ig_converges_to_the_exact_effect_of_one_changed_sender():
    loaded = _loaded(linear=False)
    evalset = _evalset("repeat", seed=3)
    last = loaded.spec.n_layers - 1
    with torch.no_grad():  # the last MLP writes nothing: the sender's one path is its direct edge
        loaded.model.model.layers[last].mlp.down_proj.weight.zero_()
    reps: list = [None] * loaded.spec.n_layers
    capture_z(loaded.model, evalset.input_ids, evalset.mask, None, lambda layer, rows, z: reps.__setitem__(layer, z))
    reps = [z.clone() for z in reps]  # every head replaced by its own clean z: no change ...
    sender = all_heads(loaded.spec.n_layers, loaded.spec.n_heads)[last * loaded.spec.n_heads + 2]
    reps[last][:, :, sender.head] = 0.0  # ... but the sender's, zeroed
    truth = _own_direct_effect(loaded, evalset, sender)
    exact = patch_edges(loaded.model, evalset, reps, [sender], [], ("direct",))
    assert next(iter(exact.values())) == pytest.approx(truth, rel=1e-6)
    errors = {}
    for method, steps in (("eap", 1), ("eap-ig", 2), ("eap-ig", 6)):
        got = attribution_tensors(loaded.model, evalset, reps, method, steps)
        errors[(method, steps)] = abs(float(got["direct"][sender.layer, sender.head]) - truth) / abs(truth)
    assert errors[("eap", 1)] > 1e-2, errors  # the clean gradient alone is off: the check has teeth
    assert errors[("eap-ig", 2)] < errors[("eap", 1)], errors
    # The rest is float32 rounding inside RMSNorm (~1e-7 of the effect) and the quadrature's error,
    # which Gauss-Legendre shrinks fast: 2 -> 6 points must cut it by over 10x.
    assert errors[("eap-ig", 6)] < min(1e-4, errors[("eap-ig", 2)] / 10), errors


def test_gauss_legendre_points_integrate_polynomials_exactly():
    for steps in (1, 3, 5):
        points = ig_points(steps)
        assert sum(w for _, w in points) == pytest.approx(1.0)
        assert all(0 < a < 1 for a, _ in points)
        for degree in range(2 * steps):
            assert sum(w * a**degree for a, w in points) == pytest.approx(1 / (degree + 1))


def _keeper(out: list):
    return lambda layer, rows, z: out.__setitem__(layer, z)


def test_counterfactual_patching_takes_the_corrupted_runs_z_at_each_position():
    loaded = _loaded(linear=False)
    evalset = _evalset("repeat", seed=4)
    gen = torch.Generator().manual_seed(5)
    corrupted = evalset.input_ids.clone()  # [seq, pos]
    corrupted[:, 1:4] = torch.randint(10, VOCAB, (3, 3), generator=gen)
    evalset.reference_ids, evalset.reference_mask = corrupted, evalset.mask
    _, reps = task_replacements(loaded, evalset, PATCH)
    for row in range(3):
        one: list = [None] * loaded.spec.n_layers
        capture_z(loaded.model, corrupted[row : row + 1], evalset.mask[row : row + 1], None, _keeper(one))
        for layer in range(loaded.spec.n_layers):
            torch.testing.assert_close(reps[layer][row], one[layer][0], rtol=0, atol=1e-12)
    evalset.reference_ids = evalset.input_ids.clone()  # a corrupted run equal to the clean one
    same = counterfactual_replacements(loaded.model, evalset)
    heads = all_heads(loaded.spec.n_layers, loaded.spec.n_heads)
    exact = patch_edges(loaded.model, evalset, same, heads, heads, ("q", "k", "v", "direct"))
    # RMSNorm normalises in float32 whatever the model's dtype: ~1e-7 of noise, against effects of ~1e-2
    assert max(abs(v) for v in exact.values()) < 1e-6
    got = attribution_tensors(loaded.model, evalset, same, "eap-ig", 2, corrupted=evalset.input_ids)
    assert float(got["edges"].abs().max()) < 1e-6 and float(got["direct"].abs().max()) < 1e-6
