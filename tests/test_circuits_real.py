"""SmolLM2's induction circuit (Olsson et al. 2022): the previous-token heads feed the induction heads
through their keys, measured two ways, each against random sender sets with the same heads per
layer (tests/helpers/circuits_roles.py; p <= 0.01 needs the chosen set above all 100 controls):
1. K-composition from the weights (headlens.circuits.composition);
2. exact path patching of sender -> induction head keys on repeated random tokens, zero ablation
   (headlens.circuits.paths): the loss the key path carries.
Roles come from the heads' attention on repeated random tokens (previous-token and prefix-matching
scores), not from headlens's labels, so the test reads the circuit against an independent definition.
"""

from __future__ import annotations

import pytest

from headlens.circuits.composition import composition_scores
from headlens.circuits.paths import path_patch
from headlens.circuits.tasks import induction_task
from headlens.heads import Head
from tests.helpers.circuits_roles import attention_roles, pair_mean, permutation_p

pytestmark = [pytest.mark.slow, pytest.mark.real]

P_MAX = 0.01


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


@pytest.fixture(scope="module")
def roles(smollm2):
    prev, induction = attention_roles(smollm2)
    if not prev or not induction or min(p.layer for p in prev) >= max(i.layer for i in induction):
        pytest.fail(f"no previous-token head ({prev}) before an induction head ({induction})")
    return prev, induction


def test_previous_token_heads_k_compose_with_the_induction_heads(smollm2, roles):
    prev, induction = roles
    frame = composition_scores(smollm2).frame
    k = frame[frame["via"] == "k"]
    values = dict(zip(zip(k["sender"], k["receiver"], strict=True), k["composition"], strict=True))
    result = permutation_p(values, prev, induction, smollm2.spec.n_heads)
    assert result["chosen"] > result["control_max"], result
    assert result["p_value"] <= P_MAX
    # and far above what random matrices of these shapes give
    assert (
        pair_mean(values, prev, induction)
        > frame["composition_baseline"].iloc[0] + 10 * frame["composition_baseline_std"].iloc[0]
    )


def test_previous_token_heads_feed_the_induction_keys_by_path_patching(smollm2, roles):
    prev, induction = roles
    receivers = sorted(induction)
    layers = sorted({p.layer for p in prev if p.layer < receivers[-1].layer})
    senders = [Head(layer, h) for layer in layers for h in range(smollm2.spec.n_heads)]  # every control's heads
    chosen = [p for p in prev if p.layer in layers]
    task = induction_task(smollm2, n=2, seq_len=12, seed=5)
    frame = path_patch(smollm2, task, senders=senders, receivers=receivers, via=("k",)).frame
    values = dict(zip(zip(frame["sender"], frame["receiver"], strict=True), frame["effect"], strict=True))
    result = permutation_p(values, chosen, receivers, smollm2.spec.n_heads)
    assert result["chosen"] > 0  # cutting the key path raises the loss
    assert result["chosen"] > result["control_max"], result
    assert result["p_value"] <= P_MAX
