"""AblateSpec (headlens.ablation.request): the checks on combinations of flags, made before a model loads, and
run_ablation, the one entry point `headlens ablate` calls, dispatching to the set ablation, the sweep and the
gradient estimate."""

from __future__ import annotations

import pytest

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.ablation.approx import approx_sweep
from headlens.ablation.request import AblateSpec, run_ablation
from headlens.errors import HeadlensError
from headlens.heads import Head
from headlens.intervene.evalspec import DEFAULT_TOKENS, IOI, SWEEP_TOKENS


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"heads": "0.x"}, "malformed head"),
        ({"heads": "0.1", "metric": "nope"}, "unknown metric"),
        ({"heads": "0.1", "method": "nope"}, "unknown ablation method"),
        ({"heads": "0.1", "control": "random:x"}, "control"),
        ({"heads": "0.1", "tokens": "1"}, "too small"),
        ({"heads": "0.1", "check": True}, "go with --approx"),
        ({"heads": "each", "graddrop": True}, "go with --approx"),
        ({"heads": "each", "resume": True}, "--resume needs --out-dir"),
        ({"heads": "each", "approx": "atp", "batch_size": 2}, "--batch-size sets"),
        ({"heads": "each", "approx": "atp", "tokens": "100"}, "--approx reads every token"),
    ],
)
def test_bad_combinations_are_refused_before_any_model(flags, message):
    with pytest.raises(HeadlensError, match=message):  # ConfigError, InvalidHeadError: exit 2 on the CLI
        AblateSpec.parse(**flags)


def test_defaults_follow_the_heads_asked():
    assert AblateSpec.parse("0.1").evaluation.tokens == DEFAULT_TOKENS
    assert AblateSpec.parse("each").evaluation.tokens == SWEEP_TOKENS
    assert AblateSpec.parse("each", approx="atp").evaluation.tokens is None  # the estimate reads every token
    assert AblateSpec.parse("0.1", tokens="all").evaluation.tokens is None
    induction = AblateSpec.parse("induction")
    assert induction.evaluation.metric == "repeat" and "induction role's own metric" in induction.why
    movers = AblateSpec.parse("name_mover")
    assert movers.evaluation.metric == "logit-diff" and movers.evaluation.prompts == IOI
    assert AblateSpec.parse("0.1", control="random:3").control == 3


@pytest.mark.slow  # four exact runs and a gradient estimate: the slowest of make test-fast otherwise
def test_run_ablation_dispatches_to_the_stage_functions(strong_model):
    """Each kind of request gives what the stage function it names gives on the same inputs."""
    spec = AblateSpec.parse("0.1,1.0", metric="repeat", tokens="all", seed=3)
    direct = ablate_heads(strong_model, [Head(0, 1), Head(1, 0)], metric="repeat", tokens="all", seed=3)
    assert run_ablation(strong_model, spec) == direct
    spec = AblateSpec.parse("each", metric="repeat", seed=3)
    assert run_ablation(strong_model, spec) == sweep_heads(strong_model, metric="repeat", seed=3)
    said: list[str] = []
    spec = AblateSpec.parse("layer:1", metric="repeat", approx="atp", check=True)
    estimate = run_ablation(strong_model, spec, say=said.append)
    alone = approx_sweep(strong_model, metric="repeat", approx="atp").frame
    assert estimate.kind == "approx" and list(estimate.frame[["layer", "head"]].itertuples(index=False)) == [
        (1, h) for h in range(strong_model.spec.n_heads)
    ]
    assert estimate.frame["delta_approx"].tolist() == alone[alone.layer == 1]["delta_approx"].tolist()
    assert estimate.meta["check"]["kind"] == "check" and estimate.meta["approx"] == "atp" and said == []


def test_token_ablation_is_a_result_whose_means_are_ablate_heads_losses(small_model):
    """token_ablation's per-token losses average to ablate_heads's loss and loss_ablated on the same text (its
    docstring's promise, up to the order of a float64 sum), and reusing an earlier result's clean half gives
    the same Result as computing it again."""
    from headlens.ablation.tokens import token_ablation

    text = "one two three four five six seven eight nine ten " * 3
    first = token_ablation(small_model, text, "0.1")
    again = token_ablation(small_model, text, "1.0", clean=first)
    fresh = token_ablation(small_model, text, "1.0")
    assert first.kind == "tokens" and list(first.frame.columns) == ["index", "clean", "ablated"]
    assert again == fresh
    whole = ablate_heads(small_model, [Head(1, 0)], metric="loss", text=text, tokens="all")
    assert fresh.meta["loss"] == pytest.approx(whole.meta["loss"], rel=1e-6)
    assert fresh.meta["loss_ablated"] == pytest.approx(whole.meta["loss_ablated"], rel=1e-6)
    assert fresh.frame["clean"].mean() == pytest.approx(fresh.meta["loss"], rel=1e-12)
