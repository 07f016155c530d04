"""Host synchronisations of a classify's capture passes, counted on the CPU: at most one per batch.

On a GPU every copy of a tensor to the host (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`,
`int(t)`, `float(t)`, `bool(t)`) and `torch.cuda.synchronize` waits for the device. CPU tensors are
already on the host, so `HOST_DEVICES` is emptied here: the reducers then keep their sums pending
as they would on a GPU, and every such call made from headlens's own code during a batch of
`run_capture` is counted (transformers' internals are not headlens's to change and are not
counted). The model has SmolLM2-135M's head layout (9 query heads over 3 key/value heads) at a
small width.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig

import headlens
import headlens.capture.reducers as reducers
import headlens.capture.run as capture_run
import headlens.classify.runs as probe_runs
from headlens.classify import ClassifyConfig, classify_heads
from headlens.load.models import build_model
from headlens.validate import BUILTIN_TEXT

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

HEADLENS_DIR = str(Path(headlens.__file__).parent)
HOST_COPIES = ("item", "cpu", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")


def _smollm_shaped():
    config = LlamaConfig(
        vocab_size=50257,  # the GPT-2 tokenizer's, so the probes run unchanged
        hidden_size=72,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return build_model(config, seed=0, name="smollm-shaped")


class SyncCounter:
    """Host copies made from headlens's code, per batch of each run_capture (a list per call)."""

    def __init__(self, monkeypatch):
        self.runs: list[list[int]] = []
        self.reducers: list[set[str]] = []  # class names of each run's reducers
        self.active = False
        for name in HOST_COPIES:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch.cuda, "synchronize", self._counting(lambda *a, **k: None))
        run_capture, forward = probe_runs.run_capture, capture_run._forward_trunk

        def counted_run(model, batches, reducers, **kwargs):
            self.runs.append([])
            self.reducers.append({type(r).__name__ for r in reducers})
            self.active = True
            try:
                return run_capture(model, batches, reducers, **kwargs)
            finally:
                self.active = False

        def counted_forward(model, batch):
            if self.active:  # a forward of a counted run_capture (other passes call capture directly)
                self.runs[-1].append(0)  # copies from here to the next batch's forward belong to this batch
            return forward(model, batch)

        monkeypatch.setattr(probe_runs, "run_capture", counted_run)
        monkeypatch.setattr(capture_run, "_forward_trunk", counted_forward)

    def _counting(self, method):
        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if self.active and self.runs and self.runs[-1] and caller.startswith(HEADLENS_DIR):
                self.runs[-1][-1] += 1
            return method(*args, **kwargs)

        return counted


def _classify(loaded) -> pd.DataFrame:
    config = ClassifyConfig(n_seq=4, batch_size=2, max_windows=6)
    return classify_heads(loaded, " ".join([BUILTIN_TEXT] * 8), config).frame


@pytest.fixture(scope="module")
def counted(request):
    """(on-host frame, deferred frame, SyncCounter) of one SmolLM-shaped classify each way."""
    monkeypatch = pytest.MonkeyPatch()
    request.addfinalizer(monkeypatch.undo)
    loaded = _smollm_shaped()
    on_host = _classify(loaded)  # CPU: sums added at once
    monkeypatch.setattr(reducers, "HOST_DEVICES", ())
    counter = SyncCounter(monkeypatch)
    return on_host, _classify(loaded), counter


def _per_batch(counter, copying: bool) -> list[int]:
    return [
        n
        for run, names in zip(counter.runs, counter.reducers, strict=True)
        if ("CopyingReducer" in names) == copying
        for n in run
    ]


@pytest.mark.slow
def test_classify_copies_to_the_host_once_per_batch(counted):
    """The text probe's pass (previous-token, current-token, first-token, argmax-offset reducers)
    and the checks: one copy per batch, and the deferred sums are the same sums."""
    on_host, deferred, counter = counted
    per_batch = _per_batch(counter, copying=False)
    assert len(per_batch) >= 2  # several batches
    assert max(per_batch) <= 1, counter.runs
    assert min(per_batch) == 1  # every batch's statistics did travel, in its one copy
    pd.testing.assert_frame_equal(deferred, on_host)


@pytest.mark.slow
def test_repeat_pass_with_the_copying_score_copies_once_per_batch(counted):
    """The repeat probe's pass (duplicate-token, prefix-matching and copying reducers): one copy
    per batch; the deferred copying scores equal the on-host ones (the frames, compared above)."""
    per_batch = _per_batch(counted[2], copying=True)
    assert len(per_batch) >= 2  # several batches
    assert max(per_batch) <= 1, counted[2].runs
    assert min(per_batch) == 1  # every batch's statistics did travel, in its one copy
