"""The classify runs of the kinds measured past the four first probes: name movers (IOI prompts), copy
suppression, successor, rare-word and syntactic heads. Each run reads its inputs (headlens.probes), calls its kind's
score functions (headlens.scores: tensors in, tensors out) and returns a ProbeResult; the registry names each
one in headlens.classify.kinds.PROBES ("module:function", imported when it runs)."""

from __future__ import annotations

import torch

from headlens.classify import kinds
from headlens.classify.runs import ProbeResult
from headlens.classify.stability import Units, per_unit
from headlens.classify.vocab_cache import cached_criteria
from headlens.errors import ConfigError, InputTextError
from headlens.probes.inputs import text_windows
from headlens.scores.copy_suppression import WINDOW, window_attention
from headlens.scores.name_mover import (
    COPY_KEYS,
    COPY_TOP_K,
    N_PROMPTS,
    NAMES,
    SCORE_KEYS,
    SOURCE_TEMPLATES,
    ioi_prompts,
    ioi_run,
    name_tokens,
)
from headlens.scores.ov_circuit import own_extremes
from headlens.scores.ov_vocab import cs_ov_vocab
from headlens.scores.qk_vocab import cs_qk_vocab
from headlens.scores.rare_word import TOKEN_SHARE as RARE_TOKEN_SHARE
from headlens.scores.rare_word import rare_sentences, rare_word_scores
from headlens.scores.successor import successor_scores, successor_tasks
from headlens.scores.syntactic import TOKEN_SHARE as SYNTAX_TOKEN_SHARE
from headlens.scores.syntactic import load_treebank, relation_accuracy, syntactic_frame, syntax_sample

CS = ("cs_ov_score", "cs_qk_score")  # sampled over the vocabulary: resampled from their standard errors
SOURCE_SAMPLE = "shipped_treebank"  # the syntactic probe's input: the CoNLL-U sample shipped with headlens
SAMPLE_NAME = "sample"  # `--syntax sample`: the shipped sample
NOT_RUN = (
    "the syntactic probe runs only when asked (--syntax sample, or --syntax FILE.conllu): it is the costliest probe"
)


def probe_name_mover(run) -> ProbeResult:
    """The classify probe (headlens.classify.kinds.PROBES["ioi"]): the END attention scores and their stds,
    the two copy scores, the model's own IOI logit difference (`ioi_logit_diff`, also a frame column)
    and the share of prompts with IO above S. NaN scores (no label) when the tokenizer spells fewer
    than two NAMES as one token: `ioi_missing` says so in English, `ioi_names` of `ioi_names_total`
    counts the single-token names for a page to say it in its language."""
    loaded, spec = run.loaded, run.loaded.spec
    n = min(N_PROMPTS, max(2, run.config.token_budget // 4))
    try:
        prompts = ioi_prompts(loaded.tokenizer, loaded.bos_token_id, n, run.config.seed)
    except ConfigError as exc:
        nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
        scores = {key: nan.clone() for key in SCORE_KEYS + COPY_KEYS}
        counts = {"n_ioi_prompts": 0, "ioi_logit_diff": float("nan")}
        names = {
            "ioi_names": len(name_tokens(loaded.tokenizer)),
            "ioi_names_total": len(NAMES),
        }  # the reason, as counts
        return ProbeResult(scores, counts, {"ioi_missing": str(exc), **names, **counts}, SOURCE_TEMPLATES)
    result = ioi_run(loaded, prompts)
    names = torch.tensor(sorted(set(name_tokens(loaded.tokenizer).values())))  # [n_names]
    top, bottom = own_extremes(loaded.model, names, COPY_TOP_K)  # [layer, head, n_names] each
    scores = {key: result[key] for key in SCORE_KEYS}
    scores.update(name_copy_score=top.double().mean(-1), name_negative_copy_score=bottom.double().mean(-1))
    counts = {"n_ioi_prompts": len(prompts), "ioi_logit_diff": result["logit_diff"]}
    facts = {**counts, "ioi_correct_share": float((result["logit_diffs"] > 0).double().mean()), "ioi_names": len(names)}
    kept = Units({key: per_unit(values) for key, values in result["per_prompt"].items()})
    return ProbeResult(scores, counts, facts, SOURCE_TEMPLATES, kept)


def qk_gate_layers(ov_score: torch.Tensor, ov_min: float) -> list[int]:
    """The layers whose QK criterion is scored: those with a head whose OV score (ov_score [layer, head])
    reaches the OV cut-off. A head is labelled only when both criteria hold, so the labels are those of
    scoring every layer; elsewhere cs_qk_score is NaN (not scored), and a head there is not labelled
    under a lower cs_ov cut-off applied later to the frame. The QK criterion ranks each token's key
    among the whole vocabulary's, its cost per layer (headlens.scores.qk_vocab, BENCHMARKS.md)."""
    return (ov_score >= ov_min).any(-1).nonzero().flatten().tolist()


def vocab_criteria(run) -> dict:
    """Copy suppression's OV criterion in every layer and its QK criterion in qk_gate_layers, over the
    vocabulary (headlens.scores.ov_vocab, qk_vocab; the same seeded tokens): scores, standard errors and
    95% half-widths [layer, head] (headlens.classify.vocab_cache.TENSORS) and the facts classify reports."""
    model, seed = run.loaded.model, run.config.seed
    ov = cs_ov_vocab(model, seed=seed, progress=run.progress)  # [layer, head] each
    layers = qk_gate_layers(ov["cs_ov_score"], run.config.cs_ov_min)
    qk = cs_qk_vocab(model, seed=seed, layers=layers, progress=run.progress)  # [layer, head] each
    ov_half, qk_half = (ov["ci_high"] - ov["ci_low"]) / 2, (qk["ci_high"] - qk["ci_low"]) / 2  # [layer, head]
    facts = {
        "cs_ov_tokens": ov["sample"],
        "cs_ov_screen": ov["screen"],
        "cs_ov_exact": ov["exact"],
        "cs_ov_ci_max": float(ov_half.max()),
        "cs_qk_ci_max": float(qk_half.nan_to_num(0.0).max()),
        "cs_qk_layers": layers,
    }
    return {
        "cs_ov_score": ov["cs_ov_score"],
        "cs_qk_score": qk["cs_qk_score"],
        "ov_se": ov["se"],
        "qk_se": qk["se"],
        "ov_ci_half": ov_half,
        "qk_ci_half": qk_half,
        "facts": facts,
    }


def probe_copy_suppression(run) -> ProbeResult:
    """The classify probe (headlens.classify.kinds.PROBES["copy_suppression"]): `cs_ov_score` and
    `cs_qk_score` over the vocabulary with their sampling standard errors `cs_ov_score_std`,
    `cs_qk_score_std` (headlens.scores.ov_vocab, headlens.scores.qk_vocab: a fixed cost, not the token
    budget's; the QK criterion in qk_gate_layers only; both kept in headlens's cache by
    headlens.classify.vocab_cache), `predicted_attention` and its `predicted_attention_std` across
    windows of the text, sized by the token budget. NaN predicted_attention (no label) when no
    position of the text counts."""
    loaded, budget = run.loaded, run.config.token_budget
    window = min(WINDOW, run.sizes["window"])
    n_windows = max(1, 2 * budget // window)
    windows = text_windows(loaded.tokenizer, run.haystack, window, loaded.bos_token_id, max_windows=n_windows)
    config = run.config
    vocab = cached_criteria(loaded, config.seed, config.cs_ov_min, lambda: vocab_criteria(run))
    scores = {"cs_ov_score": vocab["cs_ov_score"], "cs_ov_score_std": vocab["ov_se"]}  # [layer, head] each
    scores.update(cs_qk_score=vocab["cs_qk_score"], cs_qk_score_std=vocab["qk_se"])  # [layer, head] each
    try:
        attention, std, count = window_attention(loaded, windows)  # [layer, head] x 2
    except InputTextError:
        attention, count = torch.full_like(scores["cs_ov_score"], float("nan")), 0
        std = attention.clone()
    scores.update(predicted_attention=attention, predicted_attention_std=std)
    facts = {
        **vocab["facts"],
        "cs_windows": len(windows),
        "cs_window": window,
        "cs_positions": count,
    }
    sampled = {column: (scores[column].double().numpy(), scores[f"{column}_std"].double().numpy()) for column in CS}
    return ProbeResult(scores, {"n_cs_positions": count}, facts, run.text_source, Units(normal=sampled))


def probe_syntactic(run) -> ProbeResult:
    """The classify probe (headlens.classify.kinds.PROBES["syntactic"]): syntactic_score (best margin over
    the relations) and syntactic_accuracy (the accuracy on that relation) on `config.syntax` or the
    shipped sample; NaN (no label) when no relation has MIN_CASES instances."""
    loaded, spec, window = run.loaded, run.loaded.spec, run.sizes["window"]
    if run.config.syntax is None:
        nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
        return ProbeResult(
            {"syntactic_score": nan, "syntactic_accuracy": nan.clone()},
            {},
            {"syntactic_missing": NOT_RUN},
            kinds.SOURCE_NOT_RUN,
        )
    treebank = load_treebank(None if run.config.syntax == SAMPLE_NAME else run.config.syntax)
    sample = syntax_sample(
        loaded.tokenizer,
        treebank,
        loaded.bos_token_id,
        window,
        int(SYNTAX_TOKEN_SHARE * run.config.max_windows * window),
    )
    facts = {"n_sentences": len(sample.sentences), "n_skipped": sample.n_skipped, "relations": []}
    source = SOURCE_SAMPLE if run.config.syntax == SAMPLE_NAME else str(run.config.syntax)
    if sample.relations.empty:
        nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
        return ProbeResult(
            {"syntactic_score": nan, "syntactic_accuracy": nan.clone()}, {}, {"syntactic": facts}, source
        )
    accuracy = relation_accuracy(loaded, sample, run.config.batch_size)  # [relation, layer, head]
    baseline = torch.tensor(sample.relations["baseline"].tolist(), dtype=torch.float64)  # [relation]
    margin = accuracy - baseline[:, None, None]  # [relation, layer, head]
    best = margin.argmax(0)  # [layer, head]
    frame = syntactic_frame(accuracy, sample.relations, run.config.syntactic_min)
    facts["relations"] = sample.relations.to_dict("records")
    facts["heads"] = {}  # "layer.head" -> every relation the head is syntactic for
    for r in frame[frame["syntactic"]].itertuples():
        facts["heads"].setdefault(f"{r.layer}.{r.head}", []).append(r.relation)
    facts["best_relation"] = [[sample.relations["relation"][int(i)] for i in row] for row in best.tolist()]
    scores = {"syntactic_score": margin.max(0).values, "syntactic_accuracy": accuracy.gather(0, best[None])[0]}
    counts = {"n_syntax_sentences": len(sample.sentences)}
    return ProbeResult(scores, counts, {"syntactic": facts}, source)


def probe_successor(run):
    """The classify probe (headlens.classify.kinds.PROBES["successor"]): successor_score from the weights;
    NaN (no label) when the tokenizer spells no task with single tokens."""
    tasks = successor_tasks(run.loaded.tokenizer)
    spec = run.loaded.spec
    if not tasks:
        return ProbeResult({"successor_score": torch.full((spec.n_layers, spec.n_heads), float("nan"))})
    scores = successor_scores(run.loaded.model, tasks)  # [layer, head]
    return ProbeResult({"successor_score": scores}, facts={"successor_tasks": {t.name: len(t.tokens) for t in tasks}})


def probe_rare_word(run) -> ProbeResult:
    """The classify probe (headlens.classify.kinds.PROBES["rare_word"]): rare_word_score on the natural text's
    sentences; NaN (no label) when no sentence of the text can be scored."""
    loaded = run.loaded
    spec = loaded.spec
    window = run.sizes["window"]
    sentences, skipped = rare_sentences(
        loaded.tokenizer,
        run.documents,
        loaded.bos_token_id,
        window,
        int(RARE_TOKEN_SHARE * run.config.max_windows * window),
    )
    facts = {"n_sentences": len(sentences), "skipped": skipped}
    if not sentences:
        nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
        return ProbeResult({"rare_word_score": nan}, {"n_rare_sentences": 0}, {"rare_word": facts}, run.text_source)
    scores = rare_word_scores(loaded, sentences, run.config.batch_size)  # [layer, head]
    facts["last_word"] = sum(s.last_word for s in sentences) / len(sentences)
    facts["chance"] = sum(len(s.targets) / s.query for s in sentences) / len(sentences)
    counts = {"n_rare_sentences": len(sentences)}
    return ProbeResult({"rare_word_score": scores}, counts, {"rare_word": facts}, run.text_source)
