"""Evaluation sets from prompts and needles.

Prompts (`--prompts FILE.jsonl`): one JSON object per line, `{"prompt": ..., "target": ...,
"foil": ...}` (`foil` optional, needed by `logit-diff`), e.g. the indirect-object prompt
"After John and Mary went to the store, Mary gave a bottle of milk to" with target " John" and
foil " Mary" (Wang et al. 2022). Each prompt is scored at its last position; the target is
appended as one more token, so the set reuses the next-token layout (position t predicts t + 1).

Needles (`needle` metric): the needle-in-a-haystack tests of the retrieval probe
(headlens.probes.needle_prompts, Wu et al. 2024 adapted to small contexts), scored teacher-forced:
the sequence is the prompt followed by the rest of the needle, and each asked-for needle token
counts 1 when it is the model's top prediction given the true earlier ones. Free greedy decoding
(the retrieval probe's) would let one miss derail the rest; teacher forcing scores each token alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from headlens.ablation.evalset import EvalSet, pad
from headlens.errors import ConfigError, InputTextError
from headlens.probes import check_text, default_text, needle_prompts, random_token_range


def read_prompts(path) -> list[dict]:
    """The prompts of a JSONL file: dicts with `prompt`, `target`, `foil` (or None) and `line`.

    InputTextError naming the line for bad JSON, a non-object, a missing or non-string field;
    blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise InputTextError(f"prompts file not found: {path}")
    text = check_text(path.read_bytes(), str(path))
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputTextError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise InputTextError(f"{where}: expected an object like {{\"prompt\": ..., \"target\": ...}}")
        for key in ("prompt", "target"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise InputTextError(f"{where}: missing or empty string field {key!r}")
        foil = obj.get("foil")
        if foil is not None and (not isinstance(foil, str) or not foil):
            raise InputTextError(f"{where}: field 'foil' must be a non-empty string")
        prompts.append({"prompt": obj["prompt"], "target": obj["target"], "foil": foil, "line": where})
    if not prompts:
        raise InputTextError(f"{path} holds no prompts")
    return prompts


def _one_token(tokenizer, text: str, field: str, where: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InputTextError(f"{where}: {field} {text!r} is {len(ids)} tokens; give a single token "
                             "(often a word with its leading space, e.g. \" John\")")
    return int(ids[0])


def prompt_evalset(loaded, prompts: list[dict], metric: str) -> EvalSet:
    """One sequence per prompt, BOS + prompt + target, scoring the prediction of the target."""
    tok, bos, n_ctx = loaded.tokenizer, loaded.bos_token_id, loaded.spec.n_ctx
    seqs, targets, foils = [], [], []
    for item in prompts:
        ids = tok(item["prompt"], add_special_tokens=False)["input_ids"]
        target = _one_token(tok, item["target"], "target", item["line"])
        foil = _one_token(tok, item["foil"], "foil", item["line"]) if item["foil"] is not None else -1
        if metric == "logit-diff" and foil < 0:
            raise InputTextError(f"{item['line']}: metric logit-diff needs a 'foil' on every line")
        if 2 + len(ids) > n_ctx:
            raise InputTextError(f"{item['line']}: prompt is {len(ids)} tokens; this model's context of {n_ctx} "
                                 f"holds at most {n_ctx - 2} (with BOS and the target)")
        seqs.append([bos, *ids, target])
        targets.append(target)
        foils.append(foil)
    ids, mask = pad(seqs, bos)
    last = mask.sum(1) - 2  # [n_seq] the position that predicts the target
    counted = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)  # [n_seq, pos-1]
    counted[torch.arange(len(seqs)), last] = True
    foil_ids = torch.zeros_like(counted, dtype=torch.long)  # [n_seq, pos-1]
    foil_ids[torch.arange(len(seqs)), last] = torch.tensor(foils).clamp(min=0)
    digest = hashlib.sha256(json.dumps([[p["prompt"], p["target"], p["foil"]] for p in prompts]).encode()).hexdigest()
    description = f"{len(seqs)} prompt{'s' * (len(seqs) > 1)}, BOS first, scored at the last position"
    return EvalSet(ids, mask, counted, metric, digest, description, foils=foil_ids if min(foils) >= 0 else None)


def needle_evalset(loaded, text: str | None, seed: int = 0, needle_len: int = 16, restate: int = 4) -> EvalSet:
    """Needle-in-a-haystack tests in `text` (default: the shipped held-out text), teacher-forced:
    each asked-for needle token (after the `restate` restated ones) is one scored position."""
    text = default_text() if text is None else check_text(text)
    spec = loaded.spec
    needle_len = min(needle_len, max(2, spec.n_ctx // 8))
    restate = min(restate, needle_len - 1)
    hay = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    tests = needle_prompts(hay, spec.n_ctx, loaded.bos_token_id, random_token_range(spec.d_vocab),
                           needle_len=needle_len, restate=restate, seed=seed)
    seqs = [test.prompt + test.needle[test.restate:] for test in tests]
    ids, mask = pad(seqs, loaded.bos_token_id)
    counted = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)  # [n_seq, pos-1]
    for row, test in enumerate(tests):
        first = len(test.prompt) - 1  # the prompt's last token predicts the first asked-for needle token
        counted[row, first:first + len(test.needle) - test.restate] = True
    if int(counted.sum()) == 0:
        raise ConfigError("needle metric: no needle token to score")
    digest = hashlib.sha256(f"needle|{seed}|{needle_len}|{restate}|".encode() + text.encode("utf-8")).hexdigest()
    description = (f"{len(tests)} needle-in-a-haystack tests ({needle_len}-token needles, {restate} restated), "
                   "teacher-forced")
    return EvalSet(ids, mask, counted, "needle", digest, description)
