"""Name movers (headlens.scores.name_mover): the IOI prompts for two tokenizers, the END attention
on a synthetic pattern, and on SmolLM2 the scores against per-prompt forward passes and a
hand-written OV circuit; the causal checks: removing the labelled heads' direct path to the logits
lowers the IOI logit difference more than random head sets of the same size, and zero-ablating them
costs little in total because other heads make up for them (self-repair): the compensation table of
headlens.circuits against a computation from the weights written here, and which heads compensate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from headlens.ablation.ablate import ablate_heads
from headlens.circuits.selfrepair import self_repair
from headlens.circuits.tasks import ioi_task
from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify.roles import resolve_heads
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.load.models import gpt2_tokenizer
from headlens.scores.name_mover import (
    COPY_TOP_K,
    ablation_prompts,
    end_attention,
    ioi_prompts,
    name_mover_scores,
    name_tokens,
)
from tests.helpers.kinds_checks import check_ioi_run_one_prompt_at_a_time
from tests.helpers.llama_ov import manual_ov_logits
from tests.helpers.planted import N_HEADS, N_LAYERS, PLANTED_TEXT, place_roles
from tests.helpers.planted_kinds import build_planted_ioi, ioi_slots, labelled_heads

N_CONTROL = 20  # random head sets (p-value floor 1/21)


def _check_prompts(tokenizer, bos):
    prompts = ioi_prompts(tokenizer, bos, n=12)
    for n, p in enumerate(prompts):
        ids = p["ids"]
        assert ids[0] == bos and ids[p["io_pos"]] == p["io"]
        assert ids[p["s1_pos"]] == ids[p["s2_pos"]] == p["s"] != p["io"]
        assert (p["io_pos"] < p["s1_pos"]) == (n % 2 == 0)  # ABBA, then BABA
        assert tokenizer.decode(ids[1:]) == p["text"]
    return prompts


def test_gpt2_prompts_hold_the_names_where_they_say():
    _check_prompts(gpt2_tokenizer(), 50256)


def test_end_attention_reads_the_last_real_position():
    pattern = torch.zeros(2, 1, 4, 4)  # [batch, head, q_pos, k_pos]
    pattern[0, 0, 3, 1] = 0.75
    pattern[1, 0, 2, 1] = 0.5  # prompt 1 is one token shorter (right padding)
    got = end_attention(pattern, torch.tensor([[1], [1]]), torch.tensor([3, 2]))
    assert got[:, 0].tolist() == [0.75, 0.5]


# Errors
class _NoNames:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text)}  # every character its own token


def test_a_tokenizer_without_single_token_names_is_a_config_error():
    with pytest.raises(ConfigError, match="one token"):
        ioi_prompts(_NoNames(), 0)


# A planted name mover ------------------------------------------------------------------------------------------

PLANTED_SEEDS = [seed for seed in range(10) if ioi_slots(place_roles(seed))][:2]


@pytest.fixture(scope="module", params=PLANTED_SEEDS)
def planted(request):
    planted = build_planted_ioi(request.param)
    return planted, name_mover_scores(planted.loaded)


@pytest.mark.slow
def test_planted_name_mover_is_the_only_one(planted):
    planted, scores = planted
    mover = planted.positions["name_mover"]
    assert scores["name_mover"].shape == (N_LAYERS, N_HEADS)
    assert [tuple(x) for x in scores["name_mover"].nonzero().tolist()] == [mover]
    assert not scores["negative_name_mover"].any()
    assert float(scores["name_copy_score"][mover]) == 1.0  # OV copies TOK into OUT exactly
    # The induction head copies as well, but does not look at the indirect object from END.
    induction = planted.positions["induction"]
    assert float(scores["name_copy_score"][induction]) == 1.0 and not scores["name_mover"][induction]
    assert scores["logit_diff"] > 0  # the planted circuit does the task


@pytest.mark.slow
def test_ablating_the_planted_name_mover_lowers_the_logit_diff_most(planted):
    planted, scores = planted
    mover = Head(*planted.positions["name_mover"])
    result = ablate_heads(
        planted.loaded,
        [mover],
        metric="logit-diff",
        prompts=ablation_prompts(scores["prompts"]),
        control=N_CONTROL,
        seed=0,
    ).meta
    assert result["delta"] < 0
    others = [
        d for d, s in zip(result["control"]["deltas"], result["control"]["sets"], strict=True) if s != [str(mover)]
    ]  # with 3 heads a layer, some random sets are the mover itself
    assert others and result["delta"] < min(others)


@pytest.mark.slow
def test_classify_labels_the_planted_name_mover_alone_and_reports_the_logit_diff(planted):
    planted, scores = planted
    heads = classify_heads(planted.loaded, text=PLANTED_TEXT, config=ClassifyConfig(n_seq=4, seed=0))
    frame = heads.frame
    mover = planted.positions["name_mover"]
    assert labelled_heads(frame, "name_mover") == [mover]
    assert labelled_heads(frame, "negative_name_mover") == labelled_heads(frame, "copy_suppression") == []
    # the probe's 48 prompts are the module's (same seed, budget // 4 = 64 capped at 48): same figure
    assert frame["ioi_logit_diff"].iloc[0] == pytest.approx(scores["logit_diff"], rel=1e-9)
    assert heads.meta["probes"]["n_ioi_prompts"] == len(scores["prompts"])
    labels = {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}
    assert resolve_heads(planted.loaded, "name_mover", labels)[0] == [Head(*mover)]


# SmolLM2 ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(real_model, one_thread):
    """SmolLM2, its checks on one thread: name_mover_scores is many small products, which a second thread slows."""
    return real_model("smollm2")


@pytest.fixture(scope="module")
def figures():
    """What the causal check measured, written as JSON to $HEADLENS_NAME_MOVER_FIGURES when set
    (BENCHMARKS.md, "Real models: causal checks")."""
    found: dict = {}
    yield found
    if os.environ.get("HEADLENS_NAME_MOVER_FIGURES"):
        Path(os.environ["HEADLENS_NAME_MOVER_FIGURES"]).write_text(json.dumps(found, indent=1))


@pytest.fixture(scope="module")
def scores(smollm2):
    return name_mover_scores(smollm2)


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_prompts(smollm2):
    _check_prompts(smollm2.tokenizer, smollm2.bos_token_id)


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_attention_and_logit_diff_match_one_prompt_at_a_time(smollm2, scores):
    check_ioi_run_one_prompt_at_a_time(smollm2, scores["prompts"][:6])


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_copy_scores_match_a_hand_computed_ov_circuit(smollm2, scores):
    names = torch.tensor(sorted(set(name_tokens(smollm2.tokenizer).values())))
    vocab = torch.arange(smollm2.spec.d_vocab)
    with torch.no_grad():
        for layer in _layers_to_check(scores):
            logits = manual_ov_logits(smollm2.model, names, vocab, layer)  # [head, n, d_vocab]
            own = logits.gather(-1, names.expand(logits.shape[0], -1)[..., None])  # [head, n, 1]
            copy = ((logits > own).sum(-1) < COPY_TOP_K).double().mean(-1)  # [head]
            negative = ((logits < own).sum(-1) < COPY_TOP_K).double().mean(-1)
            # float32 ranks vs float64 here: at most one name may sit on the top-5 boundary
            assert (scores["name_copy_score"][layer] - copy).abs().max() <= 1 / len(names), layer
            assert (scores["name_negative_copy_score"][layer] - negative).abs().max() <= 1 / len(names), layer


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_name_movers_write_io_above_s_directly(scores):
    """Wang et al.'s name movers raise logit(IO) - logit(S) through the direct path to the logits, their
    negative name movers lower it: each labelled head's direct effect (headlens.scores.direct_logit,
    checked against frozen-norm ablations in tests/test_direct_logit.py) has its kind's sign."""
    effect = scores["ioi_direct_effect"]  # [layer, head]
    movers = scores["name_mover"].nonzero().tolist()
    negative = scores["negative_name_mover"].nonzero().tolist()
    assert movers, "SmolLM2 has name movers at the module's cut-offs (BENCHMARKS.md: 23.0, 23.1, 23.2)"
    for layer, head in movers:
        assert float(effect[layer, head]) > 0, f"{layer}.{head}"
    for layer, head in negative:
        assert float(effect[layer, head]) < 0, f"{layer}.{head}"


N_PATH_CONTROL = 1000  # random same-size sets for the direct-path check (cheap: one pass, then sums)
PATH_ALPHA = 0.05  # the conventional level; the check states its p-value beside it


def end_contributions(loaded, prompts: list[dict], heads_off: tuple[Head, ...] = ()) -> torch.Tensor:
    """Each head's direct contribution to logit(IO) - logit(S) at END, written out here from a Llama's
    weights: the head's z at END through its slice of o_proj, the final RMSNorm's gain over the run's
    residual's RMS (frozen), dotted with W_U[IO] - W_U[S]. `heads_off` are zeroed at o_proj's input in the
    run (zero ablation). One prompt at a time: [prompt, layer, head]."""
    inner, d_head = loaded.model.model, loaded.spec.d_head
    n_layers, n_heads = loaded.spec.n_layers, loaded.spec.n_heads
    seen: dict = {}

    def zero(_module, args, heads):
        z = args[0].clone()  # [batch, pos, head * d_head]
        for head in heads:
            z[..., head * d_head : (head + 1) * d_head] = 0.0
        return (z,)

    hooks = [
        inner.layers[i].self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, heads=[h.head for h in heads_off if h.layer == i]: zero(m, a, heads)
        )
        for i in sorted({h.layer for h in heads_off})
    ]  # registered first: the capture below sees the zeroed z
    hooks += [
        layer.self_attn.o_proj.register_forward_pre_hook(lambda _m, args, i=i: seen.__setitem__(i, args[0][0, -1]))
        for i, layer in enumerate(inner.layers)
    ]
    hooks.append(inner.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("resid", args[0][0, -1])))
    out = torch.zeros(len(prompts), n_layers, n_heads, dtype=torch.float64)  # [prompt, layer, head]
    unembed = loaded.model.lm_head.weight.detach().double()  # [d_vocab, d_model]
    w_o = [layer.self_attn.o_proj.weight.detach().double().view(-1, n_heads, d_head) for layer in inner.layers]
    try:
        with torch.no_grad():
            for n, p in enumerate(prompts):
                loaded.model(input_ids=torch.tensor([p["ids"]]))
                resid = seen["resid"].double()  # [d_model], entering the final norm
                scale = inner.norm.weight.double() / torch.sqrt(resid.pow(2).mean() + inner.norm.variance_epsilon)
                direction = (unembed[p["io"]] - unembed[p["s"]]) * scale  # [d_model]
                for layer in range(n_layers):
                    z = seen[layer].double().view(n_heads, d_head)  # [head, d_head]
                    out[n, layer] = torch.einsum("hd,mhd,m->h", z, w_o[layer], direction)  # [head]
    finally:
        for hook in hooks:
            hook.remove()
    return out


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_removing_the_movers_direct_path_lowers_the_logit_diff_more_than_random_heads(smollm2, scores, figures):
    """Wang et al.'s path-patching view of name movers: remove only the labelled heads' direct path to the
    logits (their END outputs taken out of the final residual, the final norm's scale frozen) and the
    IOI logit difference falls more than when the same number of random heads (from all heads but
    the labelled ones) lose theirs; the negative movers' removal raises it more. The total effect (every
    downstream head free to respond) is small because the model makes up for the movers: the self-repair
    tests below check that and which heads compensate."""
    prompts = scores["prompts"]
    parts = end_contributions(smollm2, prompts)  # [prompt, layer, head]
    effect = parts.mean(0)  # [layer, head]
    # the module's direct effect is this same quantity through its own code (norm_factor, head_direct_effects)
    assert torch.allclose(scores["ioi_direct_effect"].double(), effect, atol=1e-4)
    everyone = [Head(layer, head) for layer in range(effect.shape[0]) for head in range(effect.shape[1])]
    gen = torch.Generator().manual_seed(0)
    found = {}
    for kind, sign in (("name_mover", -1.0), ("negative_name_mover", 1.0)):
        heads = [Head(int(a), int(b)) for a, b in scores[kind].nonzero().tolist()]
        if not heads:
            continue
        others = [h for h in everyone if h not in heads]

        def removed(chosen: list[Head]) -> float:  # the change of the mean logit diff, in logits
            return -sum(float(effect[h.layer, h.head]) for h in chosen)

        delta = removed(heads)
        controls = [
            removed([others[int(i)] for i in torch.randperm(len(others), generator=gen)[: len(heads)]])
            for _ in range(N_PATH_CONTROL)
        ]
        as_far = sum(sign * c >= sign * delta for c in controls)  # sets moving it at least as far its way
        p_value = (1 + as_far) / (1 + N_PATH_CONTROL)
        found[kind] = {
            "heads": [str(h) for h in heads],
            "delta": delta,
            "control_min": min(controls),
            "control_median": sorted(controls)[len(controls) // 2],
            "control_max": max(controls),
            "k": N_PATH_CONTROL,
            "p_value": p_value,
        }
        assert sign * delta > 0, (kind, delta)
        assert p_value <= PATH_ALPHA, found[kind]
    figures["name_mover_direct_path"] = found
    assert "name_mover" in found, "SmolLM2 has name movers at the module's cut-offs (BENCHMARKS.md: 23.0-23.2)"


def _layers_to_check(scores):
    """The layers of the labelled heads, or of the best-copying head when none is labelled."""
    labelled = (scores["name_mover"] | scores["negative_name_mover"]).nonzero()[:, 0].unique().tolist()
    return labelled[:3] or [int(scores["name_copy_score"].flatten().argmax()) // scores["name_copy_score"].shape[1]]


# Self-repair (headlens.circuits): the movers' total effect is made up by other heads -------------------------------


@pytest.fixture(scope="module")
def movers_repair(smollm2, scores):
    """The labelled movers zero-ablated on the probe's own 48 prompts (ioi_task, seed 0), through headlens.circuits."""
    task = ioi_task(smollm2, seed=0)
    assert [p["ids"] for p in task.prompts] == [p["ids"] for p in scores["prompts"]]  # the same prompts
    movers = [Head(int(a), int(b)) for a, b in scores["name_mover"].nonzero().tolist()]
    assert movers, "SmolLM2 has name movers at the module's cut-offs (BENCHMARKS.md: 23.0, 23.1, 23.2)"
    return movers, self_repair(smollm2, task, movers, "zero")


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_compensation_table_matches_a_computation_from_the_weights(smollm2, scores, movers_repair, figures):
    """Every head's direct effect clean and with the movers zeroed, and the change, written out here from the
    weights one prompt at a time (end_contributions: transformers and the weights only), agree with
    headlens.circuits.selfrepair's table; the total effect is the model's own logits with the movers zeroed."""
    movers, repair = movers_repair
    prompts = scores["prompts"]
    clean = end_contributions(smollm2, prompts).mean(0)  # [layer, head]
    ablated = end_contributions(smollm2, prompts, heads_off=tuple(movers)).mean(0)  # [layer, head]
    table = repair.frame.set_index("head")
    # float32 passes of 30 layers, float64 sums; one prompt alone vs 16 padded together: 1e-3 logits
    for head in table.index:
        layer, index = (int(x) for x in head.split("."))
        assert table.loc[head, "clean"] == pytest.approx(float(clean[layer, index]), abs=1e-3), head
        assert table.loc[head, "ablated"] == pytest.approx(float(ablated[layer, index]), abs=1e-3), head
    own = float(sum(clean[h.layer, h.head] for h in movers))
    assert repair.meta["direct_effect"] == pytest.approx(own, abs=1e-3)
    diffs = []
    with torch.no_grad():
        for p in prompts:  # the model's own logits, movers zeroed at o_proj's input by a hook written here
            hooks = [
                smollm2.model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(
                    lambda _m, a, heads=[h.head for h in movers if h.layer == layer]: (_zeroed(a[0], heads, smollm2),)
                )
                for layer in sorted({h.layer for h in movers})
            ]
            try:
                logits = smollm2.model(input_ids=torch.tensor([p["ids"]])).logits[0, -1]
            finally:
                for hook in hooks:
                    hook.remove()
            diffs.append(float(logits[p["io"]] - logits[p["s"]]))
    assert repair.meta["ablated_metric"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-3)
    top = table.head(5)
    figures["name_mover_self_repair"] = {
        "movers": [str(h) for h in movers],
        "direct_effect": repair.meta["direct_effect"],
        "total_effect": repair.meta["total_effect"],
        "compensation_top5": [[h, float(r.clean), float(r.ablated), float(r.change)] for h, r in top.iterrows()],
        "sentence": repair.meta["sentence"],
    }


def _zeroed(z: torch.Tensor, heads: list[int], loaded) -> torch.Tensor:
    z = z.clone()  # [batch, pos, head * d_head]
    d_head = loaded.spec.d_head
    for head in heads:
        z[..., head * d_head : (head + 1) * d_head] = 0.0
    return z


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_movers_write_io_directly_but_24_4_and_23_3_make_up_for_them(movers_repair):
    """What the report and `headlens circuit smollm2 --task ioi --ablate 23.0,23.1,23.2` state, as a test that can
    fail: the movers write IO over S directly (> 0.5 logits), ablating them costs less than a third of that in
    total (two thirds or more come back), and the two heads whose direct effect rises most are the negative
    mover 24.4 and the unlabelled 23.3 (BENCHMARKS.md, "Name movers in SmolLM2: direct effects and self-repair")."""
    movers, repair = movers_repair
    direct, total = repair.meta["direct_effect"], repair.meta["total_effect"]
    assert direct > 0.5
    assert abs(total) < direct / 3  # the self-repair: most of the direct effect comes back
    assert repair.meta["compensators"] == ["24.4", "23.3"]  # rising most, the way the movers wrote
