"""Ablation results across the seams: `report --prune`, roles through the CLI, results of every metric
in the report and the inline views (each with its metric and unit, one chart per metric), `each` vs
`all`, random-head controls over small designs, Ctrl-C during a sweep, one JSON document per command,
and light imports."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from itertools import combinations

import pytest
from click.testing import CliRunner

from headlens.cli.main import cli
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.results import Result

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _labels_file(tmp_path, heads: list[tuple[int, int]], label: str = "induction"):
    path = tmp_path / "heads.json"
    path.write_text(
        json.dumps(
            [
                {"layer": layer, "head": head, "labels": [label] if (layer, head) in heads else []}
                for layer in range(2)
                for head in range(4)
            ]
        ),
        encoding="utf-8",
    )
    return path


def _result(metric: str, heads: list[str], delta: float, **extra) -> Result:
    """An ablate_heads result of `metric` (the keys ablate_heads writes)."""
    from headlens.ablation.ablate import ablation_rows
    from headlens.intervene.metrics import UNIT

    out = {
        "model": "m",
        "heads": heads,
        "method": "zero",
        "metric": metric,
        "unit": UNIT[metric],
        "n": 40,
        "clean": 0.9,
        "ablated": 0.9 + delta,
        "delta": delta,
        "ci95": [delta - 0.1, delta + 0.1],
    }
    if metric in ("loss", "repeat"):
        out.update(n_tokens=40, loss=0.9, loss_ablated=0.9 + delta, delta_loss=delta)
    out.update(extra)
    return Result("ablation", meta=out, rows=ablation_rows(out))


# report --prune -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_with_prune_writes_the_pruning_curve(small_model_dir, tmp_path):
    out = tmp_path / "r.html"
    result = run("report", small_model_dir, "--prune", "--controls", "0", "--no-progress", "--out", out)
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    assert "Pruning curve" in html and "--prune" in re.search(r'<pre class="command">(.*?)</pre>', html).group(1)


# roles through the CLI ----------------------------------------------------------------------------


def test_a_role_keeps_how_its_heads_were_chosen_in_json(small_model_dir, tmp_path):
    labels = _labels_file(tmp_path, [(1, 1), (1, 3)])
    result = run(
        "ablate", small_model_dir, "--heads", "induction", "--labels", labels, "--metric", "repeat", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["heads"] == ["1.1", "1.3"] and obj["chosen_by"] == "heads labelled induction by the labels file"


# each result carries its metric and unit; charts never mix metrics ------------------------------------


def test_needle_results_are_read_by_findings_inline_and_the_ablation_section():
    import pandas as pd

    from headlens.reports import findings, inline, sections

    needle = _result("needle", ["1.0"], -0.5)
    loss = _result("repeat", ["1.0"], 3.2)
    found = findings.single_head_ablations(None, [needle])
    assert found["1.0"]["delta"] == -0.5 and found["1.0"]["metric"] == "needle"
    assert inline.kind_of(needle) == "ablation" and inline.kind_of([loss, needle]) == "ablation"
    html = sections.ablation_section(None, [loss, needle], None)
    assert html.count("<img") == 2  # one chart per metric
    assert "share of needle tokens retrieved" in html and "nats/token" in html
    rows = sections.ablation_rows([loss, needle])
    assert [(r["metric"], r["unit"]) for r in rows] == [
        ("repeat", "nats/token"),
        ("needle", "share of needle tokens retrieved"),
    ]
    heads = pd.DataFrame({"layer": [1], "head": [0], "labels": [["retrieval"]], "retrieval_score": [0.5]})
    page = findings.findings_section(Result("heads", heads), None, [needle])
    assert "needle" in page.lower() and "0.50" in page


def test_one_chart_per_metric_in_the_inline_view():
    from headlens.reports import inline

    html = inline.render_html(
        [_result("repeat", ["1.0"], 3.2), _result("needle", ["1.0,1.2"], -0.9), _result("needle", ["1.2"], -0.1)]
    )
    assert html.count("<img") == 2 and "share of needle tokens retrieved" in html


def test_a_sweep_of_another_metric_is_drawn_in_its_unit():
    import pandas as pd

    from headlens.reports import inline, sections

    sweep = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1],
            "head": [0, 1, 0, 1],
            "n": [10] * 4,
            "clean": [0.5] * 4,
            "ablated": [0.4, 0.5, 0.1, 0.5],
            "delta": [-0.1, 0.0, -0.4, 0.0],
            "ci95_low": [math.nan] * 4,
            "ci95_high": [math.nan] * 4,
        }
    )
    sweep = Result("sweep", sweep, {"metric": "needle", "unit": "share of needle tokens retrieved"})
    assert inline.kind_of(sweep) == "sweep"
    html = sections.ablation_section(sweep, None, None)
    assert "share of needle tokens retrieved" in html and "nats/token" not in html


# each vs all --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_each_and_all_are_two_experiments(small_model_dir, small_model):
    from headlens.ablation import ablate_heads

    together = ablate_heads(small_model, "all", metric="repeat").meta
    assert together["heads"] == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    with pytest.raises(ConfigError, match="sweep_heads"):
        ablate_heads(small_model, "each", metric="repeat")
    cli_all = run("ablate", small_model_dir, "--heads", "all", "--metric", "repeat", "--format", "json")
    assert cli_all.exit_code == 0, cli_all.output
    assert json.loads(cli_all.stdout)["delta"] == pytest.approx(together["delta"], rel=1e-12)
    cli_each = run("ablate", small_model_dir, "--heads", "each", "--metric", "repeat", "--format", "json")
    assert cli_each.exit_code == 0, cli_each.output
    assert len(json.loads(cli_each.stdout)["rows"]) == 8


# random-head controls -----------------------------------------------------------------------------


def test_control_sets_never_draw_the_chosen_set_and_enumerate_a_small_design():
    from headlens.intervene.stats import control_design

    chosen = [Head(1, 0), Head(1, 2), Head(1, 3)]  # 4 heads in the layer: C(4, 3) = 4 sets, 3 others
    design = control_design(chosen, n_heads=4, k=10, seed=0)
    assert design["n_possible"] == 3 and design["exact"]
    expected = sorted(
        sorted(Head(1, h) for h in c) for c in combinations(range(4), 3) if sorted(Head(1, h) for h in c) != chosen
    )
    assert sorted(design["sets"]) == expected
    big = control_design([Head(0, 1), Head(1, 2)], n_heads=12, k=20, seed=3)  # 144 - 1 other sets
    assert big["n_possible"] == 143 and not big["exact"] and len(big["sets"]) == 20
    assert all(s != [Head(0, 1), Head(1, 2)] for s in big["sets"])
    assert len({tuple(s) for s in big["sets"]}) == 20  # distinct


def test_exact_control_reports_the_smallest_p_the_design_allows():
    from headlens.intervene.stats import control_summary

    sets = [[Head(1, 0)], [Head(1, 1)], [Head(1, 2)]]
    summary = control_summary(2.0, [0.1, -0.3, 0.5], sets, seed=0, n_possible=3, exact=True)
    assert summary["p_value"] == pytest.approx(1 / 4) and summary["p_min"] == pytest.approx(1 / 4)
    assert summary["rank"] == 1 and summary["exact"] and summary["n_possible"] == 3


def test_a_small_design_is_enumerated_by_ablate_heads(small_model):
    from headlens.ablation import ablate_heads

    result = ablate_heads(small_model, [Head(1, 0), Head(1, 2), Head(1, 3)], metric="repeat", control=10).meta
    control = result["control"]
    assert control["exact"] and control["k"] == 3 and control["n_possible"] == 3
    assert ["1.0", "1.2", "1.3"] not in control["sets"] and control["p_min"] == pytest.approx(0.25)


def test_the_control_line_says_how_many_sets_exist(small_model_dir, tmp_path):
    labels = _labels_file(tmp_path, [(1, 0), (1, 2), (1, 3)])
    result = run(
        "ablate",
        small_model_dir,
        "--heads",
        "induction",
        "--labels",
        labels,
        "--metric",
        "repeat",
        "--control",
        "random:10",
    )
    assert result.exit_code == 0, result.output
    assert "all 3 other sets" in result.stdout and "smallest p possible 0.250" in result.stdout


# findings cite the ablation and the control ------------------------------------------------------------


def test_role_summaries_cite_the_ablation_and_its_control():
    import pandas as pd

    from headlens.reports import findings

    heads = pd.DataFrame(
        {"layer": [1, 1], "head": [0, 2], "labels": [["induction"], ["induction"]], "prefix_matching_score": [0.9, 0.8]}
    )
    control = {
        "k": 3,
        "seed": 0,
        "sets": [["1.1", "1.3"]] * 3,
        "deltas": [0.1, 0.2, 0.3],
        "rank": 1,
        "p_value": 0.25,
        "n_possible": 3,
        "exact": True,
        "p_min": 0.25,
    }
    result = _result(
        "repeat", ["1.0", "1.2"], 3.21, chosen_by="heads labelled induction by the labels given", control=control
    )
    for lang, words in (("en", ["3.21", "nats/token", "rank 1 of 4", "0.25"]), ("es", ["3,21", "0,25"])):
        page = findings.findings_section(Result("heads", heads), None, [result], lang=lang)
        role = page[page.index('id="role-induction"') :]
        role = role[: role.index("</div>")]
        assert all(word in role for word in words), (lang, role)


def test_each_role_cites_the_experiment_run_for_it_even_when_two_roles_share_their_heads():
    """tiny's induction heads are also its retrieval heads: the induction block cites the repeat experiment
    chosen for induction, the retrieval block the needle one; a set chosen by hand is cited by both."""
    import pandas as pd

    from headlens.reports import findings

    heads = pd.DataFrame(
        {
            "layer": [1, 1],
            "head": [0, 2],
            "labels": [["induction", "retrieval"]] * 2,
            "prefix_matching_score": [0.9, 0.8],
            "retrieval_score": [0.9, 0.8],
        }
    )
    chosen = ["1.0", "1.2"]
    repeat = _result("repeat", chosen, 3.21, role="induction", chosen_by="heads labelled induction by the labels given")
    needle = _result(
        "needle", chosen, -0.89, role="retrieval", chosen_by="heads labelled retrieval by the labels given"
    )
    by_hand = _result("loss", chosen, 0.57)
    page = findings.findings_section(Result("heads", heads), None, [repeat, needle, by_hand])

    def block(role: str) -> str:
        found = page[page.index(f'id="role-{role}"') :]
        return found[: found.index("</div>")]

    assert "3.21" in block("induction") and "0.89" not in block("induction")
    assert "0.89" in block("retrieval") and "3.21" not in block("retrieval")
    assert "0.57" in block("induction") and "0.57" in block("retrieval")


# Ctrl-C ---------------------------------------------------------------------------------------------


def test_ctrl_c_during_a_sweep_says_what_was_saved_and_exits_130(small_model_dir, tmp_path, monkeypatch):
    import headlens.ablation.ablate as ablate

    original = ablate.SweepStore.append
    calls = []

    def append_then_interrupt(self, row):
        original(self, row)
        calls.append(row)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(ablate.SweepStore, "append", append_then_interrupt)
    out = tmp_path / "sweep"
    result = run("ablate", small_model_dir, "--heads", "each", "--metric", "repeat", "--out-dir", out)
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"headlens: interrupted: 3 of 8 heads saved in {out}; rerun with --resume"
    )
    assert (out / "rows.jsonl").read_text().count("\n") == 3


# one JSON document per command ----------------------------------------------------------------------


@pytest.mark.slow
def test_prune_json_is_one_document(small_model_dir):
    result = run("prune", small_model_dir, "--step-fraction", "0.5", "--no-roles", "--format", "json")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert [row["n_removed"] for row in obj["curve"]] == [0, 4, 8]
    assert {"heads_within_tolerance", "n_heads", "tolerance", "removal_by_role"} <= set(obj)


def test_approx_json_is_one_document(small_model_dir):
    result = run("ablate", small_model_dir, "--heads", "each", "--metric", "repeat", "--approx", "--format", "json")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert len(obj["rows"]) == 8 and obj["trust"]["kind"] == "spot check"


# light imports --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_importing_the_ablation_package_does_not_import_the_classifier():
    code = (
        "import sys, headlens.ablation, headlens.classify.roles, headlens.ablation.ablate; "
        "print(any(m in sys.modules for m in ('headlens.classify.frame', 'headlens.classify.labels', "
        "'headlens.classify.runs')), 'headlens.scores' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
