"""AtP* at the z site: its plain part equals attribution patching, the planted circuit is ranked
first (where plain attribution gets the previous-token head's sign wrong), and the agreement figures
(`agreement`) equal a rank correlation computed here, which the shipped model's card states."""

from __future__ import annotations

import re

import pytest
import torch

from headlens.ablation.approx import agreement, approx_sweep, spot_check
from headlens.ablation.gradients import atp_star_deltas, attribution_deltas
from headlens.errors import ConfigError
from headlens.files import shipped_path
from headlens.intervene.evalset import repeat_evalset
from headlens.intervene.replace import replacements
from tests.helpers.planted import build_planted

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

# Spearman over n = 8 heads: swapping two neighbouring ranks moves it by 12 / (n (n^2 - 1)) = 0.024; float
# rounding on another processor can swap at most a near tie, so the card's 3-decimal figure is held to that.
N_TINY_HEADS = 8
ONE_SWAP = 12 / (N_TINY_HEADS * (N_TINY_HEADS**2 - 1))


def spearman(x, y) -> float:
    """Spearman's rho as 1 - 6 sum d^2 / (n (n^2 - 1)) on ordinal ranks (no ties among float deltas)."""
    rx = torch.tensor(list(x)).argsort().argsort().double()  # [n]
    ry = torch.tensor(list(y)).argsort().argsort().double()  # [n]
    n = len(rx)
    return float(1 - 6 * ((rx - ry) ** 2).sum() / (n * (n**2 - 1)))


def card_spearman(metric: str, kind: str) -> float:
    """The agreement figure the shipped tiny model's card states (`attribution_spearman METRIC KIND: X`)."""
    card = (shipped_path("tiny") / "README.md").read_text(encoding="utf-8")
    return float(re.search(rf"^attribution_spearman {metric} {re.escape(kind)}: (\S+)$", card, re.M).group(1))


def test_last_layer_heads_get_plain_attribution(strong_model):
    """No later layer reads the last layer's heads: AtP* adds nothing to them; on the first layer
    the QK fix changes the estimate (the later layer's softmax is not linear)."""
    evalset = repeat_evalset(strong_model, seed=2, n_seq=3, seq_len=10)
    reps = replacements(strong_model.model, evalset, "mean", seed=0, batch_size=2)
    plain = attribution_deltas(strong_model.model, evalset, reps)  # [layer, head]
    star = atp_star_deltas(strong_model.model, evalset, reps)  # [layer, head]
    assert torch.allclose(star[1], plain[1], rtol=1e-4, atol=1e-7)
    assert (star[0] - plain[0]).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_atp_star_ranks_the_planted_circuit_first(seed):
    """The planted induction head K-composes with the previous-token head through a saturated
    softmax (tests/helpers/planted.py): plain attribution estimates the previous-token head's effect with
    the wrong sign; AtP*'s QK fix recovers it, and both circuit heads lead its ranking."""

    from headlens.ablation.ablate import sweep_heads

    planted = build_planted(seed)
    circuit = {planted.positions["induction"], planted.positions["previous_token"]}
    exact = sweep_heads(planted.loaded, metric="repeat", seed=seed).frame
    plain = approx_sweep(planted.loaded, metric="repeat", seed=seed, approx="atp").frame.set_index(["layer", "head"])
    star = approx_sweep(planted.loaded, metric="repeat", seed=seed, approx="atp*").frame
    prev = planted.positions["previous_token"]
    assert exact.set_index(["layer", "head"]).loc[prev, "delta"] > 1.0 and plain.loc[prev, "delta_approx"] < 0
    top = star.sort_values("delta_approx", ascending=False).head(2)
    assert {(r.layer, r.head) for r in top.itertuples()} == circuit
    assert agreement(exact, star)["spearman"] > agreement(exact, plain.reset_index())["spearman"]


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["loss", "repeat"])
def test_agreement_is_the_rank_correlation_the_card_states(metric):
    from headlens.ablation.ablate import sweep_heads
    from headlens.load.models import load_model

    tiny = load_model("tiny")
    exact = sweep_heads(tiny, metric=metric, tokens="all").frame  # the card's sweep: every token, as approx_sweep reads
    assert len(exact) == N_TINY_HEADS
    for kind in ("atp", "atp*"):
        approx = approx_sweep(tiny, metric=metric, approx=kind).frame
        merged = exact.merge(approx, on=["layer", "head"])
        assert merged["delta"].nunique() == merged["delta_approx"].nunique() == N_TINY_HEADS  # no exact ties
        rho = spearman(merged["delta"], merged["delta_approx"])
        assert agreement(exact, approx)["spearman"] == pytest.approx(rho, abs=1e-12), kind
        assert abs(card_spearman(metric, kind) - rho) <= ONE_SWAP + 5e-4, (kind, rho)  # + the card's rounding


def test_spot_check_and_errors(strong_model):
    result = spot_check(strong_model, metric="repeat", approx="atp*")
    assert result.kind == "spot_check" and len(result.frame) == 8  # the heads ablated exactly
    assert list(result.frame.columns) == ["layer", "head", "delta", "delta_approx"]
    result = result.meta
    assert result["n_heads"] == 8 and result["n_seq"] == 4  # 8 heads (all of them), the last 4 sequences
    assert -1 <= result["spearman"] <= 1 and 0 <= result["top10_overlap"] <= 1
    with pytest.raises(ConfigError, match="no gradient"):
        approx_sweep(strong_model, metric="needle")
    with pytest.raises(ConfigError, match="unknown --approx"):
        approx_sweep(strong_model, metric="repeat", approx="ig")


def test_graddrop_without_a_drop_is_attribution_and_scores_are_unsigned(strong_model):
    """Nothing dropped, the GradDrop pass is plain attribution patching (a separate implementation);
    last-layer heads score |AtP|; first-layer heads score |AtP with layer 1's write detached|,
    which differs from |AtP| (layer 1's paths are gone)."""
    from headlens.ablation.gradients import _attribution, graddrop_scores

    evalset = repeat_evalset(strong_model, seed=2, n_seq=3, seq_len=10)
    reps = [None, None]
    plain = attribution_deltas(strong_model.model, evalset, reps)  # [layer, head]
    undropped = _attribution(strong_model.model, evalset, slice(0, 3), reps, drop=2) / evalset.n_tokens
    assert torch.allclose(undropped.float(), plain, rtol=1e-4, atol=1e-7)
    scores = graddrop_scores(strong_model.model, evalset, reps)
    assert torch.allclose(scores[1], plain[1].abs(), rtol=1e-4, atol=1e-7)
    assert (scores >= 0).all() and (scores[0] - plain[0].abs()).abs().max() > 1e-3
    frame = approx_sweep(strong_model, metric="repeat", approx="atp", graddrop=True).frame
    assert "graddrop" in frame and (frame.graddrop >= 0).all()


def test_agreement_counts_why_top_heads_are_missed():
    """On 40 heads the exact top 10 are heads 30..39; the estimate flips the sign of three of them
    and shrinks two to a quarter: agreement counts 3 flipped, 2 under half the exact size."""
    import pandas as pd

    delta = [float(i + 1) for i in range(40)]
    approx = list(delta)
    for i in (30, 31, 32):
        approx[i] = -approx[i]
    for i in (33, 34):
        approx[i] = approx[i] / 4
    heads = {"layer": [i // 4 for i in range(40)], "head": [i % 4 for i in range(40)]}
    found = agreement(pd.DataFrame({**heads, "delta": delta}), pd.DataFrame({**heads, "delta_approx": approx}))
    assert found["top_k"] == 10 and found["top_flipped"] == 3 and found["top_under"] == 2
