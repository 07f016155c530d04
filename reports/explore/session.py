"""What the explorer computes, as JSON-ready dicts: one loaded model, its classification, and the texts typed.

Every number is a library call: patterns from headlens.classify.samples.capture_patterns, per-token losses and
top predictions from headlens.ablation.tokens.token_ablation (ablate_heads's own evaluation set,
replacements and forward passes), direct effects from headlens.scores.prediction. A typed text becomes a
`run` with its own random id (the least recently used dropped past RUNS_BYTES of patterns); every request
names its run, so two clients never read each other's text. One lock serialises the model's forward
passes: ablation installs hooks on the shared model, and hooks are global state.

Patterns go out per layer on demand, quantised to one byte per weight (0..255 of 0..1): the grid's
thumbnails max-pooled to at most THUMB_SIZE x THUMB_SIZE, one head's full pattern when opened, and one
query's row for every head of a layer (4 decimals) when a token is clicked.
"""

from __future__ import annotations

import base64
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from headlens.ablation.tokens import token_ablation
from headlens.classify.kinds import BY_LABEL, LABELS, SCORES
from headlens.classify.labels import label_list, roles_of
from headlens.classify.samples import capture_patterns
from headlens.errors import ConfigError, InputTextError
from headlens.heads import Head
from headlens.intervene.evalset import eval_context
from headlens.probes.inputs import check_text
from headlens.probes.tokenize import decode, decode_each, encode
from headlens.results import Result
from headlens.scores.prediction import prediction_direct_effects

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

MAX_TOKENS = 512  # default cap on a text's tokens (BOS not counted)
RUNS_BYTES = 1 << 30  # patterns of the typed texts kept, at most (the newest text is always kept)
THUMB_SIZE = 48  # a thumbnail's side at most, in pooled cells
ROW_DIGITS = 4  # decimals of the attention weights a clicked token's row sends
METHODS = ("zero", "mean", "resample")


class TooLong(InputTextError):
    """A text over the token cap."""


def quantised_b64(weights: torch.Tensor) -> str:
    """Weights in 0..1 as base64 of uint8 (0..255), row-major."""
    data = np.rint(np.clip(weights.float().numpy(), 0.0, 1.0) * 255).astype(np.uint8)
    return base64.b64encode(data.tobytes()).decode("ascii")


@dataclass
class Run:
    """One typed text: its token ids (BOS first), tokens as shown, and every head's pattern."""

    text: str
    ids: list[int]
    tokens: list[str]
    patterns: torch.Tensor  # [layer, head, pos, pos] float32
    clean: Result | None = None  # the last token_ablation result on this text (its unablated part is reused)


class Explorer:
    """The model, its classification frame and the typed texts; every method returns a JSON-ready dict."""

    def __init__(
        self,
        loaded: LoadedModel,
        frame: pd.DataFrame,
        max_tokens: int = MAX_TOKENS,
        seed: int = 0,
        backups: dict | None = None,
    ):
        spec = loaded.spec
        if len(frame) != spec.n_layers * spec.n_heads:
            raise ConfigError(
                f"the labels describe another model ({len(frame)} heads) than this one "
                f"({spec.n_layers} layers x {spec.n_heads} heads)"
            )
        self.loaded, self.frame, self.seed = loaded, frame.set_index(["layer", "head"]), seed
        # "L.H" -> the roles it backs up (headlens.circuits.backups.read_backups), shown in its head panel
        self.backups = dict(backups or {})
        # one ablation window (eval_context) holds BOS + the text, as `headlens ablate` cuts it
        self.max_tokens = min(max_tokens, eval_context(loaded) - 1)
        self.lock = threading.Lock()  # the model's forward passes, one at a time
        self.runs_lock = threading.Lock()  # the table of runs
        self.runs: OrderedDict[str, Run] = OrderedDict()

    # -- the model and its heads ------------------------------------------------------------------
    def labels(self) -> dict[str, list[str]]:
        """ "L.H" -> its labels, a backup's label (backup_<role>) after its classify labels."""
        return {
            f"{layer}.{head}": [*row.labels, *(b["label"] for b in self.backups.get(f"{layer}.{head}", []))]
            for (layer, head), row in self.frame.iterrows()
        }

    def model_info(self) -> dict:
        spec = self.loaded.spec
        labels = self.labels()
        present = {role for names in labels.values() for role in roles_of(names)}
        return {
            "name": self.loaded.display_name,
            "n_layers": spec.n_layers,
            "n_heads": spec.n_heads,
            "max_tokens": self.max_tokens,
            "labels": labels,
            "roles": [role for role in LABELS if role in present],
            "colours": {role: BY_LABEL[role].colour for role in LABELS if role in present},  # the registry's
            "methods": list(METHODS),
        }

    def head_scores(self, layer: int, head: int) -> dict[str, float]:
        row = self.frame.loc[(layer, head)]
        out = {}
        for score in SCORES:
            value = row.get(score.column)
            if isinstance(value, (int, float, np.number)) and np.isfinite(value):
                out[score.column] = float(value)
        return out

    def head_intervals(self, layer: int, head: int) -> dict[str, list[float]]:
        """Score column -> its 95% bootstrap interval [low, high] (headlens.classify.stability), where the
        classification has one."""
        row = self.frame.loc[(layer, head)]
        out = {}
        for score in SCORES:
            low, high = _finite(row.get(f"{score.column}_lo")), _finite(row.get(f"{score.column}_hi"))
            if low is not None and high is not None:
                out[score.column] = [low, high]
        return out

    def head_stability(self, layer: int, head: int) -> list[dict]:
        """Per label of the head with a measured stability: {label, share (of resamples that kept it), score
        (its ranking score's column), value, low, high (its 95% interval; None where not measured),
        borderline}."""
        row = self.frame.loc[(layer, head)]
        weak = set(label_list(row.get("borderline")))
        out = []
        for label in label_list(row.labels):
            share = _finite(row.get(f"{label}_stability"))
            if share is None or label not in BY_LABEL:
                continue
            column = BY_LABEL[label].score
            values = {end or "value": _finite(row.get(f"{column}{end}")) for end in ("", "_lo", "_hi")}
            out.append(
                {
                    "label": label,
                    "share": share,
                    "score": column,
                    "value": values["value"],
                    "low": values["_lo"],
                    "high": values["_hi"],
                    "borderline": label in weak,
                }
            )
        return out

    # -- a typed text -----------------------------------------------------------------------------
    def start_run(self, text: str) -> dict:
        text = check_text(text, "the text")
        tokenizer = self.loaded.tokenizer
        body = encode(tokenizer, text)
        if len(body) > self.max_tokens:
            raise TooLong(f"the text is {len(body)} tokens long; this page takes at most {self.max_tokens}")
        if len(body) < 1:
            raise InputTextError("the text has no tokens")
        ids = [self.loaded.bos_token_id] + body
        with self.lock:
            patterns = capture_patterns(self.loaded, ids)  # [layer, head, pos, pos]
        run = Run(text, ids, decode_each(tokenizer, ids), patterns)
        run_id = secrets.token_urlsafe(12)
        with self.runs_lock:
            self.runs[run_id] = run
            while len(self.runs) > 1 and sum(r.patterns.nbytes for r in self.runs.values()) > RUNS_BYTES:
                self.runs.popitem(last=False)  # the least recently used text
        return {"run": run_id, "tokens": run.tokens, "ids": ids}

    def run(self, run_id: str) -> Run:
        with self.runs_lock:
            run = self.runs.get(run_id)
            if run is None:
                raise InputTextError("unknown or expired run: submit the text again")
            self.runs.move_to_end(run_id)
        return run

    def _check(self, layer: int, head: int | None = None) -> None:
        spec = self.loaded.spec
        if not 0 <= layer < spec.n_layers:
            raise ConfigError(f"layer must be a whole number from 0 to {spec.n_layers - 1}, not {layer}")
        if head is not None and not 0 <= head < spec.n_heads:
            raise ConfigError(f"head must be a whole number from 0 to {spec.n_heads - 1}, not {head}")

    def layer_thumbs(self, run_id: str, layer: int) -> dict:
        """Every head of `layer` max-pooled to at most THUMB_SIZE cells a side: uint8 [head, size, size]."""
        self._check(layer)
        patterns = self.run(run_id).patterns[layer]  # [head, pos, pos]
        pos = patterns.shape[-1]
        size = min(pos, THUMB_SIZE)
        pooled = patterns if size == pos else torch.nn.functional.adaptive_max_pool2d(patterns, size)
        return {"layer": layer, "size": size, "thumbs_b64": quantised_b64(pooled)}  # [head, size, size]

    def head_pattern(self, run_id: str, layer: int, head: int) -> dict:
        """One head's full pattern (uint8 [q_pos, k_pos]), its labels and scores."""
        self._check(layer, head)
        pattern = self.run(run_id).patterns[layer, head]  # [q_pos, k_pos]
        return {
            "layer": layer,
            "head": head,
            "pos": int(pattern.shape[-1]),
            "pattern_b64": quantised_b64(pattern),
            "labels": self.labels()[f"{layer}.{head}"],
            "scores": self.head_scores(layer, head),
            "backups": self.backups.get(f"{layer}.{head}", []),
            "intervals": self.head_intervals(layer, head),
            "stability": self.head_stability(layer, head),
        }

    def query_row(self, run_id: str, layer: int, query: int) -> dict:
        """Where every head of `layer` sends token `query`'s attention: [head][k_pos], 4 decimals."""
        self._check(layer)
        patterns = self.run(run_id).patterns[layer]  # [head, pos, pos]
        if not 0 <= query < patterns.shape[-1]:
            raise ConfigError(f"token {query} is outside the text's {patterns.shape[-1]} positions")
        rows = patterns[:, query, : query + 1]  # [head, query + 1]
        return {"layer": layer, "query": query, "weights": [[round(float(w), ROW_DIGITS) for w in r] for r in rows]}

    # -- what removing heads changes --------------------------------------------------------------
    def ablate(self, run_id: str, heads, method: str, position: int) -> dict:
        """Per-token loss and top-5 at `position` with `heads` ("L.H" list or a role) kept and ablated."""
        run = self.run(run_id)
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        labels = {Head(*key): list(row.labels) for key, row in self.frame.iterrows()}
        spec = heads if isinstance(heads, str) else ",".join(heads)
        if not spec:
            raise ConfigError("tick at least one head, or pick a role")
        with self.lock:
            result = token_ablation(
                self.loaded, run.text, spec, method, self.seed, position, labels=labels, clean=run.clean
            )
        run.clean = result  # the unablated losses and top-5 at this position, reused next time
        meta = result.meta
        if meta["ids"] != run.ids:
            raise InputTextError("the text does not fit one window of the model's context")
        tokenizer = self.loaded.tokenizer
        shown = {key: meta[key] for key in ("heads", "method", "ids")}
        shown.update(clean=result.frame["clean"].tolist(), ablated=result.frame["ablated"].tolist())
        shown.update({key: meta[key] for key in ("loss", "loss_ablated", "position")})
        for key in ("top_clean", "top_ablated"):
            pairs = meta[key]
            names = decode_each(tokenizer, [i for i, _ in pairs])
            shown[key] = [{"token": name, "id": i, "prob": p} for name, (i, p) in zip(names, pairs, strict=True)]
        return shown

    def direct(self, run_id: str, position: int, target: str | None, foil: str | None) -> dict:
        """Every head's direct effect on the prediction after `position` (or target vs foil), [layer][head]."""
        run = self.run(run_id)
        if not 0 <= position < len(run.ids):
            raise ConfigError(f"position {position} is outside the text's {len(run.ids)} positions")
        target_id = None if not target else self.one_token(target, "target")
        foil_id = None if not foil else self.one_token(foil, "foil")
        with self.lock:
            result = prediction_direct_effects(self.loaded, run.ids, position, target_id, foil_id)
        tokenizer = self.loaded.tokenizer
        return {
            "position": position,
            "target": decode(tokenizer, [result["target"]]),
            "foil": None if foil_id is None else decode(tokenizer, [foil_id]),
            "logit": result["logit"],
            "direct": result["direct"].tolist(),  # [layer][head]
        }

    def one_token(self, text: str, what: str) -> int:
        ids = encode(self.loaded.tokenizer, text)
        if len(ids) != 1:
            raise InputTextError(f"the {what} {text!r} is {len(ids)} tokens: type one token (e.g. ' Paris')")
        return int(ids[0])


def _finite(value) -> float | None:
    """A finite number as a float; None for anything else (a missing column, NaN)."""
    return float(value) if isinstance(value, (int, float, np.number)) and np.isfinite(value) else None
