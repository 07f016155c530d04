"""Syntactic heads (headlens.scores.syntactic, headlens.probes.treebank): the CoNLL-U reader, Clark et al.'s
word pooling against loops, patterns built from the shipped sample's parses (a head attending from
each dependent to its head scores 1 on those relations; a fixed-offset head never beats the baseline,
computed here from the file), the CLI's bad-treebank error, and SmolLM2 against its eager attention."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from headlens.capture import Batch, pad_batch
from headlens.classify import classify_heads
from headlens.classify.labels import ClassifyConfig
from headlens.errors import InputTextError
from headlens.load.models import gpt2_tokenizer, load_model
from headlens.probes.treebank import read_conllu, relation_of
from headlens.scores import syntactic
from headlens.scores.syntactic import (
    DEP_TO_HEAD,
    MAX_OFFSET,
    MIN_CASES,
    SYNTACTIC_MIN,
    SyntacticReducer,
    load_treebank,
    pooled_words,
    predictions,
    syntactic_frame,
    syntax_sample,
)
from tests.helpers.kinds_checks import eager_relation_accuracy, small_sample

BOS = 50256
CONLLU = """# text = I don't like cheese.
1\tI\t_\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\t_\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\t_\tPART\t_\t_\t4\tadvmod\t_\t_
4\tlike\t_\tVERB\t_\t_\t0\troot\t_\t_
5\tcheese\t_\tNOUN\t_\t_\t4\tobj\t_\tSpaceAfter=No
5.1\tate\t_\tVERB\t_\t_\t_\t_\t4:conj\t_
6\t.\t_\tPUNCT\t_\t_\t4\tpunct\t_\t_

"""


def test_conllu_words_skip_multiword_tokens_and_empty_nodes(tmp_path):
    path = tmp_path / "s.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    (sentence,) = read_conllu(path)
    assert [w.form for w in sentence.words] == ["I", "do", "n't", "like", "cheese", "."]
    assert [w.head for w in sentence.words] == [4, 4, 4, 0, 4, 4]
    assert [w.no_space for w in sentence.words] == [False, True, False, False, True, False]
    assert relation_of("nmod:poss") == "poss" and relation_of("nsubj:pass") == "nsubj"


def test_a_malformed_treebank_is_one_line_naming_the_line(tmp_path):
    path = tmp_path / "bad.conllu"
    path.write_text("1\tI\t_\n", encoding="utf-8")
    with pytest.raises(InputTextError, match=r"bad.conllu:1 is not CoNLL-U: 3 tab-separated fields"):
        read_conllu(path)
    from headlens.cli.main import cli

    result = CliRunner().invoke(cli, ["classify", "tiny", "--syntax", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.conllu:1 is not CoNLL-U" in lines[0]


def test_pooling_sums_keys_and_averages_queries_as_loops_do():
    gen = torch.Generator().manual_seed(0)
    pattern = torch.rand(2, 3, 7, 7, generator=gen, dtype=torch.float64).tril()
    pattern /= pattern.sum(-1, keepdim=True)  # [batch, head, q, k]
    word_of = torch.tensor([[-1, 0, 0, 1, 2, 2, 2], [-1, 0, 1, 1, 1, 2, -1]])  # [batch, pos]
    pooled = pooled_words(pattern, word_of, 3)  # [batch, head, word, word]
    for b in range(2):
        for i in range(3):
            queries = [q for q in range(7) if word_of[b, q] == i]
            for j in range(3):
                keys = [k for k in range(7) if word_of[b, k] == j]
                manual = sum(pattern[b, :, q, keys].sum(-1) for q in queries) / len(queries)  # [head]
                assert torch.allclose(pooled[b, :, i, j], manual, rtol=1e-12, atol=0)
    best = predictions(pooled)
    assert (best[..., 0] == -1).all() and (best[..., 1] == 0).all()  # word 1 has one earlier word


@pytest.fixture(scope="module")
def sample():
    return syntax_sample(gpt2_tokenizer(), load_treebank(), BOS, 256, 10**9)


def file_relations(keep: set[int]) -> dict[str, list[tuple[bool, int]]]:
    """Per relation, (direction is dependent->head, gap in words) of every instance of the sentences
    numbered in `keep`, read from the sample file here (not through headlens.probes.treebank)."""
    out: dict[str, list[tuple[bool, int]]] = {}
    text = (syntactic.sample_path()).read_text(encoding="utf-8")
    for number, block in enumerate(text.strip().split("\n\n")):
        if number not in keep:
            continue
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            wid, head, rel = int(cols[0]), int(cols[6]), cols[7]
            if head:
                rel = "poss" if rel == "nmod:poss" else rel.split(":")[0]
                out.setdefault(rel, []).append((head < wid, abs(head - wid)))
    return out


def test_baselines_match_offsets_counted_from_the_file(sample):
    tok = gpt2_tokenizer()
    aligned = {i for i, tree in enumerate(load_treebank()) if syntactic.align(tok, tree, BOS) is not None}
    counted = file_relations(aligned)
    # GPT-2 glues a few punctuation pairs (",)") and "cannot" into one token: those sentences are skipped
    assert len(sample.sentences) == len(aligned) >= 390 and sample.n_skipped == 400 - len(aligned)
    assert {"nsubj", "obj", "det", "case", "advmod", "aux", "poss"} <= set(sample.relations["relation"])
    for rel in sample.relations.to_dict("records"):
        forward = sum(d for d, _ in counted[rel["relation"]])
        way = DEP_TO_HEAD if forward >= len(counted[rel["relation"]]) - forward else "head->dependent"
        gaps = [g for d, g in counted[rel["relation"]] if d == (way == DEP_TO_HEAD)]
        shares = {k: gaps.count(k) / len(gaps) for k in range(1, MAX_OFFSET + 1)}
        assert rel["direction"] == way and rel["n"] == len(gaps) >= MIN_CASES
        assert rel["baseline"] == pytest.approx(max(shares.values()), abs=1e-12)
        assert shares[-rel["offset"]] == max(shares.values())
    assert sample.relations.set_index("relation").loc["det", "direction"] == "head->dependent"
    assert sample.relations.set_index("relation").loc["obj", "direction"] == DEP_TO_HEAD


def score_patterns(sample, build) -> torch.Tensor:
    """Accuracy [relation, 1, 1] of a one-head model whose pattern for each sentence is build(sentence)."""
    relations = list(sample.relations["relation"])
    reducer = SyntacticReducer(1, 1, sample.sentences, relations)
    for start in range(0, len(sample.sentences), 8):
        chunk = sample.sentences[start : start + 8]
        ids, mask = pad_batch([s.ids for s in chunk], pad_id=BOS)
        pattern = torch.zeros(len(chunk), 1, ids.shape[1], ids.shape[1], dtype=torch.float64)
        for b, sentence in enumerate(chunk):
            n = len(sentence.ids)
            pattern[b, 0, :n, :n] = build(sentence)
        batch = Batch(ids, mask, index=start // 8, offset=start)
        half = ids.shape[1] // 2  # in two blocks of query rows, as the lean capture hands them
        reducer.update(0, batch, pattern=pattern[:, :, :half], q_start=0)
        reducer.update(0, batch, pattern=pattern[:, :, half:], q_start=half)
    n = torch.tensor(sample.relations["n"].tolist(), dtype=torch.float64)
    return reducer.hits / n[:, None, None]


def parse_pattern(tree_heads):
    """Each token of word i attends to the first token of word i's head when the head is earlier,
    else to BOS."""

    def build(sentence):
        n = len(sentence.ids)
        pattern = torch.zeros(n, n, dtype=torch.float64)
        pattern[:, 0] = 1.0
        heads = tree_heads[tuple(sentence.ids)]
        for q, word in enumerate(sentence.word_of):
            if word >= 0 and 0 <= heads[word] < word:
                pattern[q] = 0.0
                pattern[q, sentence.word_of.index(heads[word])] = 1.0
        return pattern

    return build


def offset_pattern(k: int):
    """Each token attends to the first token of the word k words back (BOS when there is none)."""

    def build(sentence):
        n = len(sentence.ids)
        pattern = torch.zeros(n, n, dtype=torch.float64)
        pattern[:, 0] = 1.0
        for q, word in enumerate(sentence.word_of):
            if word - k >= 0:
                pattern[q] = 0.0
                pattern[q, sentence.word_of.index(word - k)] = 1.0
        return pattern

    return build


@pytest.mark.slow
def test_a_head_attending_to_each_words_head_is_syntactic_exactly_where_the_parse_says(sample):
    tok = gpt2_tokenizer()
    tree_heads = {}
    for tree in load_treebank():
        aligned = syntactic.align(tok, tree, BOS)
        if aligned is not None:
            tree_heads[tuple(aligned.ids)] = [w.head - 1 for w in tree.words]
    accuracy = score_patterns(sample, parse_pattern(tree_heads))  # [relation, 1, 1]
    frame = syntactic_frame(accuracy, sample.relations)
    for row in frame.to_dict("records"):
        if row["direction"] == DEP_TO_HEAD:
            assert row["accuracy"] == 1.0 and row["margin"] == pytest.approx(1 - row["baseline"])
            assert row["syntactic"] == (1 - row["baseline"] >= SYNTACTIC_MIN)
    assert frame.set_index("relation").loc["obj", "syntactic"]


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_a_fixed_offset_head_scores_its_offsets_share_and_is_never_syntactic(sample, k):
    accuracy = score_patterns(sample, offset_pattern(k))
    frame = syntactic_frame(accuracy, sample.relations)
    assert not frame["syntactic"].any()
    for row in frame.to_dict("records"):
        gaps = [
            later - earlier
            for s in sample.sentences
            for later, earlier, rel, _ in s.instances
            if rel == row["relation"]
        ]
        assert row["accuracy"] == pytest.approx(gaps.count(k) / len(gaps), abs=1e-12)


# SmolLM2 against its own eager attention -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_accuracy_matches_its_eager_attention(real_model, monkeypatch):
    loaded = real_model("smollm2")
    sample = small_sample(loaded, monkeypatch)
    ours = syntactic.relation_accuracy(loaded, sample, batch_size=4)  # [relation, layer, head]
    assert torch.equal(ours, eager_relation_accuracy(loaded, sample))


@pytest.mark.slow
def test_the_probe_runs_only_when_a_treebank_is_asked_for(classify_cli):
    """Without --syntax the syntactic probe (the costliest) does not run and the note says how to run it;
    `--syntax sample` scores the shipped treebank."""
    skipped = classify_cli("tiny")  # `headlens classify tiny --format json --no-progress`
    assert skipped.exit_code == 0, skipped.output
    assert "no syntactic-head scores" in skipped.stderr and "--syntax sample" in skipped.stderr
    heads = classify_heads(load_model("tiny"), config=ClassifyConfig(n_seq=2, max_windows=2, syntax="sample"))
    assert (heads.frame["syntax_source"] == "shipped_treebank").all() and heads.meta["probes"]["syntactic"][
        "n_sentences"
    ] > 0
    assert "syntactic_missing" not in heads.meta["probes"]
