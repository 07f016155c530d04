"""`headlens ablate` and `headlens prune` through click's CliRunner and a killed subprocess."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from headlens.cli.main import cli

KEYS = ["model", "heads", "method", "metric", "unit", "n", "clean", "ablated", "delta", "ci95"]  # every metric
LOSS_KEYS = ["n_tokens", "loss", "loss_ablated", "delta_loss"]  # loss metrics, besides
ABOUT = ["data", "reference", "resampled"]  # what was measured, in words
BUDGET = ["tokens", "tokens_read"]  # the token budget and the tokens read (a set ablation's result)


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """~3 windows of the small model's 128-token context."""
    words = (
        "the of and to in is was that for on as with by he at from his it an were are which this be "
        "time river city king water light house people small great old new world night year"
    ).split()
    gen = torch.Generator().manual_seed(0)
    text = " ".join(words[i] for i in torch.randint(0, len(words), (380,), generator=gen).tolist()) + "."
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_set_json(small_model_dir):
    result = run(
        "ablate", "--model", str(small_model_dir), "--heads", "0.1,1.2", "--metric", "repeat", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert list(obj) == KEYS + LOSS_KEYS + BUDGET + ABOUT and obj["heads"] == ["0.1", "1.2"] and obj["method"] == "zero"
    assert obj["ci95"][0] <= obj["delta_loss"] <= obj["ci95"][1]


def test_needle_loss_json_states_its_unit_and_scores_the_needle_positions(small_model_dir):
    """--metric needle-loss: a loss metric (nats/token, the loss keys) on the same needle tokens as --metric needle."""
    args = ["ablate", "--model", str(small_model_dir), "--heads", "1.2", "--format", "json", "--metric"]
    loss, top1 = (json.loads(run(*args, metric).stdout) for metric in ("needle-loss", "needle"))
    assert list(loss) == KEYS + LOSS_KEYS + BUDGET + ABOUT and list(top1) == KEYS + BUDGET + ABOUT
    assert (loss["metric"], loss["unit"]) == ("needle-loss", "nats/token")
    assert top1["unit"] == "share of needle tokens retrieved"
    assert loss["n"] == top1["n"] > 0 and loss["data"] == top1["data"]
    assert loss["delta"] == pytest.approx(loss["ablated"] - loss["clean"], abs=1e-9) and loss["clean"] > 0


def test_layer_set_and_table(small_model_dir, text_file):
    result = run(
        "ablate", "--model", str(small_model_dir), "--heads", "layer:1", "--method", "mean", "--text", text_file
    )
    assert result.exit_code == 0, result.output
    summary, *details = result.stdout.splitlines()
    rows = dict(line.split(None, 1) for line in details if line.strip())
    assert rows["heads"] == "1.0, 1.1, 1.2, 1.3" and rows["metric"] == "loss"
    # each value is printed to 6 significant digits: the change agrees with the difference of the printed
    # values within half a unit of the last printed digit of each
    printed = [float(rows[key]) for key in ("clean", "ablated", "delta")]
    tol = sum(0.5 * 10 ** (math.floor(math.log10(abs(v))) - 5) for v in printed if v)
    assert printed[2] == pytest.approx(printed[1] - printed[0], abs=tol)
    assert "1.0, 1.1, 1.2, 1.3 mean-ablated: loss" in summary and "tokens read" in summary


def test_sweep_json_one_object_per_head(small_model_dir, tmp_path):
    report = tmp_path / "r.html"
    result = run(
        "ablate",
        "--model",
        str(small_model_dir),
        "--heads",
        "each",
        "--metric",
        "repeat",
        "--format",
        "json",
        "--report",
        str(report),
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # one document
    assert {key: doc[key] for key in ("method", "metric", "unit")} == {
        "method": "zero",
        "metric": "repeat",
        "unit": "nats/token",
    }
    objs = doc["rows"]
    assert [o["heads"] for o in objs] == [[f"{layer}.{head}"] for layer in range(2) for head in range(4)]
    assert all(list(o) == KEYS + LOSS_KEYS + ABOUT for o in objs)
    assert report.is_file() and "<html" in report.read_text(encoding="utf-8").lower()
    assert f"headlens: wrote {report}" in result.stderr


@pytest.mark.slow
def test_approx_check_reports_agreement(small_model_dir):
    result = run(
        "ablate", "--model", str(small_model_dir), "--heads", "all", "--metric", "repeat", "--approx", "--check"
    )
    assert result.exit_code == 0, result.output
    assert "pearson" in result.stdout and "spearman" in result.stdout and "delta_loss_approx" in result.stdout
    assert "atp vs the exact sweep" in result.stdout and "with the wrong sign" in result.stdout


def test_approx_prints_the_agreement_it_measured(small_model_dir):
    """--check's summary is the agreement of the printed rows (delta vs delta_approx), recomputed here."""
    result = run(
        "ablate", "--model", str(small_model_dir), "--heads", "each", "--metric", "repeat", "--approx", "--check",
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    exact = torch.tensor([o["delta"] for o in doc["rows"]], dtype=torch.float64)  # [heads]
    approx = torch.tensor([o["delta_approx"] for o in doc["rows"]], dtype=torch.float64)  # [heads]
    ranks = [torch.argsort(torch.argsort(v)).double() for v in (exact, approx)]  # no ties in float deltas
    spearman = torch.corrcoef(torch.stack(ranks))[0, 1]
    k = min(10, len(exact) // 4)
    top_exact, top_approx = set(exact.abs().topk(k).indices.tolist()), set(approx.abs().topk(k).indices.tolist())
    flipped = sum(float(exact[i] * approx[i]) <= 0 for i in top_exact)
    under = sum(float(exact[i] * approx[i]) > 0 and abs(approx[i]) < abs(exact[i]) / 2 for i in top_exact)
    check = doc["check"]
    assert check["spearman"] == pytest.approx(float(spearman), abs=1e-9)
    assert check["top_k"] == k and check["top10_overlap"] == len(top_exact & top_approx) / k
    assert (check["top_flipped"], check["top_under"]) == (flipped, under)
    star = run(
        "ablate",
        "--model",
        str(small_model_dir),
        "--heads",
        "each",
        "--metric",
        "repeat",
        "--approx",
        "atp*",
        "--format",
        "json",
    )
    assert star.exit_code == 0, star.output
    doc = json.loads(star.stdout)
    assert all(o["approx"] == "atp*" for o in doc["rows"]) and len(doc["rows"]) == 8
    trust = doc["trust"]
    assert trust["kind"] == "spot check" and {"spearman", "top10_overlap", "n_heads", "n_seq"} <= set(trust)


def test_prompts_metric_role_and_control(small_model_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"prompt": "the river and the", "target": " city", "foil": " king"}\n'
        '{"prompt": "light from the old", "target": " house", "foil": " world"}\n',
        encoding="utf-8",
    )
    result = run(
        "ablate",
        str(small_model_dir),
        "--heads",
        "1.0",
        "--metric",
        "logit-diff",
        "--prompts",
        str(prompts),
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert list(obj) == KEYS + BUDGET + ABOUT and obj["metric"] == "logit-diff" and obj["n"] == 2
    labels = tmp_path / "heads.json"
    labels.write_text(
        json.dumps(
            [
                {"layer": layer, "head": head, "labels": ["induction"] if (layer, head) in [(1, 1), (1, 3)] else []}
                for layer in range(2)
                for head in range(4)
            ]
        )
    )
    result = run(
        "ablate",
        str(small_model_dir),
        "--heads",
        "induction",
        "--labels",
        str(labels),
        "--metric",
        "repeat",
        "--control",
        "random:3",
        "--seed",
        "2",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["heads"] == ["1.1", "1.3"] and "1.1, 1.3" in result.stderr
    assert len(obj["control"]["deltas"]) == 3 and {"rank", "p_value"} <= set(obj["control"])
    assert all(len(s) == 2 and all(h.startswith("1.") for h in s) for s in obj["control"]["sets"])


def test_prune_command(small_model_dir, text_file):
    labels = text_file + ".heads.json"
    with open(labels, "w") as handle:
        json.dump(
            [
                {"layer": layer, "head": head, "labels": ["induction"] if head == 0 else []}
                for layer in range(2)
                for head in range(4)
            ],
            handle,
        )
    report = text_file + ".html"
    result = run(
        *("prune", str(small_model_dir), "--text", text_file, "--step-fraction", "0.25", "--labels", labels),
        *("--report", report),
    )
    assert result.exit_code == 0, result.output
    assert "heads can go within +5% loss" in result.stdout and "removal order by role" in result.stdout
    assert result.stdout.count("\n") >= 6  # header + 5 steps (0, 2, 4, 6, 8 heads) + summary
    assert f"headlens: wrote {report}" in result.stderr
    page = open(report, encoding="utf-8").read()  # the page says what the CLI printed, and the text used
    assert "heads can go within +5% loss" in page and "removal order" in page.lower() and text_file in page
    assert "not recorded" not in page and '<a href="#ablation">Pruning</a>' in page


@pytest.mark.slow
def test_killed_sweep_resumes_to_the_uninterrupted_table(small_model_dir, tmp_path):
    """A real kill (SIGKILL) of a sweep subprocess mid-run, then --resume."""
    args = ["ablate", "--model", str(small_model_dir), "--heads", "each", "--metric", "repeat"]
    full = run(*args, "--out-dir", str(tmp_path / "full"))
    assert full.exit_code == 0, full.output
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "headlens.cli.main", *args, "--out-dir", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    rows = out / "rows.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if rows.is_file() and rows.read_text().count("\n") >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    n_done = rows.read_text().count("\n")
    assert proc.returncode == -signal.SIGKILL and 1 <= n_done < 8, (proc.returncode, n_done)
    assert not (out / "sweep.csv").exists()
    resumed = run(*args, "--out-dir", str(out), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert (out / "sweep.csv").read_text() == (tmp_path / "full" / "sweep.csv").read_text()
    assert rows.read_text().count("\n") == 8


# Errors ---------------------------------------------------------------------------------------


def _one_line_error(result):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error:"), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--heads", "3.x"], "malformed head"),
        (["--heads", "2.0"], "out of range"),
        (["--heads", "0.1,0.1"], "more than once"),
        (["--heads", ""], "empty head spec"),
        (["--heads", "0.1", "--method", "shuffle"], "unknown ablation method"),
        (["--heads", "0.1", "--metric", "bleu"], "unknown metric"),
        (["--heads", "0.1", "--format", "xml"], "unknown format"),
        (["--heads", "all", "--check"], "--approx"),
        (["--heads", "each", "--resume"], "--out-dir"),
        (["--heads", "0.1", "--metric", "prob"], "--prompts"),
        (["--heads", "0.1", "--control", "random:x"], "random:K"),
        (["--heads", "label:bogus"], "unknown label"),
        (["--heads", "all", "--approx", "ig"], "unknown --approx"),
        (["--heads", "all", "--approx", "--metric", "needle"], "no gradient"),
    ],
)
def test_bad_input_is_one_line_exit_2(small_model_dir, extra, message):
    assert message in _one_line_error(run("ablate", "--model", str(small_model_dir), *extra))


def test_short_text_and_missing_weights(small_model_dir, tmp_path, monkeypatch):
    short = tmp_path / "short.txt"
    short.write_text("the", encoding="utf-8")
    line = _one_line_error(run("ablate", "--model", str(small_model_dir), "--heads", "0.1", "--text", str(short)))
    assert "at least 2" in line
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "target": " the"}\n{"prompt": "b", "target": " the river"}\n')
    line = _one_line_error(
        run("ablate", str(small_model_dir), "--heads", "0.1", "--metric", "prob", "--prompts", str(prompts))
    )
    assert "line 2" in line and "2 tokens" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    assert "gpt2" in _one_line_error(run("ablate", "--heads", "0.1"))  # --model defaults to gpt2


def test_resume_from_other_settings(small_model_dir, tmp_path):
    from headlens.ablation.ablate import sweep_heads
    from headlens.heads import Head
    from headlens.load.models import load_model

    out = str(tmp_path / "sweep")  # a started zero-ablation sweep of the same model (one head done)
    sweep_heads(load_model(str(small_model_dir)), metric="repeat", heads=[Head(0, 0)], out=out)
    line = _one_line_error(
        run(
            "ablate",
            "--model",
            str(small_model_dir),
            "--heads",
            "each",
            "--metric",
            "repeat",
            "--method",
            "mean",
            "--out-dir",
            out,
            "--resume",
        )
    )
    assert "other settings" in line
