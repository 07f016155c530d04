"""One `headlens classify` run as one value (`ClassifySpec`) and its one entry point (`run_classify`).

`ClassifySpec.parse` builds the ClassifyConfig from the command line's values (a flag per field, the
`--threshold NAME=VALUE` pairs, `--no-needles`), refuses a repeat probe whose random tokens alone would take
more than MAX_MEMORY_SHARE of the memory free now, opens the text and reads the treebank, so that a bad value
or file fails before any model is loaded. `run_classify` then classifies the heads (classify_heads), with
batch size `auto` at the largest batch that fits (headlens.load.devices.with_largest_batch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from headlens import distributed
from headlens.classify.frame import classify_heads
from headlens.classify.labels import THRESHOLDS, ClassifyConfig, config_with_thresholds
from headlens.errors import ConfigError
from headlens.load.devices import with_largest_batch
from headlens.probes.corpus import open_text
from headlens.probes.treebank import read_conllu
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

Say = Callable[[str], None]  # where a run's notes go (the command line: one line on stderr each)
# Share of the memory free now that the repeat probe's random tokens may take; past it the run is refused
# before it starts, instead of ending in an out-of-memory error after minutes of work.
MAX_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class ClassifySpec:
    """What one classification is asked (see the module docstring); `parse` builds and checks one."""

    config: ClassifyConfig  # the probes, their sizes and the labels' cut-offs
    text: Any = None  # the natural-text probe's text, opened (probes.corpus.open_text); None: the shipped one
    auto_batch: bool = False  # run at the largest batch size that fits, from config.batch_size's start

    @classmethod
    def parse(
        cls, *, text_path=None, thresholds=(), needles: bool = True, batch_size: int | str | None = None, **flags
    ) -> ClassifySpec:
        """A ClassifySpec from the command line's values: `flags` ClassifyConfig fields (None: the default),
        `thresholds` NAME=VALUE strings, `batch_size` a number, "auto" or None. ConfigError for a bad value,
        InputTextError or OutputPathError for a text or treebank that cannot be read."""
        given = {name: value for name, value in flags.items() if value is not None}
        config = replace(ClassifyConfig(), **given, **({} if needles else {"needles": False}))
        config = with_thresholds(config, thresholds)
        check_work_size(config)
        text = open_text(text_path, stream=True) if text_path is not None else None
        if config.syntax not in (None, "sample"):
            read_conllu(config.syntax)  # a bad treebank fails here, before the model loads
        if batch_size not in (None, "auto"):
            config = replace(config, batch_size=batch_size)
        return cls(config, text, auto_batch=batch_size == "auto")


def run_classify(loaded: LoadedModel, spec: ClassifySpec, progress: bool = False, say: Say | None = None) -> Result:
    """Classify `loaded`'s heads as `spec` asks: classify_heads's Result. The batch size `auto` chose is said
    through `say` (by the main process alone)."""
    say = say or (lambda line: None)
    if not spec.auto_batch:
        return classify_heads(loaded, text=spec.text, config=spec.config, progress=progress)
    run = lambda size: classify_heads(  # noqa: E731
        loaded, text=spec.text, config=replace(spec.config, batch_size=size), progress=progress
    )
    heads, chosen = with_largest_batch(run)
    if distributed.is_main():
        say(f"note: --batch-size auto chose {chosen}")
    return heads


def with_thresholds(config: ClassifyConfig, pairs) -> ClassifyConfig:
    """labels.config_with_thresholds, its range errors naming the option the user wrote, not the field."""
    try:
        return config_with_thresholds(config, pairs)
    except ConfigError as exc:
        message = str(exc)
        for name, field in THRESHOLDS.items():
            if message.startswith(f"{field} = "):
                value = message.split(" = ", 1)[1].split(" ", 1)[0]
                raise ConfigError(
                    f"--threshold {name}={value} is out of range: {message.split('out of range: ', 1)[-1]}"
                ) from None
        raise


def check_work_size(config: ClassifyConfig) -> None:
    """Refuse a repeat probe whose random tokens alone would take more than MAX_MEMORY_SHARE of the memory
    free now (int64 ids: n_seq x (1 + seq_len x repeats) x 8 bytes)."""
    needed = config.n_seq * (1 + config.seq_len * config.repeats) * 8
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not every platform says
        return
    if needed > MAX_MEMORY_SHARE * free:
        raise ConfigError(
            f"--n-seq {config.n_seq} is too large: its random tokens alone need "
            f"{needed / 2**30:,.1f} GiB and this machine has {free / 2**30:,.1f} GiB free; "
            f"lower --n-seq (at most about {int(MAX_MEMORY_SHARE * free // (needed // config.n_seq)):,})"
        )
