"""Dependency parses from CoNLL-U: the input of the syntactic-head probe.

CoNLL-U (Universal Dependencies): one word per line, 10 tab-separated fields (ID FORM LEMMA UPOS
XPOS FEATS HEAD DEPREL DEPS MISC), `#` comment lines, a blank line after each sentence. Multiword
tokens (ID `1-2`) and empty nodes (ID `1.1`) are skipped: the words carry the tree. A word is
followed by a space unless its MISC holds SpaceAfter=No, or it sits inside a multiword token (the
token's surface form spells its words without spaces in English: "don't" = "do" + "n't").
The English sample shipped with headlens (data/syntax/sample_en.conllu) is described in that
folder's README.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headlens.bounds import parse_count, shown
from headlens.errors import InputTextError
from headlens.files import shipped_path

SAMPLE = shipped_path("syntax") / "sample_en.conllu"


@dataclass(frozen=True)
class TreeWord:
    form: str
    head: int  # 1-based index of the word's head in its sentence; 0: the root
    deprel: str
    no_space: bool  # no space follows the word in the text


@dataclass(frozen=True)
class TreeSentence:
    words: tuple[TreeWord, ...]


def sample_path() -> Path:
    return SAMPLE


def relation_of(deprel: str) -> str:
    """The relation a deprel is scored under: its universal part ("nsubj:pass" -> "nsubj"), but
    possessives keep their own name ("nmod:poss" -> "poss", Clark et al.'s `poss`)."""
    return "poss" if deprel == "nmod:poss" else deprel.split(":")[0]


def read_conllu(path) -> list[TreeSentence]:
    """The sentences of a CoNLL-U file; InputTextError, naming the line, for a malformed one."""
    path = Path(path)
    if not path.is_file():
        raise InputTextError(f"treebank not found: {path} (give a CoNLL-U file)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputTextError(f"{path} is not valid UTF-8 (byte {exc.start}): give a CoNLL-U file") from None
    sentences, words, inside, token_glued = [], [], 0, False
    for number, line in enumerate(lines + [""], start=1):
        if not line.strip():
            if words:
                sentences.append(_checked(words, path, number))
            words, inside = [], 0
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise InputTextError(f"{path}:{number} is not CoNLL-U: {len(fields)} tab-separated fields, need 10")
        wid, form, head, deprel, misc = fields[0], fields[1], fields[6], fields[7], fields[9]
        if "-" in wid:  # a multiword token: its words are glued; its last takes the token's SpaceAfter
            inside = parse_count(wid.split("-")[1]) or 0
            token_glued = "SpaceAfter=No" in misc.split("|")
            continue
        if "." in wid:
            continue
        word_id, head_id = parse_count(wid), parse_count(head)  # ASCII digits only: never `²`
        if word_id is None or head_id is None:
            raise InputTextError(
                f"{path}:{number} is not CoNLL-U: ID {shown(wid, 40)} and HEAD {shown(head, 40)} must be integers"
            )
        glued = word_id < inside or (word_id == inside and token_glued) or "SpaceAfter=No" in misc.split("|")
        words.append(TreeWord(form, head_id, deprel, glued))
    if not sentences:
        raise InputTextError(f"{path} holds no CoNLL-U sentences")
    return sentences


def _checked(words: list[TreeWord], path: Path, number: int) -> TreeSentence:
    if any(word.head > len(words) for word in words):
        raise InputTextError(f"{path}: the sentence ending at line {number} has a HEAD beyond its words")
    return TreeSentence(tuple(words))
