"""A torch.distributed worker for tests/test_distributed.py, launched by
`torchrun --standalone --nproc-per-node N -m tests.helpers.dist_worker MODE OUT [KILL_AFTER]` from the
repository root.

MODE `classify`: classify the small random GPT-2 on word-list documents; `sweep`: the exact
single-head sweep of the strong test model (tests/helpers/strong.py), rows kept in OUT/sweep; `prune`:
the pruning curve of the strong test model (batches of windows split over the ranks). Rank 0
pickles the result (the classification's Result, with its meta; the sweep's and the curve's frame) to
OUT/result.pkl. KILL_AFTER (sweep): rank 1 SIGKILLs itself once it
has durably appended that many rows, as a crashed process would die.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

import torch

from headlens import distributed
from tests.helpers.strong import build_strong_model, sample_text

SMALL = dict(n_layer=2, n_head=4, n_embd=64, n_positions=128)  # the conftest small_config
DOCS = [sample_text(n, seed=s) for s, n in enumerate([300, 120, 900, 40, 500, 260, 700])]


def classification():
    from transformers import GPT2Config

    from headlens.classify import ClassifyConfig, classify_heads
    from headlens.load.models import build_model

    loaded = build_model(GPT2Config(**SMALL), seed=0, name="small-random")
    return classify_heads(loaded, iter(DOCS), ClassifyConfig(n_seq=6, batch_size=2, max_windows=64))


def sweep_frame(out: Path, kill_after: int | None):
    from headlens.ablation import sweep_heads
    from headlens.ablation.store import SweepStore

    if kill_after is not None and distributed.rank() == 1:
        append = SweepStore.append

        def append_then_die(self, row):
            append(self, row)
            if len(list(open(self.rows_path, encoding="utf-8"))) >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

        SweepStore.append = append_then_die
    return sweep_heads(build_strong_model(64), text=sample_text(600), out=out / "sweep", resume=True).frame


def prune_frame():
    from headlens.ablation.prune import prune_curve

    return prune_curve(build_strong_model(64), text=sample_text(1500), step_fraction=0.25).frame


def main() -> None:
    torch.set_num_threads(1)
    mode, out = sys.argv[1], Path(sys.argv[2])
    kill_after = int(sys.argv[3]) if len(sys.argv) > 3 else None
    distributed.init()
    frames = {"classify": classification, "prune": prune_frame, "sweep": lambda: sweep_frame(out, kill_after)}
    frame = frames[mode]()
    if distributed.is_main():
        (out / "result.pkl").write_bytes(pickle.dumps(frame))  # a Result or a DataFrame


if __name__ == "__main__":
    main()
