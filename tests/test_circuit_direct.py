"""headlens.circuits.direct and selfrepair on random-weight models of every family shape: the direct effects
add up to the metric's linear part read from the model's own logits; the heads' IOI direct effects are
name_mover's (checked against frozen-norm ablations in tests/test_direct_logit.py); an ablation's total
effect is the model run with the heads' o_proj input zeroed by a hook here; the accounting closes."""

from __future__ import annotations

import json

import pytest
import torch

from headlens.circuits.direct import decompose
from headlens.circuits.selfrepair import replacement_for, self_repair
from headlens.circuits.tasks import induction_task, ioi_task
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.load.models import gpt2_tokenizer
from headlens.scores.name_mover import ioi_run
from tests.helpers.families import build_family, o_proj
from tests.helpers.strong import build_strong_model

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

FAMILIES = ["llama-gqa", "gemma3_text-mqa", "gpt_neox-parallel"]
# float32 forward passes of a few layers, logits of a few units, sums taken in float64: 1e-4 logits
ATOL = 1e-4


@pytest.fixture(scope="module", params=["gpt2", *FAMILIES])
def model(request):
    # gpt2: LayerNorm with biases, Conv1D projections, learned positions; weights large enough to move logits
    loaded = build_strong_model(n_positions=64) if request.param == "gpt2" else build_family(request.param, seed=3)
    loaded.tokenizer = gpt2_tokenizer()
    return loaded


def _logits(loaded, tokens, mask, heads_off=()) -> torch.Tensor:
    """The model's logits [batch, pos, d_vocab] with `heads_off` zeroed at their output projection's input."""
    model, d_head = loaded.model, loaded.spec.d_head
    handles = []
    for layer in {h.layer for h in heads_off}:
        mine = [h.head for h in heads_off if h.layer == layer]

        def zero(module, args, mine=mine):
            z = args[0].clone()  # [batch, pos, head * d_head]
            for head in mine:
                z[..., head * d_head : (head + 1) * d_head] = 0.0
            return (z,)

        module = model.transformer.h[layer].attn.c_proj if model.config.model_type == "gpt2" else o_proj(model, layer)
        handles.append(module.register_forward_pre_hook(zero))
    try:
        with torch.no_grad():
            return model(input_ids=tokens, attention_mask=mask.long()).logits.double()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("task_name", ["induction", "ioi"])
def test_the_direct_effects_add_up_to_the_metric_the_logits_give(model, task_name):
    task = induction_task(model, n=3, seq_len=8) if task_name == "induction" else ioi_task(model, n=6)
    found = decompose(model, task, batch=2)  # several batches: their read positions stay in order
    logits = _logits(model, task.tokens, task.mask)
    assert found.logit_metric == pytest.approx(float(task.logit_metric(logits)), abs=ATOL)
    assert found.metric == pytest.approx(float(task.metric(logits)), abs=ATOL)
    assert found.total == pytest.approx(float(task.logit_metric(logits)), abs=ATOL)
    assert found.heads.abs().max() > 100 * ATOL  # the heads write something: not 0 == 0
    assert set(found.rest) >= {"embeddings", "MLP 0", "attention bias 0", "biases"}


def test_ioi_head_direct_effects_are_name_movers(model):
    task = ioi_task(model, n=6)
    found = decompose(model, task)
    assert torch.allclose(found.heads, ioi_run(model, task.prompts)["ioi_direct_effect"].double(), atol=ATOL)


def test_a_zero_ablation_costs_what_the_model_with_those_heads_zeroed_gives(model):
    task = ioi_task(model, n=6)
    heads = [Head(0, 1), Head(1, 0)]
    repair = self_repair(model, task, heads, "zero")
    assert repair.kind == "self_repair"
    figures = repair.meta
    ablated = float(task.metric(_logits(model, task.tokens, task.mask, heads_off=heads)))
    clean = float(task.metric(_logits(model, task.tokens, task.mask)))
    assert figures["total_effect"] == pytest.approx(ablated - clean, abs=ATOL)
    assert figures["clean_metric"] == pytest.approx(clean, abs=ATOL)
    assert figures["ablated_metric"] == pytest.approx(ablated, abs=ATOL)
    assert figures["direct_effect_ablated"] == 0.0  # a zeroed head writes nothing
    own = decompose(model, task)
    assert figures["direct_effect"] == pytest.approx(sum(own.head(h) for h in heads))
    table = repair.frame
    assert len(table) == model.spec.n_layers * model.spec.n_heads - len(heads)
    assert not set(table["head"]) & {str(h) for h in heads}
    assert list(table["change"].abs()) == sorted(table["change"].abs(), reverse=True)
    # the accounting closes: the set's own change + every other head's + the rest's = the linear metric's change
    own_change = figures["direct_effect_ablated"] - figures["direct_effect"]
    closes = own_change + table["change"].sum() + figures["rest_change"]
    assert closes == pytest.approx(figures["logit_total_effect"], abs=ATOL)
    assert json.loads(repair.to_json())["meta"] == figures  # JSON-ready


def test_resample_takes_the_corrupted_runs_z_and_mean_one_vector(small_model):
    task = ioi_task(small_model, n=4)
    head = Head(1, 2)
    seen = {}
    hook = small_model.model.transformer.h[1].attn.c_proj.register_forward_pre_hook(
        lambda m, args: seen.__setitem__("z", args[0].detach().clone())
    )
    try:
        with torch.no_grad():
            small_model.model(input_ids=task.corrupted, attention_mask=task.mask.long())
    finally:
        hook.remove()
    d_head = small_model.spec.d_head
    expected = seen["z"][..., 2 * d_head : 3 * d_head]  # [batch, pos, d_head]
    got = replacement_for(small_model, task, [head], "resample")[head]
    assert torch.allclose(got[task.mask], expected[task.mask], atol=1e-5)
    mean = replacement_for(small_model, task, [head], "mean")[head]
    assert mean.shape == (1, 1, d_head)
    assert torch.allclose(mean[0, 0], expected[task.mask].mean(0), atol=1e-5)  # over the ABC run's real positions


def test_bad_ablations_are_config_errors(small_model):
    task = ioi_task(small_model, n=2)
    with pytest.raises(ConfigError, match="outside"):
        self_repair(small_model, task, [Head(9, 0)])
    with pytest.raises(ConfigError, match="no head"):
        self_repair(small_model, task, [])
    with pytest.raises(ConfigError, match="method"):
        self_repair(small_model, task, [Head(0, 0)], "noise")
