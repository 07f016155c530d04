"""headlens.circuits.backups: backups of a role found by ablation against random head sets.

Ground truth:
1. a planted model (tests/helpers/planted_backup.py) whose backup head wakes up only when both primary heads are
   ablated, a decoy with the primaries' OV circuit that never does, and random heads: the backup is found at the
   smallest p the controls allow, nothing else is; and with the backup also ablated the repair is gone (the
   model's own loss through plain hooks: the backup causally carries it);
2. the OV similarity against full W_V W_O matrices written out here from the GPT-2 weights;
3. ROC-AUC against the area under the ROC curve by thresholds (another computation of the same number);
4. SmolLM2 (real): 24.4 is among the name movers' backups (REFERENCES.md: it makes up for 23.0-23.2).
"""

from __future__ import annotations

import json

import pytest
import torch

from headlens.circuits.backups import ALPHA, COLUMNS, attach, find_backups, ov_similarity, roc_auc, to_document
from headlens.errors import ConfigError
from headlens.heads import Head
from tests.helpers.planted_backup import BACKUP, DECOY, N_HEADS, PRIMARY, build_planted_backup, planted_task

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def planted():
    return build_planted_backup(0)


@pytest.fixture(scope="module")
def found(planted):
    return find_backups(planted.loaded, planted_task(planted.loaded), role="primary", heads=[Head(*h) for h in PRIMARY])


def test_the_planted_backup_is_found_and_the_decoys_are_not(found):
    frame = found.frame.set_index("head")
    backup = frame.loc["{}.{}".format(*BACKUP)]
    assert found.meta["exact"] and found.meta["controls"] == 28  # every pair of layer 0's 8 heads outside the role
    assert backup["compensation"] > 0.1 * found.meta["lost"]
    assert backup["p_value"] == pytest.approx(found.meta["p_min"]) and backup["p_value"] < ALPHA
    assert found.meta["backups"] == ["{}.{}".format(*BACKUP)]
    assert not frame.loc["{}.{}".format(*DECOY), "backup"]  # same OV circuit, never suppressed
    assert frame["backup"].sum() == 1
    assert list(found.frame.columns) == COLUMNS and len(found.frame) == 2 * N_HEADS - 2
    assert list(found.frame["compensation"]) == sorted(found.frame["compensation"], reverse=True)


def _loss(planted, task, off: list[tuple[int, int]]) -> float:
    """The task's loss with the heads `off` zeroed at c_proj's input, by hooks written here."""
    model, d_head = planted.loaded.model, planted.loaded.spec.d_head

    def zero(heads):
        def hook(_module, args):
            z = args[0].clone()  # [batch, pos, head * d_head]
            for h in heads:
                z[..., h * d_head : (h + 1) * d_head] = 0.0
            return (z,)

        return hook

    layers = sorted({layer for layer, _ in off})
    hooks = [
        model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero([h for l2, h in off if l2 == layer]))
        for layer in layers
    ]
    try:
        with torch.no_grad():
            logits = model(input_ids=task.tokens).logits[:, -1]  # [batch, d_vocab]
    finally:
        for hook in hooks:
            hook.remove()
    return float(torch.nn.functional.cross_entropy(logits, task.tokens[:, 1]))


def test_the_backup_causally_carries_the_repair(planted, found):
    task = planted_task(planted.loaded)
    clean, primaries = _loss(planted, task, []), _loss(planted, task, list(PRIMARY))
    both = _loss(planted, task, [*PRIMARY, BACKUP])
    assert found.meta["total_effect"] == pytest.approx(primaries - clean, abs=1e-4)  # the library's own run
    assert both - primaries > 1.0  # without the backup, the loss the primaries' absence costs is far larger
    assert _loss(planted, task, [BACKUP]) - clean < 0.05  # with the primaries present the backup sleeps


def test_ov_similarity_equals_the_full_matrices(planted):
    model, d_head = planted.loaded.model, planted.loaded.spec.d_head
    d_model = model.config.n_embd
    centre = torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model  # LayerNorm's centring, folded in

    def w_ov(layer: int, head: int) -> torch.Tensor:
        attn = model.transformer.h[layer].attn
        cols = slice(2 * d_model + head * d_head, 2 * d_model + (head + 1) * d_head)
        v = centre @ attn.c_attn.weight[:, cols].detach().double()  # [d_model, d_head], ln_1's gain is 1
        o = attn.c_proj.weight[head * d_head : (head + 1) * d_head].detach().double() @ centre  # [d_head, d_model]
        return v @ o  # [d_model, d_model]

    ref = sum(w_ov(*h) for h in PRIMARY)
    got = ov_similarity(planted.loaded, [Head(*h) for h in PRIMARY])
    for layer in range(2):
        for head in range(8):
            m = w_ov(layer, head)
            want = abs(float((m * ref).sum() / (m.norm() * ref.norm())))
            assert float(got[layer, head]) == pytest.approx(want, rel=1e-6, abs=1e-9)


def _auc_by_thresholds(scores, positives) -> float:
    """The area under the ROC curve, by the trapezoid rule over every threshold."""
    n_pos, n_neg = sum(positives), len(positives) - sum(positives)
    points = [(0.0, 0.0)]
    for cut in sorted(set(scores), reverse=True):
        tp = sum(1 for s, p in zip(scores, positives, strict=True) if p and s >= cut)
        fp = sum(1 for s, p in zip(scores, positives, strict=True) if not p and s >= cut)
        points.append((fp / n_neg, tp / n_pos))
    return sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False))


def test_roc_auc_is_the_area_under_the_roc_curve():
    gen = torch.Generator().manual_seed(0)
    for n in (5, 12, 40):
        scores = torch.randint(0, 6, (n,), generator=gen).tolist()  # ties on purpose
        positives = (torch.rand(n, generator=gen) < 0.4).tolist()
        positives[0], positives[1] = True, False
        assert roc_auc(scores, positives) == pytest.approx(_auc_by_thresholds(scores, positives))
    assert roc_auc([1.0, 2.0], [True, True]) is None


def test_the_document_is_json_and_labels_the_backups(found):
    document = to_document(found)
    assert json.loads(json.dumps(document)) == document
    circuit = {"heads": [{"head": h, "labels": []} for h in ("1.0", "1.1")]}
    attached = attach(circuit, found)
    assert attached["heads"][0]["labels"] == ["backup_primary"] and attached["heads"][1]["labels"] == []
    assert attached["backups"]["backups"] == ["1.0"]


def test_no_role_head_is_a_config_error(planted):
    task = planted_task(planted.loaded, n=2)
    with pytest.raises(ConfigError, match="no head is labelled"):
        find_backups(planted.loaded, task, labels={}, role="name_mover")
    with pytest.raises(ConfigError, match="control"):
        find_backups(planted.loaded, task, heads=[Head(0, 0)], role="primary", controls=0)


@pytest.fixture(scope="module")
def smollm2_backups(real_model):
    """The name movers' backups on SmolLM2's 48 IOI prompts (zero ablation, 39 same-layer controls)."""
    from headlens.circuits.tasks import ioi_task
    from headlens.classify.cache import cached_classification
    from headlens.classify.roles import frame_labels

    smollm2 = real_model("smollm2")
    return find_backups(smollm2, ioi_task(smollm2), frame_labels(cached_classification(smollm2)))


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_24_4_makes_up_most_for_the_name_movers(smollm2_backups):
    """REFERENCES.md (transformers only): zeroing 23.0-23.2, 24.4 rises most (+0.55 there on its prompts)."""
    assert smollm2_backups.meta["ablated"] == ["23.0", "23.1", "23.2"]
    assert smollm2_backups.frame["head"].iloc[0] == "24.4"
    assert smollm2_backups.frame["compensation"].iloc[0] > 0.3 * smollm2_backups.meta["lost"]


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_24_4_is_a_backup_of_the_name_movers(smollm2_backups):
    """The issue's ground truth: 24.4 is among the name movers' backups (compensation and p < 0.05), against
    every set of 3 of layer 23's other 6 heads (20 sets: p can be no smaller than 1/21)."""
    assert smollm2_backups.meta["exact"] and smollm2_backups.meta["controls"] == 20
    assert "24.4" in smollm2_backups.meta["backups"]


def test_outside_controls_share_no_head_with_the_role():
    from headlens.intervene.stats import control_design

    role = [Head(23, 0), Head(23, 1), Head(23, 2)]
    every = control_design(role, 9, 39, 0, outside=True)  # C(6, 3) = 20 sets of the 6 other heads: all taken
    assert every["exact"] and every["n_possible"] == 20 and len({tuple(s) for s in every["sets"]}) == 20
    assert all(len(s) == 3 and {h.layer for h in s} == {23} and not set(s) & set(role) for s in every["sets"])
    pair = [Head(0, 1), Head(2, 3)]
    drawn = control_design(pair, 12, 20, 3, outside=True)  # 11 x 11 = 121 possible: 20 drawn
    assert not drawn["exact"] and drawn["n_possible"] == 121 and len({tuple(s) for s in drawn["sets"]}) == 20
    assert all([h.layer for h in s] == [0, 2] and not set(s) & set(pair) for s in drawn["sets"])
    assert control_design(role[:3], 4, 39, 0, outside=True)["sets"] == []  # one other head: no set of 3
