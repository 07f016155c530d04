"""Many processes, one answer: classify, the exact sweep and the pruning curve under
`torchrun --nproc-per-node 2` (gloo on CPU) equal the single-process run; a sweep whose second
rank is killed resumes and finishes with the same table, every head counted once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from headlens import distributed
from tests.helpers import dist_worker
from tests.helpers.strong import build_strong_model, sample_text

ROOT = Path(__file__).resolve().parents[1]  # the worker runs as the module tests.helpers.dist_worker from here
# Merged scores are the same float64 sums added in another order, then rounded to float32.
SCORE_ATOL = 1e-6


def _torchrun(mode: str, out: Path, *extra: str, n: int = 2) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        "-m",
        "tests.helpers.dist_worker",
        mode,
        str(out),
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_two_process_classify_equals_one_process(tmp_path, one_thread):
    single = dist_worker.classification()
    run = _torchrun("classify", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    merged = pd.read_pickle(tmp_path / "result.pkl")
    assert merged.meta["probes"] == single.meta["probes"]
    assert single.meta["probes"]["n_windows"] >= 4  # both ranks had text batches to score
    single, merged = single.frame, merged.frame
    floats = [c for c in single.columns if single[c].dtype.kind == "f"]
    exact = [c for c in single.columns if c not in floats]
    pd.testing.assert_frame_equal(merged[exact], single[exact])
    torch.testing.assert_close(
        torch.tensor(merged[floats].values),
        torch.tensor(single[floats].values),
        atol=SCORE_ATOL,
        rtol=0,
        equal_nan=True,
    )


@pytest.mark.slow
def test_two_process_sweep_killed_rank_resumes_to_the_single_process_table(tmp_path, one_thread):

    from headlens.ablation import sweep_heads

    single = sweep_heads(build_strong_model(64), text=sample_text(600)).frame
    killed = _torchrun("sweep", tmp_path, "1")
    assert killed.returncode != 0  # rank 1 died after its first row; torchrun stops the job
    rows_files = sorted((tmp_path / "sweep").glob("rows*.jsonl"))
    before = {p.name: p.read_text().splitlines() for p in rows_files}
    assert len(before.get("rows.rank1.jsonl", [])) == 1
    assert not (tmp_path / "sweep" / "sweep.csv").exists()
    resumed = _torchrun("sweep", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    merged = pd.read_pickle(tmp_path / "result.pkl")
    pd.testing.assert_frame_equal(merged, single, check_exact=True)  # identical deltas
    # every head appended exactly once over both runs: finished rows were kept, not redone
    lines = [json.loads(line) for p in (tmp_path / "sweep").glob("rows*.jsonl") for line in p.read_text().splitlines()]
    heads = [(row["layer"], row["head"]) for row in lines]
    assert sorted(heads) == sorted(set(heads)) and len(heads) == len(single)
    for name, old in before.items():
        assert (tmp_path / "sweep" / name).read_text().splitlines()[: len(old)] == old
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert table["delta_loss"].tolist() == pytest.approx(single["delta_loss"].tolist(), abs=1e-12)


@pytest.mark.slow
def test_two_process_prune_curve_equals_one_process(tmp_path, one_thread):
    """Importance and loss batches split over 2 ranks, summed in batch order: the same curve exactly."""
    single = dist_worker.prune_frame()
    run = _torchrun("prune", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    merged = pd.read_pickle(tmp_path / "result.pkl")
    assert len(single) > 2  # heads were removed over several steps
    pd.testing.assert_frame_equal(merged, single, check_exact=True)


def test_sum_in_order_is_the_running_sum():
    """One process: the parts (a slice each) added in index order equal the plain running sum."""
    parts = {2: (1, torch.tensor([0.1, 0.2])), 0: (0, torch.tensor([1e-17, 0.3, 0.0])), 1: (2, torch.tensor([0.7]))}
    running = torch.zeros(3, dtype=torch.float64)
    for index in sorted(parts):
        start, values = parts[index]
        full = torch.zeros(3, dtype=torch.float64)
        full[start : start + len(values)] = values.double()
        running += full
    got = distributed.sum_in_order(
        {k: (s, v.double()) for k, (s, v) in parts.items()}, torch.zeros(3, dtype=torch.float64)
    )
    assert torch.equal(got, running)


def test_one_process_is_the_identity():
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert list(distributed.shard(range(5))) == [0, 1, 2, 3, 4]
    assert distributed.all_gather({"a": 1}) == [{"a": 1}]
    distributed.broadcast_error(None)


def test_one_process_error_is_raised():
    from headlens.errors import ConfigError

    with pytest.raises(ConfigError, match="bad"):
        distributed.broadcast_error(ConfigError("bad"))
