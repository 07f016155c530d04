"""Report rendering from small hand-made frames of the library's schemas (classify_heads, sweep_heads, ...)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from headlens.classify.samples import patterns_of, sample_result
from headlens.errors import OutputPathError
from headlens.reports import EmptyReportError, explain, figures, findings, i18n, render_report, sections, thumbnails
from headlens.reports import render as render_module
from headlens.reports.viewer import safe_json, viewer_payload, viewer_section
from headlens.results import Result
from tests.helpers.families import build_family
from tests.helpers.planted import PLANTED_TEXT
from tests.helpers.report_inputs import (
    MODEL_INFO,
    N_HEADS,
    N_LAYERS,
    POS,
    heads_frame,
    sweep_frame,
    training_pair,
    validation_frame,
    viewer_dict,
)

NASTY = '<script>alert(1)</script> "><img src=x onerror=alert(1)> </script> {{ x }} ${y} & \u2028'
# 5 MB: the size cap for GPT-2 small with default settings.
SIZE_CAP_BYTES = 5 * 1024 * 1024


def sweep_result() -> Result:
    return Result("sweep", sweep_frame())


def img_count(html: str) -> int:
    return len(re.findall(r'<img src="data:image/png;base64,', html))


# Summary


def test_summary_escapes_and_lists_facts():
    html = sections.summary_section(
        {**MODEL_INFO, "name": NASTY}, version="9.9", date="today", command=NASTY, text_label=NASTY, text_excerpt=NASTY
    )
    assert "<script>" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 4
    assert "2 layers x 3 heads x d_head 16" in html and "123,456" in html and "9.9" in html
    gqa = sections.summary_section(
        {**MODEL_INFO, "n_kv_heads": 1}, version="9.9", date="today", command=None, text_label=None, text_excerpt=None
    )
    assert "2 layers x 3 query heads sharing 1 key/value heads x d_head 16" in gqa


# Scores and labels


def test_scores_section_one_heatmap_per_present_score_with_source():
    heads = heads_frame()
    html = sections.scores_section(Result("heads", heads))
    present = [info for info in explain.SCORES if info.column in heads]
    assert img_count(html) == len(present) == 4  # prev, first-token, positional share, copying
    for info in present:
        assert f'id="score-{info.column}"' in html
    assert "Threshold: 0.3" in html and "arXiv 2410.10781" in html  # first-token sink threshold, Gu et al.
    assert html.count("<tr>") == 1 and len(re.findall(r'<tr class="(un)?labelled">', html)) == N_LAYERS * N_HEADS
    assert "previous_token" in html and 'class="sortable"' in html


def test_classifier_settings_are_listed_when_recorded():
    heads = Result("heads", heads_frame(), {"config": {"positional_min": 0.9}, "probes": {"n_windows": 7}})
    html = sections.scores_section(heads)
    assert '<td data-sort="positional_min"><code>positional_min</code></td>' in html and "n_windows" in html


def test_thresholds_from_the_meta_override_defaults():
    heads = Result("heads", heads_frame(), {"thresholds": {"first_token_score": 0.25}})
    assert explain.score_thresholds(heads.meta)["first_token_score"] == 0.25
    assert "Threshold: 0.25" in sections.scores_section(heads)


def test_thresholds_follow_the_classifier_config_in_the_meta():
    config = {"positional_min": 0.75, "first_token_min": 0.35}  # as classify_heads records it
    thresholds = explain.score_thresholds(Result("heads", heads_frame(), {"config": config}).meta)
    assert thresholds["positional_share"] == 0.75 and thresholds["first_token_score"] == 0.35


def test_pivot_heads_is_layer_by_head_with_nan_for_missing():
    frame = heads_frame().iloc[1:]  # head 0.0 missing
    grid = figures.pivot_heads(frame, "prev_token_score")
    assert grid.shape == (N_LAYERS, N_HEADS)
    assert np.isnan(grid.loc[0, 0]) and grid.loc[0, 1] == pytest.approx(0.9)


def test_table_keeps_int_columns_and_numeric_sort_keys():
    html = sections.table(pd.DataFrame({"layer": [10, 2], "delta_loss": [0.5, float("nan")]}))
    assert '<td data-sort="10">10</td>' in html and "10.000" not in html
    assert 'data-sort="-inf"' in html  # NaN sorts last-ish and shows empty


# Thumbnails and viewer


def test_labels_read_back_from_csv_are_understood():
    assert sections.label_list("previous_token,induction") == ["previous_token", "induction"]
    assert sections.label_list("['first_token']") == ["first_token"]
    assert sections.label_list(float("nan")) == [] and sections.label_list("") == []


def test_thumbnails_one_per_labelled_head():
    html = thumbnails.thumbnails_section(heads_frame(), viewer_dict())
    assert img_count(html) == 1 and "0.1: previous_token (scale 0 to " in html
    assert img_count(thumbnails.thumbnails_section(heads_frame().assign(labels=[[]] * 6), viewer_dict())) == 0


def test_safe_json_cannot_end_a_script_and_round_trips():
    data = {"tokens": [NASTY, "</script><script>alert(2)</script>"]}
    text = safe_json(data)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == data


def test_viewer_payload_quantises_patterns_to_bytes():
    viewer = viewer_dict()
    payload = viewer_payload(viewer, heads_frame())
    raw = np.frombuffer(base64.b64decode(payload["patterns_b64"]), dtype=np.uint8)
    weights = raw.reshape(N_LAYERS, N_HEADS, POS, POS) / 255  # [layer, head, q, k]
    assert np.abs(weights - patterns_of(viewer).numpy()).max() <= 0.5 / 255 + 1e-6  # rounding to the nearest 1/255
    assert payload["default_head"] == "0.1" and payload["labels"] == {"0.1": "previous_token"}


def test_viewer_section_says_it_was_cut_and_rejects_mismatched_shapes():
    html = viewer_section(viewer_dict())
    assert "has 15 tokens; the viewer shows the first 5" in html
    good = viewer_dict()
    bad = Result("sample", good.frame.head(3), good.meta, tables=good.tables)  # 3 tokens, patterns of 5
    with pytest.raises(ValueError, match="do not match"):
        viewer_payload(bad)
    with pytest.raises(ValueError, match="do not match"):
        sample_result(["a", "b", "c"], patterns_of(good))


def test_pattern_image_scales_per_head_and_draws_the_first_column_apart():
    from PIL import Image

    pos = 6
    sink = np.zeros((pos, pos))  # [q_pos, k_pos]: every query on the first token
    sink[:, 0] = 1.0
    prev = np.eye(pos, k=-1) * 0.5  # [q_pos, k_pos]: half the weight on the previous token
    prev[:, 0] += 0.5
    prev[0, 0] = 1.0
    images = {}
    for name, pattern in (("sink", sink), ("prev", prev)):
        uri, vmax = figures.pattern_image_uri(pattern)
        images[name] = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"))
        assert images[name].shape == (pos, pos, 3)  # one pixel per weight; the page scales it up
    top = np.rint(np.array(matplotlib.colormaps["viridis"](1.0)[:3]) * 255)
    bottom = np.rint(np.array(matplotlib.colormaps["viridis"](0.0)[:3]) * 255)
    red = np.rint(np.array(matplotlib.colormaps["Reds"](1.0)[:3]) * 255)
    assert np.abs(images["sink"][:, 0] - red).max() <= 1  # the sink column: the red map's top, every row
    assert np.abs(images["prev"][3, 2] - top).max() <= 1  # 0.5 is this head's scale top: brightest viridis
    assert np.abs(images["prev"][3, 1] - bottom).max() <= 1  # no weight: darkest viridis
    assert np.abs(images["prev"][1, 4] - np.rint(np.array(figures.MASKED_RGB) * 255)).max() <= 1  # masked: grey


def test_short_samples_name_every_token_and_long_ones_every_kth():
    html = thumbnails.thumbnails_section(heads_frame(), viewer_dict())
    assert html.count('class="xticks"') == 1 and "<span> cat</span>" in html
    long_tokens = [f"t{i}" for i in range(2 * thumbnails.TICK_MAX_TOKENS + 1)]  # 49 tokens: every 3rd named
    long_html = thumbnails.thumbnails_section(heads_frame(), viewer_dict(long_tokens))
    xticks = re.search(r'<span class="xticks"[^>]*>(.*?</span>)</span>', long_html).group(1)
    named = re.findall(r"<span>([^<]+)</span>", xticks)
    assert named == [f"t{i}" for i in range(0, len(long_tokens), 3)] and len(named) <= thumbnails.TICK_MAX_TOKENS
    assert xticks.count("<span>") == len(long_tokens)  # one span per token, so named ones sit at their position
    assert 'class="zoom-toggle"' in html  # click to enlarge without a script


def test_label_table_puts_roles_first_by_role_then_score_then_sinks():
    heads = heads_frame()
    heads["labels"] = [[], ["first_token"], ["previous_token", "positional"], [], ["first_token"], []]
    heads["first_token_score"] = [0.1, 0.4, 0.2, 0.1, 0.9, 0.1]
    frame = sections.label_frame(heads)
    # the one head with a role first; then the sinks (a property), the stronger first; then the rest
    assert list(frame["head"]) == ["0.2", "1.1", "0.1", "0.0", "1.0", "1.2"]
    html = sections.scores_section(Result("heads", heads))
    assert 'id="label-switch"' in html and "with a role (1)" in html and "all heads (6)" in html
    assert html.count('<tr class="labelled">') == 1 and html.count('<tr class="property">') == 2
    assert html.count('<tr class="unlabelled">') == 3


# Findings, probe sources, key/value groups


def roles_frame() -> pd.DataFrame:
    heads = heads_frame()
    heads["labels"] = [[], ["first_token"], ["previous_token"], [], ["first_token", "induction"], []]
    heads["first_token_score"] = [0.1, 0.4, 0.2, 0.1, 0.9, 0.1]
    heads["prefix_matching_score"] = [0.0, 0.0, 0.0, 0.0, 0.8, 0.0]
    return heads


def test_findings_list_each_role_its_heads_scores_and_ablation():
    heads = roles_frame()
    html = findings.findings_section(Result("heads", heads), sweep=sweep_result())
    assert set(re.findall(r'<li data-head="([\d.]+)"', html)) == {"0.2", "1.1"}  # heads with a role only
    assert "2 of 6 heads carry at least one role; 4 carry none" in html
    assert "induction: prefix matching 0.800, copying -0.300" in html  # 3 significant figures, as in the tables
    delta = float(sweep_frame().query("layer == 1 and head == 1")["delta_loss"].iloc[0])
    assert f"ablation raises the loss on the text by {i18n.significant(delta, 'en', 3)} nats/token" in html
    assert html.index('id="head-map"') < html.index('id="role-previous_token"')  # the map opens the findings
    none = findings.findings_section(Result("heads", heads.assign(labels=[[]] * 6)))
    assert "No head of this model reached a labelling threshold" in none and "<li data-head" not in none


def test_sinks_are_summarised_as_a_property_not_listed_as_a_role():
    html = findings.findings_section(Result("heads", roles_frame()))
    sinks = html[html.index('id="role-first_token"') :]
    sinks = sinks[: sinks.index("</div>")]
    assert "a property, not a role" in sinks and "data-head" not in sinks
    assert "2 of 6 heads put more than 0.3 of their attention on the first token" in sinks
    assert "1 of them have no role" in sinks and "Strongest: 1.1 (0.900), 0.1 (0.400)" in sinks


def test_each_role_lists_its_strongest_heads_and_counts_the_rest():
    n = findings.TOP_HEADS + 3
    heads = pd.DataFrame(
        {
            "layer": list(range(n)),
            "head": [0] * n,
            "labels": [["retrieval"]] * n,
            "retrieval_score": [0.2 + 0.01 * i for i in range(n)],
        }
    )
    html = findings.findings_section(Result("heads", heads))
    listed = re.findall(r'<li data-head="([\d.]+)"', html)
    assert listed == [f"{layer}.0" for layer in range(n - 1, 2, -1)]  # the TOP_HEADS strongest, strongest first
    assert f"Retrieval heads ({n})" in html and "and 3 more" in html


def test_findings_say_where_each_probe_input_came_from():
    sources = {"text": "given_text", "repeats": "random_tokens", "needles": "default_text"}
    html = findings.findings_section(Result("heads", heads_frame(), {"sources": sources}))
    assert "the text you gave is too short for a haystack" in html and "random tokens (seeded)" in html
    read_back = heads_frame().assign(
        text_source="default_text", repeats_source="random_tokens", needles_source="not_run"
    )  # a frame read back from heads.csv
    assert findings.probe_sources(Result("heads", read_back)) == {
        "text": "default_text",
        "repeats": "random_tokens",
        "needles": "not_run",
    }


def test_kv_groups_show_shared_heads_and_whether_roles_agree():
    heads = pd.DataFrame(
        [
            {
                "layer": layer,
                "head": head,
                "kv_group": head // 2,
                "labels": {(0, 0): ["induction"], (0, 1): ["induction"], (1, 0): ["induction"]}.get((layer, head), []),
            }
            for layer in range(2)
            for head in range(4)
        ]
    )
    html = findings.kv_groups_section(heads)
    assert (
        "Of its 4 groups of query heads, 1 have heads that all took the same role(s), 1 have heads with "
        "different roles, and 2 have no head with a role."
    ) in html
    assert "0.0, 0.1" in html and "1.0: induction; 1.1: -" in html
    one_per_group = heads.assign(kv_group=heads["head"])  # multi-head attention: nothing to show
    assert findings.kv_groups_section(one_per_group) == "" and findings.kv_groups_section(heads_frame()) == ""


# Ablation, validation, training


def test_ablation_section_sweep_bars_and_pruning():
    one_meta = {
        "model": "m",
        "heads": ["0.1"],
        "method": "zero",
        "metric": "text",
        "n_tokens": 200,
        "loss": 3.0,
        "loss_ablated": 3.2,
        "delta_loss": 0.2,
        "ci95": [0.1, 0.3],
    }
    one = Result("ablation", meta=one_meta, rows=[])
    pruning = pd.DataFrame(
        {
            "step": [0, 1],
            "n_removed": [0, 1],
            "fraction_removed": [0.0, 1 / 6],
            "heads_removed": ["", "0.1"],
            "loss": [3.0, 3.1],
        }
    )
    both = Result("ablation", meta={**one_meta, "heads": ["0.1", "1.2"]}, rows=[])
    html = sections.ablation_section(sweep_result(), [one, both], Result("pruning", pruning))
    assert img_count(html) == 3  # sweep heatmap, bars, pruning curve
    assert "0.1,1.2" in html and "95% confidence" in html
    assert img_count(sections.ablation_section(None, one, None)) == 1  # a single result is accepted


def test_validation_section_flags_failures():
    frame = Result("validation", validation_frame(), {"text_source": "given", "n_tokens": 42})
    assert "every comparison passed (text: given, 42 tokens)" in sections.validation_section(frame)
    html = sections.validation_section(Result("validation", validation_frame(fail_layer=1)))
    assert "2 comparison(s) FAILED" in html and html.count('class="failed"') == 2 + 2  # the summary, every layer


def test_phase_change_step_is_the_planted_jump():
    training = training_pair(jump_step=300)
    assert figures.phase_change_step(training.frame) == 300
    html = sections.training_section(training)
    assert img_count(html) == 1 and "step 300" in html


def test_phase_change_found_in_a_ramp_over_several_checkpoints():
    log = training_pair().frame
    log["best_induction_score"] = [0.02, 0.05, 0.15, 0.3, 0.45, 0.55]  # no single jump of 0.5, one window
    log["step"] = [0, 1000, 2000, 2100, 2200, 2300]
    assert figures.phase_change_step(log) == 2300


def test_no_phase_change_marked_on_a_flat_run():
    training = training_pair()
    training.frame["best_induction_score"] = 0.017 + 0.001 * np.arange(len(training.frame))  # drifts, never jumps
    assert figures.phase_change_step(training.frame) is None
    assert "no phase change is marked" in sections.training_section(training)


# The whole page


def test_render_report_is_self_contained(tmp_path):
    path = render_report(
        tmp_path / "r.html",
        model_info=MODEL_INFO,
        heads=Result("heads", heads_frame()),
        sweep=sweep_result(),
        validation=Result("validation", validation_frame()),
        training=training_pair(),
        viewer=viewer_dict(),
        command="headlens report x",
        text_label="t.txt",
    )
    html = path.read_text(encoding="utf-8")
    for section_id in ("findings", "summary", "scores", "thumbnails", "viewer", "ablation", "validation", "training"):
        assert f'<section id="{section_id}">' in html
    assert html.index('<section id="findings">') < html.index('<section id="summary">')  # findings lead
    assert not re.search(r"(src|href)=\"(https?:)?//|@import|url\(", html)  # nothing to fetch
    assert "default-src 'none'" in html
    assert html.count("<script>") == 1  # the one inline script (the JSON block has a type)
    assert not list(tmp_path.glob(".*tmp"))


def test_render_report_sections_only_for_given_results(tmp_path):
    html = render_report(
        tmp_path / "r.html", model_info=MODEL_INFO, validation=Result("validation", validation_frame())
    ).read_text()
    assert '<section id="validation">' in html and '<section id="scores">' not in html


# Errors


def test_empty_results_raise(tmp_path):
    with pytest.raises(EmptyReportError, match="nothing to report"):
        render_report(tmp_path / "r.html", model_info=MODEL_INFO)
    with pytest.raises(EmptyReportError):
        render_report(tmp_path / "r.html", model_info=MODEL_INFO, heads=Result("heads", heads_frame().iloc[:0]))
    assert not (tmp_path / "r.html").exists()


def test_directory_path_raises(tmp_path):
    with pytest.raises(OutputPathError, match="is a directory"):
        render_report(tmp_path, model_info=MODEL_INFO, validation=Result("validation", validation_frame()))


def test_path_below_a_file_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputPathError, match="cannot create the folder"):
        render_report(blocker / "r.html", model_info=MODEL_INFO, validation=Result("validation", validation_frame()))


def test_unwritable_folder_raises(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root writes anywhere: refuse the probe file instead
        real_temp = render_module.tempfile.NamedTemporaryFile

        def refuse(*args, dir=None, **kwargs):
            if Path(dir) == folder:
                raise PermissionError(13, "Permission denied")
            return real_temp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(render_module.tempfile, "NamedTemporaryFile", refuse)
    try:
        with pytest.raises(OutputPathError, match="not writable"):
            render_report(folder / "r.html", model_info=MODEL_INFO, validation=Result("validation", validation_frame()))
    finally:
        folder.chmod(0o755)


def test_failed_render_leaves_existing_report_intact(tmp_path, monkeypatch):
    path = tmp_path / "r.html"
    path.write_text("old report")
    monkeypatch.setattr(sections, "validation_section", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        render_report(path, model_info=MODEL_INFO, validation=Result("validation", validation_frame()))
    assert path.read_text() == "old report"


def test_failed_write_leaves_existing_report_intact_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "r.html"
    path.write_text("old report")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputPathError, match="No space left"):
        render_report(path, model_info=MODEL_INFO, validation=Result("validation", validation_frame()))
    assert path.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_existing_report_is_replaced(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old report")
    render_report(path, model_info=MODEL_INFO, validation=Result("validation", validation_frame()))
    assert path.read_text().startswith("<!DOCTYPE html>")


# sample_patterns (headlens.classify.samples): peer is Hugging Face's own eager attention output

# float32 patterns from the same forward pass: hooks and output_attentions see identical tensors.
PATTERN_ATOL = 1e-6


def test_sample_patterns_match_hf_eager_attention(small_model):
    import torch

    from headlens.classify.samples import sample_patterns

    text = "The cat sat on the mat. The cat sat on the mat."
    sample = sample_patterns(small_model, text, max_tokens=8)
    ids = [small_model.bos_token_id] + small_model.tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = list(sample.frame["token"])
    assert sample.kind == "sample" and sample.meta["n_tokens_total"] == len(ids) and len(tokens) == 8
    assert "".join(tokens[1:]) == small_model.tokenizer.decode(ids[1:8]) and list(sample.frame["id"]) == ids[:8]
    with torch.no_grad():
        out = small_model.model(input_ids=torch.tensor([ids[:8]]), output_attentions=True)
    reference = torch.stack([layer[0] for layer in out.attentions])  # [layer, head, q, k]
    assert patterns_of(sample).shape == (2, 4, 8, 8)
    assert torch.allclose(patterns_of(sample), reference, atol=PATTERN_ATOL)


def test_repeated_sample_is_the_start_twice_when_the_model_copies_it(small_model, monkeypatch):
    from headlens.classify import samples

    # A random-weights model does not copy text: with the ratio raised past any loss, the text is taken.
    monkeypatch.setattr(samples, "COPY_LOSS_RATIO", float("inf"))
    sample = samples.sample_patterns(small_model, "one two three four five six seven eight nine ten", 9, repeat=True)
    tokens, ids = list(sample.frame["token"]), list(sample.frame["id"])
    assert len(tokens) == 9 and sample.meta["repeated"] and sample.meta["sample"] == samples.SAMPLE_TEXT
    assert tokens[1:5] == tokens[5:9] and ids[1:5] == ids[5:9]
    assert "".join(tokens[1:5]) == "one two three four"


def test_repeated_sample_is_random_tokens_when_the_model_does_not_copy_the_text(small_model):
    """Random weights copy nothing: the second copy's loss is about the first's, so the sample is a segment
    of random tokens twice, and the losses that decided it are recorded (measured here independently)."""
    import torch

    from headlens.classify.samples import SAMPLE_RANDOM, sample_patterns
    from headlens.probes.inputs import random_token_range

    text = "one two three four five six seven eight nine ten"
    sample = sample_patterns(small_model, text, 9, repeat=True)
    ids = list(sample.frame["id"])
    assert sample.meta["sample"] == SAMPLE_RANDOM and len(ids) == 9 and ids[1:5] == ids[5:9]
    low, high = random_token_range(small_model.spec.d_vocab)
    assert all(low <= i < high for i in ids[1:])
    body = small_model.tokenizer(text, add_special_tokens=False)["input_ids"][:4]
    repeated = torch.tensor([[small_model.bos_token_id] + body * 2])  # [1, 9]
    with torch.no_grad():
        logits = small_model.model(repeated).logits[0, :-1]  # [8, d_vocab]
    losses = torch.nn.functional.cross_entropy(logits, repeated[0, 1:], reduction="none")  # [8]
    first, second = sample.meta["copy_loss"]
    assert first == pytest.approx(float(losses[1:4].mean()), rel=1e-5)  # tokens 2-4 of the first copy
    assert second == pytest.approx(float(losses[5:8].mean()), rel=1e-5)  # tokens 2-4 of the second copy
    assert second > 0.5 * first


def test_default_viewer_tokens_fit_the_budget():
    from headlens.reports.viewer import VIEWER_WEIGHT_BUDGET, default_viewer_tokens

    assert default_viewer_tokens(12, 12, 1024) == 44  # GPT-2 small: the budget's own shape, 12 x 12 heads x 44 tokens
    n = default_viewer_tokens(3, 4, 256)
    assert 3 * 4 * n * n <= VIEWER_WEIGHT_BUDGET < 3 * 4 * (n + 1) ** 2
    assert default_viewer_tokens(1, 1, 50) == 50  # never beyond the context


def test_sample_patterns_errors(small_model):
    from headlens.classify.samples import sample_patterns
    from headlens.errors import ConfigError, InputTextError

    with pytest.raises(ConfigError, match="max_tokens"):
        sample_patterns(small_model, "text", max_tokens=1)
    with pytest.raises(InputTextError, match="white space"):
        sample_patterns(small_model, "   ")


@pytest.mark.slow
def test_gpt2_small_shaped_report_stays_under_cap(gpt2_shaped_model, tmp_path):
    """Worst case for size: all 144 heads labelled (144 thumbnails), every score, a sweep, 64 viewer tokens."""
    from headlens.classify.samples import sample_patterns
    from headlens.probes.inputs import default_text

    spec = gpt2_shaped_model.spec
    rng = np.random.default_rng(0)
    rows = [
        {
            "layer": layer,
            "head": head,
            "labels": ["positional", "first_token"],
            "positional_offset": -1,
            **{info.column: float(rng.uniform(info.vmin, info.vmax)) for info in explain.SCORES},
        }
        for layer in range(spec.n_layers)
        for head in range(spec.n_heads)
    ]
    sweep = pd.DataFrame(
        [
            {
                "layer": r["layer"],
                "head": r["head"],
                "n_tokens": 4000,
                "loss": 3.0,
                "loss_ablated": 3.1,
                "delta_loss": float(d),
                "ci95_low": float(d) - 0.01,
                "ci95_high": float(d) + 0.01,
            }
            for r, d in zip(rows, rng.normal(0, 0.05, len(rows)), strict=True)
        ]
    )
    viewer = sample_patterns(gpt2_shaped_model, default_text(), max_tokens=64)
    path = render_report(
        tmp_path / "gpt2.html",
        model_info={"name": "gpt2-shaped", **spec.__dict__},
        heads=Result("heads", pd.DataFrame(rows)),
        sweep=Result("sweep", sweep),
        viewer=viewer,
        training=training_pair(),
    )
    size = path.stat().st_size
    assert size < SIZE_CAP_BYTES, f"{size / 1e6:.2f} MB"
    assert img_count(path.read_text()) >= spec.n_layers * spec.n_heads


@pytest.mark.slow
def test_grouped_query_report_shows_its_groups_and_gpt2_shows_none(small_model, tmp_path):
    """Ground truth from the config: 8 query heads over 2 key/value heads, so heads 0-3 and 4-7 share K, V."""

    from headlens.classify import ClassifyConfig, classify_heads

    config = ClassifyConfig(n_seq=2, max_windows=2, needles=False)
    gqa = classify_heads(build_family("llama-gqa"), text=PLANTED_TEXT, config=config)
    html = render_report(tmp_path / "gqa.html", model_info=MODEL_INFO, heads=gqa).read_text(encoding="utf-8")
    kv = html[html.index('<section id="kv-groups">') :]
    kv = kv[: kv.index("</section>")]
    for layer in range(3):
        for first in (0, 4):
            assert ">" + ", ".join(f"{layer}.{head}" for head in range(first, first + 4)) + "<" in kv
    assert "6 groups of query heads" in kv
    mha = classify_heads(small_model, text=PLANTED_TEXT, config=config)
    assert 'id="kv-groups"' not in render_report(tmp_path / "mha.html", model_info=MODEL_INFO, heads=mha).read_text()


def test_the_title_names_the_model_not_a_machine_path(tmp_path):
    info = {**MODEL_INFO, "name": "/home/someone/models/smollm2/"}
    page = render_report(tmp_path / "r.html", model_info=info, heads=Result("heads", roles_frame())).read_text(
        encoding="utf-8"
    )
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert "smollm2" in title and "/home/someone" not in title
    assert "/home/someone/models/smollm2/" in page  # the summary keeps the full name
    assert sections.display_name({"name": "x", "display_name": "SmolLM2-135M (Q4_1)"}) == "SmolLM2-135M (Q4_1)"


# Numbers: one style per language, significant figures per quantity


@pytest.mark.parametrize(
    ("value", "digits", "en", "es"),
    [
        (2.649e-07, 3, "2.65 × 10⁻⁷", "2,65 × 10⁻⁷"),
        (0.0004323, 3, "4.32 × 10⁻⁴", "4,32 × 10⁻⁴"),
        (0.9968, 3, "0.997", "0,997"),
        (0.9968, 2, "1.0", "1,0"),
        (0.0123, 2, "0.012", "0,012"),
        (-12.345, 3, "-12.3", "-12,3"),
        (12345678.9, 3, "12,345,679", "12\u00a0345\u00a0679"),
        (1234.5, 3, "1,234", "1234"),  # Spanish groups only from 5 digits (RAE)
        (0.0, 3, "0", "0"),
    ],
)
def test_significant_writes_one_style_per_language(value, digits, en, es):
    from headlens.reports.i18n import significant

    assert (significant(value, "en", digits), significant(value, "es", digits)) == (en, es)


def test_table_cells_use_significant_figures_per_column():
    frame = pd.DataFrame({"p_value": [0.04761904], "max_abs_error": [2.649e-07], "prefix_matching_score": [0.99683]})
    html = sections.table(frame, lang="es")
    assert [m for m in re.findall(r'<td data-sort="[^"]*">([^<]*)</td>', html)] == ["0,048", "2,6 × 10⁻⁷", "0,997"]


def test_bar_labels_name_a_large_set_by_its_role():
    few = {"heads": ["1.0", "1.2"], "delta": 0.1}
    many = {"heads": [f"{layer}.0" for layer in range(24)], "role": "induction", "delta": 0.1}
    assert sections.bar_label(few) == "1.0,1.2" and sections.bar_label(many) == "induction (24)"
    assert sections.bar_label({"heads": many["heads"], "delta": 0.1}) == "0.0,1.0,\u2026 (24)"


def test_validation_summary_is_the_worst_layer_per_quantity_and_reference():
    frame = validation_frame(fail_layer=1)
    summary = sections.validation_summary(frame)
    for row in summary.itertuples():
        rows = frame[(frame["quantity"] == row.quantity) & (frame["reference"] == row.reference)]
        assert row.max_abs_error == rows["max_abs_error"].max() and row.layers == rows["layer"].nunique()
        assert row.passed == rows["passed"].all()
    assert len(summary) == len(frame.groupby(["quantity", "reference"]))
    html = sections.validation_section(Result("validation", frame))
    assert html.count("<details>") == 2  # the method paragraph and the full table, each folded under its line
    assert "<table" in html.split("<details>")[-1]  # the full table in the last fold, after the summary


def test_head_map_draws_every_role_of_a_head_and_counts_overlaps():
    from headlens.classify.kinds import BY_LABEL
    from headlens.reports import headmap

    heads = heads_frame()
    heads.at[0, "labels"] = ["previous_token", "positional", "first_token"]  # head 0.0: two roles and a sink
    heads.at[3, "labels"] = ["induction"]
    svg = headmap.head_map_svg(heads)
    cell = re.search(r'<g data-head="0.0"[^>]*>(.*?)</g>', svg).group(1)
    roles = re.findall(r'fill="(#[0-9a-f]{6})" data-role="(\w+)"', cell)
    assert roles == [
        (BY_LABEL["previous_token"].colour, "previous_token"),
        (BY_LABEL["positional"].colour, "positional"),
    ]
    assert 'data-property="first_token"' in cell
    assert headmap.role_counts(heads) == {"previous_token": 2, "positional": 1, "induction": 1}  # 0.1 too
    assert headmap.overlaps(heads) == {("previous_token", "positional"): 1}
    legend = headmap.legend(heads)
    assert re.findall(r'data-role="(\w+)"', legend) == ["previous_token", "positional", "induction"]
    assert "Positional heads (1)" in legend


def test_validation_names_the_bit_identical_references_and_the_independent_ones():
    eager = validation_frame().assign(max_abs_error=0.0)
    frame = pd.concat([eager, eager.assign(reference="sdpa", max_abs_error=3e-7)], ignore_index=True)
    note = sections.identical_note(frame)
    assert note.startswith("Errors of exactly 0 against hf_eager on every row") and "Independent: sdpa (" in note
    assert sections.identical_note(frame.assign(max_abs_error=3e-7)) == i18n.t("validation.independent", "en")
