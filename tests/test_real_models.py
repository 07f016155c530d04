"""The labels of a real pretrained model, proven: SmolLM2-135M (30 layers x 9 query heads over 3 key/value heads).

Every label tested is whatever `classify_heads` gives on this model (never a list written here), and each
is checked against a peer or a causal experiment:
1. previous-token, duplicate-token and induction scores equal TransformerLens `detect_head` on the same
   prompts, through the bridge (headlens.load.models.boot_bridge);
2. zero-ablating the induction heads raises the second-copy loss on repeated random tokens more than every
   one of N_CONTROLS random head sets with the same count per layer (empirical p <= P_MAX), and the same
   for the retrieval heads on the needle tokens' loss (Wu et al. 2024's knockout against random heads);
3. K-composition (Olsson et al. 2022): ablating the previous-token heads lowers the induction heads'
   prefix-matching score more than random sets of the same per-layer counts do;
4. the model's report (browser tests) shows a viewer sample on which the labelled induction heads attend to
   the induction target, measured with transformers directly.

Probes are kept short (CONTEXT tokens, small ClassifyConfig) so the module fits CI's budget (BENCHMARKS.md,
"Real models: causal checks"). The random head sets run as stacked copies of each batch from the first
ablated layer on (`stacked_run`): layers before it are the same for every set, so they run once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from headlens.ablation.ablate import ROLE_CONTEXT, ablate_heads
from headlens.arch import adapter_for
from headlens.arch.base import get_module
from headlens.capture import iter_batches, run_capture
from headlens.classify.labels import ClassifyConfig
from headlens.heads import Head
from headlens.intervene.evalset import build_evalset
from headlens.intervene.replace import heads_by_layer
from headlens.intervene.stats import control_design, control_summary
from headlens.intervene.sums import unit_sums
from headlens.probes.inputs import default_text, random_token_range, repeated_random_tokens
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.positional import prev_token_reducer
from tests.helpers.browser import (
    ALPHA_ATOL,
    MIN_PIXEL_STD,
    check_viewer_shows_induction,
    embedded_patterns,
    leaving_requests,
    open_page,
    pixel_std,
    start_chromium,
    token_alphas,
    viewer_data,
)

pytestmark = [pytest.mark.slow, pytest.mark.real]

# Probe context: natural-text windows and needle haystacks (8-token needles) are sized by the context (up to
# 64 tokens here instead of SmolLM2's 8,192); repeats fit 2 copies of Olsson et al.'s 25 tokens (the
# TransformerLens demos' probe).
CONTEXT = 64
CONFIG = ClassifyConfig(n_seq=4, max_windows=4, batch_size=4, seed=0)
TEXT_CHARS = 2000  # of the shipped held-out text: 4 windows of 64 tokens, and the needle haystacks
N_CONTROLS = 100  # random head sets per causal check: p >= 1 / (N_CONTROLS + 1) ~ 0.0099
P_MAX = 0.01
SETS_PER_PASS = 8  # random sets stacked as batch copies in one forward pass
# detect_head and our reducers read the same float32 patterns of the same modules (the bridge wraps a copy of
# the model): each score is a mean of <= 64 row sums of <= 64 weights in [0, 1], so float32 rounding
# (~1e-7 relative per operation, a few hundred operations deep) stays far below 1e-4.
PARITY_ATOL = 1e-4
# The stacked run subtracts a head's z_h @ W_O[h] from the attention output where the hooks zero z_h before
# the output projection: the same sum in another order. Over 30 float32 layers the per-token loss moves by
# ~1e-5 relative; 1e-3 nats (mean loss ~0.5-8 nats) leaves room and is 100x below the effects compared.
STACKED_ATOL = 1e-3

PARITY_PROMPTS = [
    "The keeper climbed the stairs and trimmed the wick before the storm.",
    "red kettle, seven lanterns, a brass spyglass near the eyepiece. " * 2,
    "Alpha beta gamma delta epsilon zeta eta theta. " * 3,
]


@pytest.fixture(scope="module")
def smollm2(real_model):
    """SmolLM2-135M-Instruct (`headlens pull smollm2`, dequantized from Q4_1), its probes sized by a
    CONTEXT-token context."""
    loaded = real_model("smollm2")  # skips (fails under CI=true) when it is not pulled
    return dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, n_ctx=CONTEXT))


@pytest.fixture(scope="module")
def figures():
    """What the checks measured, written as JSON to $HEADLENS_REAL_FIGURES when set (BENCHMARKS.md's
    "Real models: causal checks" quotes such a run)."""
    found: dict = {}
    yield found
    if os.environ.get("HEADLENS_REAL_FIGURES"):
        import json

        Path(os.environ["HEADLENS_REAL_FIGURES"]).write_text(json.dumps(found, indent=1, default=str))


@pytest.fixture(scope="module")
def labels(smollm2, figures):
    """classify_heads on SmolLM2: Head -> labels, and the classification (its Result)."""
    from headlens.classify import classify_heads

    heads = classify_heads(smollm2, text=default_text()[:TEXT_CHARS], config=CONFIG)
    frame = heads.frame
    figures["labels"] = {
        label: [f"{r.layer}.{r.head}" for r in frame.itertuples() if label in r.labels]
        for label in ("previous_token", "duplicate_token", "induction", "retrieval")
    }
    return {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}, heads


def labelled(labels, role: str) -> list[Head]:
    heads = sorted(head for head, names in labels[0].items() if role in names)
    if not heads:
        pytest.fail(f"classify labelled no head {role} on SmolLM2: the causal check has nothing to test")
    return heads


def random_sets(heads: list[Head], n_heads: int, seed: int) -> list[list[Head]]:
    """N_CONTROLS random sets with `heads`' count per layer, each different from `heads`."""
    drawn = [s for s in control_design(heads, n_heads, 2 * N_CONTROLS, seed)["sets"] if s != heads]
    assert len(drawn) >= N_CONTROLS, "too few distinct random sets"
    return drawn[:N_CONTROLS]


# Stacked ablations: many head sets, one forward pass ----------------------------------------------


def stacked_run(model, input_ids, mask, head_sets, last_layer: int | None = None, pattern_layers=()):
    """Copy c of the batch runs with head_sets[c] zero-ablated (z_h := 0, its share z_h @ W_O[h] of the
    attention output removed); layers before the first ablated one run once for every copy.

    Returns the residual leaving `last_layer` (default: the last) [copies * batch, pos, d_model], copy-major
    as the adapter stacks copies, the adapter, and {layer: pattern [copies * batch, head, q, k]}."""
    adapter = adapter_for(model)
    ctx = adapter.context(input_ids, mask)
    last = adapter.n_layers - 1 if last_layer is None else last_layer
    first = min((h.layer for s in head_sets for h in s), default=last + 1)
    by_layer = [heads_by_layer(s) for s in head_sets]
    copies, n_rows = len(head_sets), input_ids.shape[0]
    resid = adapter.embed_tokens(ctx)  # [batch, pos, d_model]
    patterns = {}
    for layer in range(last + 1):
        if layer == first:
            resid = resid.repeat(copies, 1, 1)  # [copies * batch, pos, d_model]
        stacked = copies if layer >= first else 1
        if layer in pattern_layers:
            block = adapter.layer(layer)
            attn = get_module(block, adapter.sites.attn)
            normed = get_module(block, adapter.sites.input_norm)(resid)
            patterns[layer] = attn(normed, **ctx.attn_kwargs(stacked, layer))[1]  # [rows, head, q, k]
        z, out = adapter.attention(layer, resid, ctx, stacked)  # [rows, pos, head, d_head], [rows, pos, d_model]
        if layer >= first:
            w_o = adapter.w_o(layer)  # [head, d_head, d_model]
            out = out.clone()
            for copy, heads in enumerate(by_layer):
                rows = slice(copy * n_rows, (copy + 1) * n_rows)
                for head in heads.get(layer, []):
                    out[rows] -= z[rows, :, head.head] @ w_o[head.head]  # [batch, pos, d_model]
        resid = adapter.finish_block(layer, resid, out)
    if first > last:
        resid = resid.repeat(copies, 1, 1)
    return resid, adapter, patterns


def set_means(loaded, evalset, head_sets, batch_size: int = 4) -> torch.Tensor:
    """The metric's mean over the scored positions of `evalset` with each set ablated: [n_sets] float64."""
    sums = torch.zeros(len(head_sets), dtype=torch.float64)  # [n_sets]
    n_seq = evalset.input_ids.shape[0]
    with torch.no_grad():
        for start in range(0, n_seq, batch_size):
            rows = slice(start, min(start + batch_size, n_seq))
            for first in range(0, len(head_sets), SETS_PER_PASS):
                group = head_sets[first : first + SETS_PER_PASS]
                resid, adapter, _ = stacked_run(loaded.model, evalset.input_ids[rows], evalset.mask[rows], group)
                unit = unit_sums(adapter, resid, evalset, rows, copies=len(group))  # [copies, n_units]
                sums[first : first + len(group)] += unit.double().sum(-1).cpu()
    return sums / int(evalset.counted.sum())


def causal_check(loaded, heads: list[Head], metric: str, seed: int, context: int | None = None) -> dict:
    """The chosen set through ablate_heads (hooks on z), then it and N_CONTROLS random sets stacked;
    `context` caps the needle tests' length (None: the evaluation set's default)."""
    result = ablate_heads(loaded, heads, metric=metric, seed=seed, context=context).meta
    sets = random_sets(heads, loaded.spec.n_heads, seed + 1)
    evalset = build_evalset(loaded, metric, seed=seed, context=context)
    means = set_means(loaded, evalset, [[], heads] + sets)  # [2 + N_CONTROLS]
    deltas = (means[2:] - means[0]).tolist()
    summary = control_summary(result["delta"], deltas, sets, seed)
    return {"result": result, "stacked_delta": float(means[1] - means[0]), "deltas": deltas, **summary}


# 1. Scores against the peer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bridge(smollm2):
    from headlens.load.models import boot_bridge

    return boot_bridge(smollm2)  # the bridge boots SmolLM2: a failure here is a regression, never a skip


@pytest.mark.parametrize(
    "name, make",
    [
        ("previous_token_head", prev_token_reducer),
        ("duplicate_token_head", duplicate_token_reducer),
        ("induction_head", prefix_matching_reducer),
    ],
)
def test_scores_equal_detect_head_through_the_bridge(smollm2, bridge, name, make):
    """detect_head's "mul" score is sum(A * P) / sum(A) per prompt, averaged over prompts; our reducers'
    mul_score() is that quantity (tests/test_tl_parity.py states the derivation)."""
    from transformer_lens.head_detector import detect_head

    expected = detect_head(bridge, PARITY_PROMPTS, name)  # [n_layers, n_heads]
    sequences = [bridge.to_tokens(p)[0].tolist() for p in PARITY_PROMPTS]  # BOS first, as detect_head runs them
    assert all(seq[0] == smollm2.bos_token_id for seq in sequences)
    reducer = make(smollm2.spec.n_layers, smollm2.spec.n_heads)
    run_capture(smollm2.model, iter_batches(sequences, batch_size=3, pad_id=0), [reducer])  # padded batches
    ours = reducer.mul_score()
    assert ours.shape == expected.shape == (30, 9)
    assert torch.allclose(ours, expected.float(), atol=PARITY_ATOL), (ours - expected).abs().max()
    assert expected.abs().sum() > 0  # the peer scored something


# 2. Causal: each role's heads against random head sets ---------------------------------------------


def summary_of(heads, check) -> dict:
    return {
        "heads": [str(h) for h in heads],
        "clean": check["result"]["clean"],
        "delta": check["result"]["delta"],
        "ci95": check["result"]["ci95"],
        "unit": check["result"]["unit"],
        "control_min": min(check["deltas"]),
        "control_median": sorted(check["deltas"])[len(check["deltas"]) // 2],
        "control_max": max(check["deltas"]),
        "control_max_abs": max(abs(d) for d in check["deltas"]),
        "k": check["k"],
        "rank": check["rank"],
        "p_value": check["p_value"],
    }


def test_induction_heads_carry_the_second_copy(smollm2, labels, figures):
    heads = labelled(labels, "induction")
    check = causal_check(smollm2, heads, "repeat", seed=0)
    figures["induction_repeat"] = summary_of(heads, check)
    chosen = check["result"]["delta"]
    assert abs(check["stacked_delta"] - chosen) < STACKED_ATOL  # the stacked run reproduces ablate_heads
    assert chosen > 0 and chosen > max(check["deltas"]) + STACKED_ATOL, (chosen, max(check["deltas"]))
    assert check["p_value"] <= P_MAX


def test_retrieval_heads_carry_the_needle(smollm2, labels, figures):
    """The needle tokens' loss (nats/token, continuous) rises more than under every random set. The top-1
    share of needle tokens retrieved is recorded beside it but not compared: it floors at 0, where random
    sets tie the chosen one."""
    heads = labelled(labels, "retrieval")
    # The needle tests of the report's role experiment: at most ROLE_CONTEXT tokens, the budget the
    # retrieval heads were labelled at (15 tests, 2,240 tokens per ablated run on SmolLM2).
    top1 = ablate_heads(smollm2, heads, metric="needle", seed=0, context=ROLE_CONTEXT).meta
    assert top1["clean"] > 0.5  # the model retrieves the needle at all
    check = causal_check(smollm2, heads, "needle-loss", seed=0, context=ROLE_CONTEXT)
    figures["retrieval_needle_loss"] = summary_of(heads, check)
    figures["retrieval_needle_top1"] = {key: top1[key] for key in ("clean", "ablated", "delta", "n", "unit")}
    chosen = check["result"]["delta"]  # change of the needle tokens' mean loss, nats/token
    assert abs(check["stacked_delta"] - chosen) < STACKED_ATOL
    assert chosen > 0 and chosen > max(check["deltas"]) + STACKED_ATOL, (chosen, max(check["deltas"]))
    assert check["p_value"] <= P_MAX


# 3. K-composition: the previous-token heads feed the induction heads' keys -------------------------


def prefix_matching(patterns: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean attention mass on prefix-matching targets over queries that have one (classify's definition):
    patterns [rows, head, q, k] for rows = copies x batch of `input_ids` [batch, pos] -> [copies, head]."""
    targets = prefix_matching_targets(input_ids)  # [batch, q, k]
    scored = targets.any(-1)  # [batch, q]
    copies = patterns.shape[0] // input_ids.shape[0]
    mass = (
        patterns.view(copies, *targets.shape[:1], patterns.shape[1], *targets.shape[1:]) * targets[None, :, None]
    ).sum(-1)  # [copies, batch, head, q]
    return (mass * scored[None, :, None]).sum((1, 3)) / scored.sum()  # [copies, head]


def test_previous_token_heads_k_compose_with_the_induction_heads(smollm2, labels, figures):
    prev, induction = labelled(labels, "previous_token"), labelled(labels, "induction")
    later = [h for h in induction if h.layer > min(p.layer for p in prev)]
    if not later:
        pytest.fail(f"no induction head ({induction}) sits after a previous-token head ({prev})")
    sets = [[], prev] + random_sets(prev, smollm2.spec.n_heads, seed=2)
    low, high = random_token_range(smollm2.spec.d_vocab)
    ids = repeated_random_tokens(CONFIG.n_seq, CONFIG.seq_len, 2, low, high, smollm2.bos_token_id, seed=3)
    layers = sorted({h.layer for h in later})
    scores = torch.zeros(len(sets))  # [n_sets] mean prefix-matching score of the later induction heads
    with torch.no_grad():
        for first in range(0, len(sets), SETS_PER_PASS):
            group = sets[first : first + SETS_PER_PASS]
            _, _, patterns = stacked_run(
                smollm2.model,
                ids,
                torch.ones_like(ids, dtype=torch.bool),
                group,
                last_layer=max(layers),
                pattern_layers=layers,
            )
            per_head = {layer: prefix_matching(patterns[layer], ids) for layer in layers}  # [copies, head]
            scores[first : first + len(group)] = torch.stack([per_head[h.layer][:, h.head] for h in later]).mean(
                0
            )  # [copies]
    drops = (scores[0] - scores[1:]).tolist()  # [1 + N_CONTROLS]: the previous-token heads', then random
    summary = control_summary(drops[0], drops[1:], sets[2:], seed=2)
    figures["k_composition"] = {
        "previous_token": [str(h) for h in prev],
        "induction": [str(h) for h in later],
        "score": float(scores[0]),
        "drop": drops[0],
        "control_min": min(drops[1:]),
        "control_max": max(drops[1:]),
        "control_median": sorted(drops[1:])[len(drops) // 2 - 1],
        "k": summary["k"],
        "p_value": summary["p_value"],
    }
    assert scores[0] > CONFIG.prefix_matching_min  # the induction heads prefix-match on this probe
    assert drops[0] > max(drops[1:]), (drops[0], max(drops[1:]))
    assert summary["p_value"] <= P_MAX


# 4. The report's viewer: labelled induction heads attend to the induction target -------------------


@pytest.fixture(scope="module")
def smollm2_report(smollm2, labels, tmp_path_factory):
    """SmolLM2's report from its labels, role experiments and viewer sample, as `headlens report` draws it."""
    from headlens.classify.samples import sample_patterns
    from headlens.cli.options import model_info
    from headlens.reports import render_report
    from headlens.reports.viewer import default_viewer_tokens

    spec = smollm2.spec
    n_tokens = default_viewer_tokens(spec.n_layers, spec.n_heads, spec.n_ctx)
    out = tmp_path_factory.mktemp("smollm2") / "report.html"
    render_report(
        out,
        model_info=model_info(smollm2),
        heads=labels[1],
        viewer=sample_patterns(
            smollm2, default_text()[:TEXT_CHARS], n_tokens, repeat=True, induction_heads=labelled(labels, "induction")
        ),
        command="headlens report smollm2",
        text_label="the held-out text shipped with headlens",
    )
    return out


def test_smollm2_viewer_sample_shows_its_induction_heads(smollm2, smollm2_report, figures):

    html = smollm2_report.read_text(encoding="utf-8")
    measured = check_viewer_shows_induction(html, smollm2.model)
    figures["viewer"] = {
        "uniform": measured["uniform"],
        "n_queries": measured["n_queries"],
        "pos": viewer_data(html)["pos"],
        "attention": {str(h): v for h, v in measured["attention"].items()},
    }
    assert measured["n_queries"] > 10


@pytest.mark.browser
def test_smollm2_report_in_the_browser(smollm2_report):
    """The browser tests' checks on SmolLM2's page: loads offline without errors, figures drawn, the viewer
    answers a click with the chosen head's attention."""
    import numpy as np

    driver = start_chromium()
    try:
        events = open_page(driver, smollm2_report)
        assert events["errors"] == [] and leaving_requests(events["urls"], smollm2_report) == []
        driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")  # folded parts
        for selector in ["#scores img", "#viewer-grid"]:
            element = driver.find_element("css selector", selector)
            driver.execute_script("arguments[0].scrollIntoView()", element)
            assert pixel_std(element.screenshot_as_png) > MIN_PIXEL_STD, selector
        data, patterns = embedded_patterns(smollm2_report.read_text(encoding="utf-8"))
        layer, head = (int(x) for x in driver.find_element("id", "viewer-head").get_attribute("value").split("."))
        tokens = driver.find_elements("css selector", "#viewer-tokens .tok")
        query = data["pos"] - 1
        driver.execute_script("arguments[0].scrollIntoView()", tokens[query])
        tokens[query].click()
        assert np.allclose(token_alphas(driver), patterns[layer, head, query], atol=ALPHA_ATOL)
        assert open_page(driver, smollm2_report)["errors"] == []
    finally:
        driver.quit()
