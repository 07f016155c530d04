"""Circuit tasks beyond induction and IOI: Greater-than and a user's own task from a JSONL file.

- `greater_than_task` (Hanna et al. 2023, arXiv 2305.00586): "The war lasted from the year 1732 to the
  year 17"; the metric is the probability on later years minus the probability on years up to the
  start's (over the next token); the counterfactual starts in the year ..01. Where every two-digit
  year "00".."99" is one token (GPT-2) this is the paper's task. Where the tokenizer spells digits one
  by one (SmolLM2, Gemma 3, byte-level models), the task adapts to the last digit: "...from the year
  1732 to the year 173" with the next digit compared with 2 (P(digit > 2) - P(digit <= 2)); the
  counterfactual starts in the year 1730. A tokenizer that does neither is refused.
- `file_task`: one JSON object per line, {"prompt", "answer" | "answers", "counterfactual", "wrong" |
  "wrong_answers"}; the metric is the mean logit of the answers minus the mean logit of the wrong
  answers at the prompt's last position, each answer one token; the counterfactual must be as many
  tokens as the prompt. A malformed line: InputTextError naming the file and line.
- `variants`: two template sets of a task, for the stability of its circuit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from headlens.circuits.readout import MetricTerms
from headlens.circuits.tasks import Task, induction_task, ioi_task
from headlens.errors import ConfigError, InputTextError
from headlens.intervene.evalset import json_objects
from headlens.probes.tokenize import encode

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

NOUNS = ("war", "dynasty", "conflict", "empire", "reign", "siege", "treaty", "expedition", "famine", "revolt")
GT_PROMPTS = 48


def _ids(tokenizer, text: str) -> list[int]:
    return encode(tokenizer, text)


def _digit_tokens(tokenizer, width: int) -> list[int] | None:
    """Token ids of "0".."9" (width 1) or "00".."99" (width 2), or None where one is not a single token."""
    ids = [_ids(tokenizer, f"{n:0{width}d}") for n in range(10**width)]
    return [i[0] for i in ids] if all(len(i) == 1 for i in ids) else None


def greater_than_task(loaded: LoadedModel, n: int = GT_PROMPTS, seed: int = 0, nouns=NOUNS) -> Task:
    """Greater-than prompts (module docstring), seeded; two-digit or last-digit form by the tokenizer."""
    tok, bos = loaded.tokenizer, loaded.bos_token_id
    pairs, digits = _digit_tokens(tok, 2), _digit_tokens(tok, 1)
    if pairs is None and digits is None:
        raise ConfigError("greater-than needs years spelled as two-digit tokens or as single digits")
    width = 2 if pairs is not None else 1
    table = pairs if pairs is not None else digits
    gen = torch.Generator().manual_seed(seed)
    clean, corrupt, starts = [], [], []
    for _ in range(n):
        noun = nouns[int(torch.randint(len(nouns), (1,), generator=gen))]
        century = int(torch.randint(11, 18, (1,), generator=gen))
        if width == 2:
            yy = int(torch.randint(2, 99, (1,), generator=gen))
            head, low, shown = f"{century}", f"{century}01", f"{century}{yy:02d}"
        else:
            decade, yy = int(torch.randint(0, 10, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
            head, low, shown = f"{century}{decade}", f"{century}{decade}0", f"{century}{decade}{yy}"
        text = "The {} lasted from the year {} to the year {}"
        clean.append(_ids(tok, text.format(noun, shown, head)))
        corrupt.append(_ids(tok, text.format(noun, low, head)))
        starts.append(yy)
    rows, weights, tokens = [], [], []
    for i, yy in enumerate(starts):
        for value, token in enumerate(table):
            rows.append(i)
            tokens.append(token)
            weights.append(1.0 if value > yy else -1.0)
    terms = MetricTerms("prob", torch.tensor(rows), torch.tensor(tokens), torch.tensor(weights, dtype=torch.float64))
    form = "two-digit years" if width == 2 else "last digit (the tokenizer spells digits one by one)"
    description = f"{n} Greater-than prompts, {form}: P(later) - P(up to the start) (seed {seed})"
    return _task("greater-than", bos, clean, corrupt, terms, "probability", description)


def _task(name, bos, clean, corrupt, terms, unit, description) -> Task:
    """A Task of prompts read at their last token, right-padded; clean and counterfactual alike in length."""
    seqs = [([bos] if bos is not None else []) + c for c in clean]
    others = [([bos] if bos is not None else []) + c for c in corrupt]
    length = max(len(s) for s in seqs)
    pad = bos if bos is not None else 0
    tokens = torch.full((len(seqs), length), pad, dtype=torch.long)  # [n, pos]
    corrupted, mask = tokens.clone(), torch.zeros(len(seqs), length, dtype=torch.bool)  # [n, pos]
    where = torch.zeros_like(mask)  # [n, pos]
    for row, (s, o) in enumerate(zip(seqs, others, strict=True)):
        tokens[row, : len(s)], corrupted[row, : len(o)], mask[row, : len(s)] = torch.tensor(s), torch.tensor(o), True
        where[row, len(s) - 1] = True
    zeros = torch.zeros_like(tokens)
    return Task(name, tokens, mask, where, zeros, None, corrupted, terms.kind, unit, True, description, terms=terms)


def file_task(loaded: LoadedModel, path) -> Task:
    """The user's task of a JSONL file (module docstring)."""
    path = Path(path)
    tok = loaded.tokenizer
    clean, corrupt, rows, tokens, weights = [], [], [], [], []
    example = '{"prompt": ..., "answer": ..., "counterfactual": ..., "wrong": ...}'
    for where, obj in json_objects(path, "--task-file", example):
        _check_fields(obj, where)
        prompt, other = _ids(tok, obj["prompt"]), _ids(tok, obj["counterfactual"])
        if len(prompt) != len(other):
            raise InputTextError(
                f"{where}: prompt is {len(prompt)} tokens, counterfactual {len(other)}; make them equal"
            )
        good, bad = (
            _answers(tok, obj, ("answer", "answers"), where),
            _answers(tok, obj, ("wrong", "wrong_answers"), where),
        )
        for ids, sign in ((good, 1.0), (bad, -1.0)):
            rows += [len(clean)] * len(ids)
            tokens += ids
            weights += [sign / len(ids)] * len(ids)
        clean.append(prompt)
        corrupt.append(other)
    if not clean:
        raise InputTextError(f"{path} holds no tasks")
    terms = MetricTerms("logit", torch.tensor(rows), torch.tensor(tokens), torch.tensor(weights, dtype=torch.float64))
    description = f"{len(clean)} prompts from {path.name}: mean logit of the answers - of the wrong answers"
    return _task(path.stem, loaded.bos_token_id, clean, corrupt, terms, "logits", description)


def _check_fields(obj: dict, where: str) -> None:
    for key in ("prompt", "counterfactual"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise InputTextError(f"{where}: missing or empty string field {key!r}")


def _answers(tok, obj: dict, keys: tuple[str, str], where: str) -> list[int]:
    """Token ids of a field given as one string (`keys[0]`) or a list of strings (`keys[1]`)."""
    value = obj.get(keys[0], obj.get(keys[1]))
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise InputTextError(f"{where}: give {keys[0]!r} (a string) or {keys[1]!r} (a list of strings)")
    ids = []
    for text in values:
        got = _ids(tok, text)
        if len(got) != 1:
            raise InputTextError(f"{where}: {text!r} is {len(got)} tokens; each answer must be one token")
        ids.append(got[0])
    return ids


def variants(loaded: LoadedModel, name: str, seed: int = 0):
    """Two template sets of task `name` (IOI: even and odd templates; Greater-than: two halves of the
    nouns; induction: two seeds' random tokens), or None for a user's task."""
    if name == "ioi":
        from headlens.scores.name_mover import TEMPLATES

        return [ioi_task(loaded, seed=seed, templates=TEMPLATES[part::2]) for part in (0, 1)]
    if name == "greater-than":
        return [greater_than_task(loaded, seed=seed, nouns=NOUNS[part::2]) for part in (0, 1)]
    if name == "induction":
        return [induction_task(loaded, seed=seed + 100 * part) for part in (1, 2)]
    return None


def circuit_task(
    loaded: LoadedModel, name: str, prompts: list[dict] | None = None, task_file=None, seed: int = 0
) -> Task:
    """The task a circuit is found on: `task_file` (a user's task), greater-than, or induction / ioi."""
    if task_file is not None:
        return file_task(loaded, task_file)
    if name == "greater-than":
        return greater_than_task(loaded, seed=seed)
    from headlens.circuits.tasks import make_task

    return make_task(loaded, name, prompts=prompts, seed=seed)
