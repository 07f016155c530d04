"""The tiny-model recipes: tokenizer, batches, schedule, ICL measures, micro runs of both architectures, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from headlens.capture import iter_batches, run_capture
from headlens.errors import ConfigError, OutputPathError
from headlens.scores.icl import copy_losses, icl_positions, icl_score, second_copy_induction_reducer
from headlens.training import (
    HEAD_COLUMNS,
    LOG_COLUMNS,
    TrainConfig,
    byte_tokenizer,
    load_training_log,
    lr_at,
    recipe,
    sample_batch,
    stages,
    train_tiny,
)

# Columns of training_log.csv (headlens.training.loop.LOG_COLUMNS), in order.
CONTRACT_LOG_COLUMNS = [
    "step",
    "tokens_seen",
    "train_loss",
    "heldout_loss",
    "icl_score",
    "best_induction_score",
    "best_prev_token_score",
    "repeat_loss_first",
    "repeat_loss_second",
]
# A micro recipe: 2 layers x 2 heads, 64-token context, batch 4; 6 steps, checkpoint every 3.
MICRO = TrainConfig(
    steps=6,
    n_layers=2,
    n_heads=2,
    d_model=32,
    d_mlp=128,
    n_ctx=64,
    batch_size=4,
    segment_max=16,
    needle_max=12,
    checkpoint_every=3,
    eval_windows=4,
    probe_seqs=4,
    probe_seq_len=20,
)
# The same micro shape as a Llama with grouped-query attention: 4 query heads over 2 key/value heads.
MICRO_LLAMA = replace(MICRO, arch="llama", n_heads=4, n_kv_heads=2)
# float64 sums of float32 losses: exact arithmetic on these constructed values up to rounding.
FLOAT_TOL = 1e-9


@pytest.fixture(scope="module")
def micro_runs(tmp_path_factory):
    """Two micro runs with seed 0 and one with seed 1 (about 15 s together)."""
    base = tmp_path_factory.mktemp("micro")
    return {name: train_tiny(base / name, seed=seed, config=MICRO) for name, seed in (("a", 0), ("b", 0), ("c", 1))}


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory):
    """Two micro Llama runs with seed 0 (a few seconds)."""
    base = tmp_path_factory.mktemp("micro-llama")
    return [train_tiny(base / name, config=MICRO_LLAMA) for name in "ab"]


# Tokenizer and batches --------------------------------------------------------------------


def test_byte_tokenizer_ids_are_utf8_bytes(tmp_path):
    from transformers import AutoTokenizer

    byte_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "In the beginning, é \n\t~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))  # ground truth: the UTF-8 encoding itself
    assert tok.decode(ids) == text
    assert tok.bos_token_id == 256 and len(tok) == 257


def test_sample_batch_bos_and_repeated_segments():
    config = TrainConfig(batch_size=64, repeat_share=1.0, needle_share=0.0, printable_share=1.0)
    corpus = torch.full((10_000,), ord("a"), dtype=torch.uint8)  # a corpus with one byte
    ids = sample_batch(corpus, config, torch.Generator().manual_seed(0))  # [batch, n_ctx]
    assert ids.shape == (64, config.n_ctx) and (ids[:, 0] == 256).all()
    for row in ids[:, 1:]:
        segment_part = row[(row != ord("a")).nonzero()[0, 0] :]  # from the first random token on
        # the tail is periodic with a period in [segment_min, segment_max]
        assert any(
            torch.equal(segment_part[p:], segment_part[:-p]) for p in range(config.segment_min, config.segment_max + 1)
        )
        assert ((segment_part >= 32) & (segment_part < 127)).all()


def test_sample_batch_text_only_copies_the_corpus():
    config = TrainConfig(batch_size=8, repeat_share=0.0, needle_share=0.0)
    corpus = torch.arange(5000) % 251  # every window is identified by its first byte
    ids = sample_batch(corpus.to(torch.uint8), config, torch.Generator().manual_seed(3))
    for row in ids[:, 1:]:
        assert torch.equal(row, (torch.arange(config.n_ctx - 1) + int(row[0])) % 251)


def test_lr_schedule_warmup_hold_decay():
    config = TrainConfig(steps=1000, lr=1e-3, warmup_steps=10, decay_share=0.2, final_lr_share=0.1)
    assert lr_at(0, config) == pytest.approx(1e-4)
    assert lr_at(500, config) == pytest.approx(1e-3)
    assert lr_at(800, config) == pytest.approx(1e-3)
    assert lr_at(900, config) == pytest.approx(1e-3 * (1 - 0.5 * 0.9))  # halfway down the decay
    assert lr_at(1000, config) == pytest.approx(1e-4)  # the line ends at final_lr_share * lr


# ICL measures -------------------------------------------------------------------------------


def test_icl_score_is_late_minus_early_band():
    n_ctx = 256
    early, late = icl_positions(n_ctx)
    assert (early, late) == (25, 250)  # Olsson's 50 and 500 of 512, scaled by 256/512
    losses = torch.full((3, n_ctx - 1), 9.0)  # [batch, pos-1]; index t = loss of token t + 1
    losses[:, early - 6 : early + 5] = 3.0  # tokens early-5..early+5
    losses[:, late - 6 : late + 5] = 2.5
    assert icl_score(losses, n_ctx) == pytest.approx(-0.5, abs=FLOAT_TOL)


def test_copy_losses_skip_the_first_token_of_each_copy():
    seq_len = 10
    losses = torch.zeros(2, 2 * seq_len)  # [batch, 2 * seq_len]
    losses[:, 1:seq_len] = 4.0
    losses[:, seq_len + 1 :] = 1.0
    losses[:, 0] = losses[:, seq_len] = 100.0  # unpredictable first tokens: never counted
    assert copy_losses(losses, seq_len) == pytest.approx((4.0, 1.0), abs=FLOAT_TOL)


def test_second_copy_induction_reducer_on_planted_patterns():
    from headlens.capture import Batch

    seq_len, n = 6, 13  # [BOS, c(6), c(6)] with distinct tokens
    ids = torch.cat([torch.tensor([[256]]), torch.arange(seq_len).repeat(1, 2) + 40], dim=1)  # [1, 13]
    induction = torch.zeros(n, n)
    prev = torch.zeros(n, n)
    for q in range(n):
        prev[q, max(q - 1, 0)] = 1.0
        induction[q, q - seq_len + 1 if q > seq_len else 0] = 1.0
    pattern = torch.stack([induction, prev])[None]  # [batch, head, q_pos, k_pos]
    reducer = second_copy_induction_reducer(1, 2, seq_len)
    reducer.update(0, Batch(ids, torch.ones_like(ids, dtype=torch.bool)), pattern=pattern)
    scores = reducer.result()  # [layer, head]
    assert scores[0, 0].item() == pytest.approx(1.0)  # paper definition: all mass on the targets
    assert scores[0, 1].item() == pytest.approx(0.0)
    assert int(reducer.counts[0]) == seq_len  # the second copy's queries only


# The micro run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_micro_run_writes_model_checkpoints_and_log(micro_runs):
    from headlens.load.models import load_model

    folder = micro_runs["a"]
    run = load_training_log(folder)
    log, heads = run.frame, run.tables["heads"]
    assert run.kind == "training" and run.meta["folder"] == str(folder)
    assert list(log.columns[: len(CONTRACT_LOG_COLUMNS)]) == CONTRACT_LOG_COLUMNS
    assert list(log.columns) == LOG_COLUMNS and list(heads.columns) == HEAD_COLUMNS
    assert log["step"].tolist() == [0, 3, 6]
    assert log["tokens_seen"].tolist() == [0, 3 * 4 * 64, 6 * 4 * 64]
    assert math.isnan(log["train_loss"][0]) and log["train_loss"][1:].notna().all()
    assert log.drop(columns="train_loss").notna().all().all()
    assert len(heads) == 3 * 2 * 2 and heads.groupby("step").size().tolist() == [4, 4, 4]
    assert heads[["prev_token_score", "prefix_matching_score"]].apply(lambda c: c.between(0, 1)).all().all()
    for step in (0, 3, 6):
        assert (folder / "checkpoints" / f"step_{step:05d}" / "model.safetensors").is_file()
    loaded = load_model(str(folder))
    assert loaded.spec.n_layers == 2 and loaded.spec.n_heads == 2 and loaded.spec.n_ctx == 64
    assert loaded.bos_token_id == 256 and loaded.spec.d_vocab == 257
    final = load_file(folder / "model.safetensors")
    last = load_file(folder / "checkpoints" / "step_00006" / "model.safetensors")
    assert all(torch.equal(final[k], last[k]) for k in last)


@pytest.mark.slow
def test_micro_run_is_deterministic_under_seed(micro_runs):
    a, b, c = (load_file(micro_runs[k] / "model.safetensors") for k in "abc")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed: bit-identical weights
    assert not all(torch.equal(a[k], c[k]) for k in a)  # another seed: other weights
    run_a, run_b = load_training_log(micro_runs["a"]), load_training_log(micro_runs["b"])
    pd.testing.assert_frame_equal(run_a.frame.drop(columns="elapsed_s"), run_b.frame.drop(columns="elapsed_s"))
    pd.testing.assert_frame_equal(run_a.tables["heads"], run_b.tables["heads"])


@pytest.mark.slow
def test_logged_scores_match_a_fresh_measurement(micro_runs):
    """The final log row's head scores equal scores measured again on the saved model."""
    from headlens.load.models import load_model
    from headlens.probes.inputs import repeated_random_tokens

    loaded = load_model(str(micro_runs["a"]))
    heads = load_training_log(micro_runs["a"]).tables["heads"]
    ids = repeated_random_tokens(MICRO.probe_seqs, MICRO.probe_seq_len, 2, 32, 127, 256, seed=MICRO.probe_seed)
    reducer = second_copy_induction_reducer(2, 2, MICRO.probe_seq_len)
    run_capture(loaded.model, iter_batches(ids, 16), [reducer])
    logged = heads[heads.step == 6].sort_values(["layer", "head"])["prefix_matching_score"].to_numpy()
    assert torch.allclose(reducer.result().flatten().double(), torch.tensor(logged), atol=1e-6)


# Errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("seed", -1),
        ("d_model", 30),
        ("repeat_share", 1.5),
        ("segment_min", 1),
        ("probe_seq_len", 200),
        ("segment_max", 500),
        ("arch", "mamba"),
        ("n_kv_heads", 3),
        ("needle_share", 0.9),
        ("needle_max", 100),
    ],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainConfig(**{field: value})


def test_out_dir_errors(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        train_tiny(afile, config=MICRO)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "training_log.csv").write_text("step\n0\n")
    with pytest.raises(OutputPathError, match="already holds files and is not an earlier train-tiny run"):
        train_tiny(tmp_path / "run", config=MICRO)
    assert (tmp_path / "run" / "training_log.csv").read_text() == "step\n0\n"  # nothing lost
    with pytest.raises(OutputPathError, match="not found"):
        load_training_log(tmp_path)


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    from headlens.cli.main import cli

    result = CliRunner().invoke(cli, ["train-tiny", "--steps", "0", "--out-dir", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "steps=0" in result.stderr
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(cli, ["train-tiny", "--out-dir", str(tmp_path / "f")])
    assert result.exit_code == 2 and "is a file" in result.stderr


@pytest.mark.slow
def test_cli_trains_the_default_recipe_for_two_steps(tmp_path, capfd):
    from headlens.cli.main import cli

    out = tmp_path / "run"
    result = CliRunner().invoke(
        cli, ["train-tiny", "--steps", "2", "--seed", "3", "--out-dir", str(out), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "loss_type" not in result.output + capfd.readouterr().err  # transformers is told the loss, not left to warn
    assert "trained 2 steps" in result.stdout  # --steps is the total: one step in each of the two stages
    log = load_training_log(out).frame
    assert log["step"].tolist() == [0, 1, 2]  # stage 2's log continues stage 1's
    assert log["lr"].iloc[-1] == pytest.approx(lr_at(0, recipe("gpt2", steps=1)))
    for folder in (out, out / "stage1"):
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert json.loads((out / "train_config.json").read_text())["init_from"] == str(out / "stage1")


def test_steps_are_the_total_shared_over_the_stages_in_the_recipe_proportion():
    from headlens.errors import ConfigError
    from headlens.training.config import stages
    from headlens.training.loop import split_steps

    tiny = list(stages("gpt2"))  # 3,000 + 600 steps
    assert split_steps(5, tiny) == [4, 1] and split_steps(2, tiny) == [1, 1]
    assert split_steps(sum(s.steps for s in tiny), tiny) == [s.steps for s in tiny]
    assert split_steps(5, list(stages("llama"))) == [5]
    with pytest.raises(ConfigError, match="steps=1 is invalid"):
        split_steps(1, tiny)


# Episodes -------------------------------------------------------------------------------------


def test_needle_episodes_hold_one_needle_twice_inside_consecutive_text():
    config = TrainConfig(batch_size=32, repeat_share=0.0, needle_share=1.0)
    corpus = (torch.arange(20_000) % 20 + 160).to(torch.uint8)  # non-printable bytes: needles stand out
    ids = sample_batch(corpus, config, torch.Generator().manual_seed(1))  # [batch, n_ctx]
    for row in ids[:, 1:].tolist():
        marks = [i for i, b in enumerate(row) if 32 <= b < 127]
        runs = [[marks[0]]]
        for i in marks[1:]:
            (runs[-1].append(i) if i == runs[-1][-1] + 1 else runs.append([i]))
        first, second = ([row[i] for i in run] for run in runs[:2])
        assert len(runs) in (1, 2)
        assert config.needle_min <= len(first) <= config.needle_max
        if len(runs) == 2:  # the second copy may run past the context
            assert second == first[: len(second)]
            assert runs[1][0] - runs[0][-1] - 1 >= 4  # text between the copies
        text = [b for i, b in enumerate(row) if not 32 <= b < 127]  # the text without the needles
        assert all((b - a) % 20 == 1 for a, b in zip(text, text[1:], strict=False))  # consecutive corpus bytes


def test_recipes_per_architecture():
    first, second = stages("gpt2")
    assert first == TrainConfig() and first.needle_share == 0  # stage 1: repeats and text only
    assert recipe("gpt2") == second and second.needle_share > 0 and second.arch == "gpt2"
    assert [s.steps for s in stages("gpt2", steps=7)] == [7, 7]
    gqa = recipe("llama")
    assert stages("llama") == (gqa,)
    assert gqa.arch == "llama" and gqa.n_heads == 8 and gqa.kv_heads == 2
    assert recipe("llama", steps=5).steps == 5
    with pytest.raises(ConfigError, match="arch"):
        recipe("mamba")


# The Llama micro run --------------------------------------------------------------------------


@pytest.mark.slow
def test_llama_micro_run_is_grouped_and_deterministic(llama_runs):
    from transformers import AutoModelForCausalLM

    a, b = (load_file(folder / "model.safetensors") for folder in llama_runs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # same seed: bit-identical
    model = AutoModelForCausalLM.from_pretrained(str(llama_runs[0]))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    assert a["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 8, 32)  # 2 key/value heads of d_head 8
    run = load_training_log(llama_runs[0])
    log, heads = run.frame, run.tables["heads"]
    assert log["step"].tolist() == [0, 3, 6] and len(heads) == 3 * 2 * 4


@pytest.mark.slow
def test_cli_trains_the_llama_recipe_deterministically(tmp_path):
    from headlens.cli.main import cli

    weights = []
    for name in "ab":
        out = tmp_path / name
        result = CliRunner().invoke(
            cli, ["train-tiny", "--arch", "llama", "--steps", "3", "--out-dir", str(out), "--no-progress"]
        )
        assert result.exit_code == 0, result.output
        weights.append(load_file(out / "model.safetensors"))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert (
        weights[0]["model.layers.0.self_attn.k_proj.weight"].shape[0] * 4
        == weights[0]["model.layers.0.self_attn.q_proj.weight"].shape[0]
    )  # 8 query heads over 2 key/value heads
