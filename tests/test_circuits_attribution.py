"""Edge attribution (headlens.circuits.attribution) against its definition: EAP is the derivative of
each edge's path-patching effect in the size of the sender's change. Exact path patching with every
head's z moved a step eps towards zero and away from it (z' = (1 -+ eps) z) gives the central
difference (effect(+eps) - effect(-eps)) / (2 eps), which must equal the same central difference of
EAP's attributions up to O(eps^2). (For a family whose attention output passes a norm before the
residual add, Gemma 3, the sender's write change is not linear in its z, so it is the small step's
attribution that is compared, not the full ablation's.) Checked on every edge into the last layer
and to the logits of a GPT-2 (fused QKV, LayerNorm), a Llama with grouped-query attention (RMSNorm,
each query head's own key and value gradient) and a Gemma 3 (MQA, q/k norms, the norm on the
attention output).
"""

from __future__ import annotations

import copy

import pytest
import torch

from headlens.circuits.attribution import attribution_tensors, edge_agreement, edge_attribution
from headlens.circuits.paths import patch_edges, path_patch
from headlens.errors import ConfigError
from headlens.heads import all_heads
from headlens.intervene.evalset import EvalSet
from headlens.intervene.replace import capture_z
from tests.helpers.families import family_configs

VOCAB = 1000  # small vocabulary: the unembedding stays cheap; ids are built here
# The step of the central difference. The models run in float64, but RMSNorm (Llama, Gemma) normalises in
# float32 whatever the input: effects carry ~1e-7 of float32 noise, ~1e-5 once divided by 2 eps, while the
# truncation error is O(eps^2) ~ 1e-4 relative.
EPS = 1e-2
# Relative to the largest attribution; a wrong head, group, row or norm gives O(1) differences.
FD_RTOL = 1e-2


def _model(name: str):
    from transformers import GPT2Config

    from headlens.load.models import build_model

    if name == "gpt2":
        config = GPT2Config(n_layer=3, n_head=4, n_embd=64, n_positions=64, vocab_size=VOCAB)
    else:
        config = copy.deepcopy(family_configs()[name])
        config.vocab_size = VOCAB
    loaded = build_model(config, seed=0, name=name)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in loaded.model.parameters():
            if param.dim() == 1:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    loaded.model.double()
    return loaded


def _evalset(seed: int = 0) -> EvalSet:
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(10, VOCAB, (3, 8), generator=gen)  # [seq, 8] random tokens, repeated
    ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), half, half], 1)  # [seq, 17]
    counted = torch.zeros(3, 16, dtype=torch.bool)
    counted[:, 9:] = True
    return EvalSet(ids, torch.ones_like(ids, dtype=torch.bool), counted, "repeat", "test", "repeated tokens")


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "gemma3_text-mqa"])
def test_eap_is_the_derivative_of_path_patching(name):
    loaded = _model(name)
    evalset = _evalset()
    n_layers = loaded.spec.n_layers
    zs: list = [None] * n_layers
    capture_z(loaded.model, evalset.input_ids, evalset.mask, None, lambda layer, rows, z: zs.__setitem__(layer, z))
    heads = all_heads(n_layers, loaded.spec.n_heads)
    last = [h for h in heads if h.layer == n_layers - 1]
    vias = ("q", "k", "v", "direct")
    ahead = patch_edges(loaded.model, evalset, [(1 - EPS) * z for z in zs], heads, last, vias)
    back = patch_edges(loaded.model, evalset, [(1 + EPS) * z for z in zs], heads, last, vias)
    plus = attribution_tensors(loaded.model, evalset, [(1 - EPS) * z for z in zs], "eap")
    minus = attribution_tensors(loaded.model, evalset, [(1 + EPS) * z for z in zs], "eap")
    got = {name: (plus[name] - minus[name]) / (2 * EPS) for name in plus}
    index = {"q": 0, "k": 1, "v": 2}
    pairs = []
    for (s, receiver, via), effect in ahead.items():
        if via == "direct":
            estimate = got["direct"][s.layer, s.head]
        else:
            r_layer, r_head = map(int, receiver.split("."))
            estimate = got["edges"][s.layer, s.head, r_layer, r_head, index[via]]
        pairs.append(((effect - back[(s, receiver, via)]) / (2 * EPS), float(estimate)))
    derivative, attribution = torch.tensor(pairs).T
    scale = attribution.abs().max()
    assert scale > 0
    worst = float((derivative - attribution).abs().max() / scale)
    assert worst < FD_RTOL, worst


def test_eap_ig_with_one_step_is_eap_and_more_steps_move_it():
    loaded = _model("llama-gqa")
    evalset = _evalset(1)
    eap = edge_attribution(loaded, evalset, "eap", ablation="mean").frame
    one = edge_attribution(loaded, evalset, "eap-ig", steps=1, ablation="mean").frame
    three = edge_attribution(loaded, evalset, "eap-ig", steps=3, ablation="mean").frame
    assert (eap["attribution"] == one["attribution"]).all()
    assert three["attribution"].notna().all() and not (three["attribution"] == eap["attribution"]).all()
    assert three["attribution_method"].iloc[0] == "eap-ig (3 steps)"


def test_agreement_of_eap_with_exact_patching_is_reported():
    loaded = _model("gpt2")
    evalset = _evalset(2)
    exact = path_patch(loaded, evalset, method="mean").frame
    summary = edge_agreement(exact, edge_attribution(loaded, evalset, "eap", ablation="mean").frame, k=20)
    assert summary["n_edges"] == len(exact) and summary["top_k"] == 20
    assert -1 <= summary["spearman"] <= 1 and 0 <= summary["top_k_recall"] <= 1
    perfect = edge_agreement(exact, exact.assign(attribution=exact["effect"]), k=20)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["top_k_recall"] == 1.0


@pytest.mark.parametrize(
    "kwargs, match", [({"method": "acdc"}, "unknown edge attribution"), ({"method": "eap-ig", "steps": 0}, "steps")]
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        edge_attribution(_model("gpt2"), _evalset(), **kwargs)
