"""Ablation on the user's own text and prompts: every metric against an independent computation
(Hugging Face forward passes with a hand-written pre-hook on c_proj), block bootstrap, roles,
random controls and the store's evaluation rule."""

from __future__ import annotations

import json

import pytest
import torch

from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.classify.roles import read_labels, resolve_heads
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head
from headlens.intervene.evalset import build_evalset, read_prompts
from headlens.intervene.stats import control_design
from headlens.probes.inputs import needle_prompts, random_token_range
from tests.helpers.strong import sample_text

# Same model, same data, another implementation of the forward pass: float32 rounding only.
SAME_ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def _hf_logits(loaded, seqs: list[list[int]], heads: list[Head]) -> list[torch.Tensor]:
    """Logits of each sequence (run alone, no padding) with `heads` zeroed by a pre-hook on c_proj
    written here: [pos, d_vocab] each."""
    model, n_heads = loaded.model, loaded.spec.n_heads

    def zero(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:-1], n_heads, -1).clone()  # [batch, pos, head, d_head]
            for h in heads:
                if h.layer == layer:
                    z[:, :, h.head] = 0.0
            return (z.view(args[0].shape),)

        return hook

    handles = [block.attn.c_proj.register_forward_pre_hook(zero(i)) for i, block in enumerate(model.transformer.h)]
    try:
        with torch.no_grad():
            return [model(input_ids=torch.tensor([seq])).logits[0].double() for seq in seqs]
    finally:
        for handle in handles:
            handle.remove()


def _text_loss(loaded, ids: list[int], bos: bool, heads: list[Head]) -> float:
    """Mean next-token loss over windows of the context (BOS first, or not), computed plainly."""
    n_ctx = loaded.spec.n_ctx
    body = n_ctx - 1 if bos else n_ctx
    windows = [([loaded.bos_token_id] if bos else []) + ids[i : i + body] for i in range(0, len(ids), body)]
    windows = [w for w in windows if len(w) >= 2]
    losses = []
    for window, logits in zip(windows, _hf_logits(loaded, windows, heads), strict=True):
        logp = torch.log_softmax(logits[:-1], -1)  # [pos-1, d_vocab]
        losses.append(-logp[torch.arange(len(window) - 1), torch.tensor(window[1:])])
    return float(torch.cat(losses).mean())


@pytest.mark.parametrize("bos", [True, False])
def test_a_146_token_text_equals_a_plain_computation(strong_model, bos):
    text = sample_text(145)
    ids = strong_model.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 146  # 3 windows of the 64-token context, the last one short
    heads = [Head(0, 1), Head(1, 2)]
    result = ablate_heads(strong_model, heads, text=text, bos=bos).meta
    assert abs(result["loss"] - _text_loss(strong_model, ids, bos, [])) < SAME_ATOL
    assert abs(result["loss_ablated"] - _text_loss(strong_model, ids, bos, heads)) < SAME_ATOL
    assert result["n_tokens"] == (146 if bos else 143)  # without BOS each window's first token is unpredicted
    assert abs(result["delta"]) > 100 * SAME_ATOL
    assert "blocks" in result["resampled"]  # 3 windows: token blocks are resampled
    low, high = result["ci95"]
    assert low < result["delta"] < high and high - low > 0


def test_one_token_text_is_an_error(strong_model):
    with pytest.raises(InputTextError, match="1 token long"):
        ablate_heads(strong_model, "0.1", text="the")


def test_single_window_ci_has_width(strong_model):
    """One window: the sequence bootstrap would give a zero-width interval; blocks do not."""
    result = ablate_heads(strong_model, "0.0", text=sample_text(40)).meta
    assert result["resampled"].startswith("21 blocks of up to 2 consecutive tokens (1 sequence)")
    assert result["ci95"][1] - result["ci95"][0] > 0


# Prompts and metrics ------------------------------------------------------------------------------

PROMPTS = [
    {"prompt": "the river and the king of the", "target": " city", "foil": " water"},
    {"prompt": "light from the old house was", "target": " small", "foil": " great"},
    {"prompt": "people at night in the", "target": " world", "foil": " year"},
]


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n\n", encoding="utf-8")
    return path


def _prompt_values(loaded, heads, metric: str) -> float:
    tok = loaded.tokenizer
    seqs = [[loaded.bos_token_id, *tok(p["prompt"], add_special_tokens=False)["input_ids"]] for p in PROMPTS]
    values = []
    for p, logits in zip(PROMPTS, _hf_logits(loaded, seqs, heads), strict=True):
        last = logits[-1]  # [d_vocab]
        target, foil = (tok(p[key], add_special_tokens=False)["input_ids"][0] for key in ("target", "foil"))
        values.append(
            {
                "prob": torch.softmax(last, -1)[target],
                "logit-diff": last[target] - last[foil],
                "loss": -torch.log_softmax(last, -1)[target],
            }[metric]
        )
    return float(torch.stack(values).mean())


@pytest.mark.parametrize("metric", ["prob", "logit-diff", "loss"])
def test_prompt_metrics_equal_a_plain_computation(strong_model, prompts_file, metric):
    heads = [Head(0, 2)]
    result = ablate_heads(strong_model, heads, metric=metric, prompts=read_prompts(prompts_file)).meta
    assert list(result)[:10] == ["model", "heads", "method", "metric", "unit", "n", "clean", "ablated", "delta", "ci95"]
    assert result["n"] == 3 and result["resampled"] == "3 prompts"
    # prob is ~1e-5 on a random model's 50,257 tokens: compare it relatively (float32 rounding)
    close = {"rel": 1e-4} if metric == "prob" else {"abs": SAME_ATOL}
    assert result["clean"] == pytest.approx(_prompt_values(strong_model, [], metric), **close)
    assert result["ablated"] == pytest.approx(_prompt_values(strong_model, heads, metric), **close)
    assert abs(result["delta"]) > 0.01 * abs(result["clean"])  # the head matters


def _needle_tests(loaded, text: str):
    """The retrieval probe's needle tests in `text` at the strong model's 64-token context (8-token
    needles, 4 restated, seed 3), and each test's teacher-forced sequence."""
    hay = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    tests = needle_prompts(
        hay, 64, loaded.bos_token_id, random_token_range(loaded.spec.d_vocab), needle_len=8, restate=4, seed=3
    )
    return tests, [t.prompt + t.needle[4:] for t in tests]


def test_needle_metric_equals_teacher_forced_hits(strong_model):
    """Share of asked-for needle tokens that are the top prediction, from the probe's own prompts."""
    text = sample_text(400)
    heads = [Head(1, 0), Head(1, 3)]
    result = ablate_heads(strong_model, heads, metric="needle", text=text, seed=3).meta
    tests, seqs = _needle_tests(strong_model, text)
    for key, chosen in (("clean", []), ("ablated", heads)):
        hits = []
        for test, logits in zip(tests, _hf_logits(strong_model, seqs, chosen), strict=True):
            start = len(test.prompt) - 1
            predicted = logits[start : start + 4].argmax(-1)  # [4] predictions of needle tokens 4..7
            hits.append(predicted == torch.tensor(test.needle[4:]))
        assert result["n"] == 4 * len(tests)
        assert result[key] == pytest.approx(float(torch.cat(hits).double().mean()), abs=1e-12)


def test_needle_loss_metric_equals_the_needle_tokens_cross_entropy(strong_model):
    """Mean -log p(needle token | true earlier tokens) over the asked-for needle tokens, in nats, from
    float64 log-softmaxes of Hugging Face logits; the same positions as the top-1 needle metric."""
    text = sample_text(400)
    heads = [Head(1, 0), Head(1, 3)]
    result = ablate_heads(strong_model, heads, metric="needle-loss", text=text, seed=3).meta
    tests, seqs = _needle_tests(strong_model, text)
    for key, chosen in (("clean", []), ("ablated", heads)):
        losses = []
        for test, logits in zip(tests, _hf_logits(strong_model, seqs, chosen), strict=True):
            start = len(test.prompt) - 1
            logp = torch.log_softmax(logits[start : start + 4].double(), dim=-1)  # [4, d_vocab]
            losses.append(-logp[torch.arange(4), torch.tensor(test.needle[4:])])  # [4]
        # float32 logits, float64 here: ~1e-7 relative on losses of a few nats
        assert result[key] == pytest.approx(float(torch.cat(losses).mean()), abs=SAME_ATOL)
    assert result["n"] == 4 * len(tests) and result["unit"] == "nats/token"
    assert abs(result["delta"]) > 100 * SAME_ATOL  # the ablation moves the loss: clean and ablated both checked
    top1 = ablate_heads(strong_model, heads, metric="needle", text=text, seed=3).meta
    assert top1["n"] == result["n"]  # the two needle metrics score the same positions


def test_prompt_errors_name_the_line(strong_model, tmp_path):
    path = tmp_path / "bad.jsonl"
    for lines, pattern in (
        ([PROMPTS[0], {"prompt": "a", "target": " the river"}], "line 2: target ' the river' is 2"),
        ([PROMPTS[0], "{not json"], "line 2 is not valid JSON"),
        ([{"target": " the"}], "line 1: missing or empty string field 'prompt'"),
        ([PROMPTS[0], {"prompt": "x", "target": " the"}], "line 2: metric logit-diff needs"),
    ):
        path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines), encoding="utf-8")
        with pytest.raises(InputTextError, match=pattern):
            ablate_heads(strong_model, "0.0", metric="logit-diff", prompts=read_prompts(path))
    with pytest.raises(ConfigError, match="does not score prompts"):
        build_evalset(strong_model, "repeat", prompts=PROMPTS_WITH_LINES)


PROMPTS_WITH_LINES = [{**p, "line": f"p line {i}"} for i, p in enumerate(PROMPTS, start=1)]


def test_reference_text_and_sweep_keys(strong_model):
    text, reference = sample_text(200, seed=1), sample_text(200, seed=2)
    given = sweep_heads(strong_model, method="mean", text=text, reference=reference, heads=[Head(0, 0)])
    assert "reference text" in given.meta["reference"] and "mean of z" in given.meta["reference"]
    default = sweep_heads(strong_model, method="mean", text=text, heads=[Head(0, 0)])
    assert "the evaluation set" in default.meta["reference"]
    assert given.frame.loc[0, "delta"] != default.frame.loc[0, "delta"]  # the reference matters


# Roles and controls -------------------------------------------------------------------------------

LABELS = {Head(layer, head): [] for layer in range(2) for head in range(4)}
LABELS.update(
    {Head(0, 3): ["previous_token", "positional"], Head(1, 1): ["induction", "retrieval"], Head(1, 2): ["induction"]}
)


def test_role_selection_picks_exactly_the_labelled_heads(strong_model, tmp_path):
    heads, how = resolve_heads(strong_model, "induction", LABELS)
    assert heads == [Head(1, 1), Head(1, 2)] and "labelled induction by the labels file" in how
    assert resolve_heads(strong_model, "label:positional", LABELS)[0] == [Head(0, 3)]
    path = tmp_path / "heads.json"
    path.write_text(json.dumps([{"layer": h.layer, "head": h.head, "labels": v} for h, v in LABELS.items()]))
    assert read_labels(path) == LABELS
    assert resolve_heads(strong_model, "retrieval", read_labels(path))[0] == [Head(1, 1)]
    with pytest.raises(ConfigError, match="no head of this model is labelled first_token"):
        resolve_heads(strong_model, "first_token", LABELS)
    with pytest.raises(ConfigError, match="unknown label 'nonsense'"):
        resolve_heads(strong_model, "label:nonsense", LABELS)


def test_random_control_is_seeded_and_keeps_per_layer_counts(strong_model):
    heads = [Head(0, 1), Head(1, 0), Head(1, 3)]  # 4 x 6 - 1 = 23 other sets: 20 of them are drawn

    def control_sets(k, seed):
        return control_design(heads, 4, k, seed)["sets"]

    sets = control_sets(20, seed=5)
    assert sets == control_sets(20, seed=5) and sets != control_sets(20, seed=6)
    for chosen in sets:
        assert [h.layer for h in chosen] == [0, 1, 1] and len(set(chosen)) == 3
    assert len({tuple(s) for s in sets}) == 20 and heads not in sets  # distinct, none the chosen set
    result = ablate_heads(strong_model, heads, metric="repeat", control=4, seed=5).meta
    control = result["control"]
    assert control["sets"] == [[str(h) for h in s] for s in control_sets(4, seed=5)]
    for names, delta in zip(control["sets"], control["deltas"], strict=True):
        alone = ablate_heads(strong_model, names and ",".join(names), metric="repeat", seed=5).meta
        # the controls run from a cached clean residual through the adapter's blocks, `alone` by hooks on the
        # model's own forward: the same float32 operations, summed in another order (test_sweep's FAST_ATOL)
        assert delta == pytest.approx(alone["delta"], abs=1e-5)
    larger = sum(abs(d) >= abs(result["delta"]) for d in control["deltas"])
    assert control["p_value"] == (1 + larger) / 5
    assert ablate_heads(strong_model, heads, metric="repeat", control=4, seed=5).meta == result


# The store's evaluation rule ----------------------------------------------------------------------


def test_resuming_a_store_of_the_old_rule_is_refused(strong_model, tmp_path):
    out = tmp_path / "old"
    sweep_heads(strong_model, metric="repeat", heads=[Head(0, 0)], out=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rule"] == 2
    del manifest["rule"]  # as the previous release wrote it
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="older evaluation rule"):
        sweep_heads(strong_model, metric="repeat", heads=[Head(0, 0)], out=out, resume=True)


def test_role_experiments_and_their_report_block(strong_model, tmp_path):
    from headlens.ablation.ablate import role_experiments
    from headlens.reports import render_report

    results = role_experiments(strong_model, control=3, seed=1, labels=LABELS)
    metas = [r.meta for r in results]
    assert [(r["metric"], r["heads"]) for r in metas] == [("repeat", ["1.1", "1.2"]), ("needle", ["1.1"])]
    assert all(len(r["control"]["deltas"]) == 3 for r in metas)
    path = tmp_path / "r.html"
    render_report(path, model_info={"name": "strong"}, ablation=results)
    page = path.read_text(encoding="utf-8")
    assert "Roles against random heads" in page and "heads labelled retrieval by the labels given" in page


def test_a_role_no_head_has_names_the_head_that_scored_highest(strong_model):
    """Resolved by classifying the model, an absent role's error says which head came highest on the kind's
    ranking score, as classify's note does (read here from the same default classification)."""
    from headlens.classify import classify_heads
    from headlens.classify.kinds import BY_LABEL

    frame = classify_heads(strong_model).frame.sort_values(["layer", "head"]).reset_index(drop=True)
    carried = {label for labels in frame["labels"] for label in labels}
    role = next(label for label in ("successor", "rare_word", "name_mover", "copy_suppression") if label not in carried)
    score = BY_LABEL[role].score
    best = frame.loc[frame[score].idxmax()]
    with pytest.raises(ConfigError) as caught:
        resolve_heads(strong_model, role)
    message = str(caught.value)
    assert message.startswith(f"no head of this model is labelled {role} by classifying the model")
    assert f"highest {score} at {int(best['layer'])}.{int(best['head'])}: {score} {best[score]:.2f}" in message
