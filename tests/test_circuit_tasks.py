"""headlens.circuits.tasks: where the induction and IOI tasks read the logits, and their metrics against
the loss and logit difference computed here from the model's logits."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from headlens.circuits.tasks import induction_task, ioi_task, make_task
from headlens.errors import ConfigError
from headlens.intervene.evalset import read_prompts
from headlens.load.models import gpt2_tokenizer


def test_induction_task_reads_the_second_copy_after_its_first_token(small_model):
    task = induction_task(small_model, n=3, seq_len=5, seed=1)
    assert task.tokens.shape == (3, 11)
    assert torch.equal(task.tokens[:, 1:6], task.tokens[:, 6:])  # two copies after BOS
    assert task.where[0].nonzero().flatten().tolist() == [6, 7, 8, 9]  # predicting tokens 7..10
    assert torch.equal(task.target[task.where], task.tokens[:, 7:].flatten())
    assert not torch.equal(task.corrupted, task.tokens) and task.corrupted.shape == task.tokens.shape
    with torch.no_grad():
        logits = small_model.model(input_ids=task.tokens).logits  # [batch, pos, d_vocab]
    loss = F.cross_entropy(logits[:, 6:10].reshape(-1, logits.shape[-1]), task.tokens[:, 7:].flatten())
    assert float(task.metric(logits)) == pytest.approx(float(loss), rel=1e-5)
    centred = logits[:, 6:10].gather(-1, task.tokens[:, 7:, None])[..., 0] - logits[:, 6:10].mean(-1)
    assert float(task.logit_metric(logits)) == pytest.approx(float(centred.mean()), rel=1e-4, abs=1e-5)


def test_ioi_s2_io_flip_counterfactual_names_the_indirect_object_twice(small_model):
    # MIB's default IOI counterfactual: only S2 changes, to the indirect object's token, so in the
    # counterfactual the subject (S) is the name mentioned once: the answer flips
    task = ioi_task(small_model, n=6, seed=0, counterfactual="s2-io-flip")
    for row, p in enumerate(task.prompts):
        changed = (task.corrupted[row] != task.tokens[row]).nonzero().flatten().tolist()
        assert changed == [p["s2_pos"]]
        assert int(task.corrupted[row, p["s2_pos"]]) == int(task.tokens[row, p["io_pos"]])
    with pytest.raises(ConfigError, match="counterfactual"):
        ioi_task(small_model, n=2, counterfactual="abba")


def test_ioi_task_reads_end_and_its_abc_run_replaces_the_three_names(small_model):
    task = ioi_task(small_model, n=6, seed=0)
    assert task.metric_name == "logit-diff" and task.higher_is_better
    for row, p in enumerate(task.prompts):
        end = len(p["ids"]) - 1
        assert task.where[row].nonzero().flatten().tolist() == [end]
        assert (int(task.target[row, end]), int(task.foil[row, end])) == (p["io"], p["s"])
        names = [int(task.corrupted[row, p[k]]) for k in ("io_pos", "s1_pos", "s2_pos")]
        assert len(set(names)) == 3  # A, B, C: nothing says which is the indirect object
        changed = (task.corrupted[row] != task.tokens[row]).nonzero().flatten().tolist()
        assert set(changed) <= {p["io_pos"], p["s1_pos"], p["s2_pos"]}
    with torch.no_grad():
        logits = small_model.model(input_ids=task.tokens, attention_mask=task.mask.long()).logits
    diffs = [
        float(logits[r, len(p["ids"]) - 1, p["io"]] - logits[r, len(p["ids"]) - 1, p["s"]])
        for r, p in enumerate(task.prompts)
    ]
    assert float(task.metric(logits)) == pytest.approx(sum(diffs) / len(diffs), rel=1e-5, abs=1e-6)


def test_a_prompts_file_is_an_ioi_task_without_corrupted_run(small_model, tmp_path):
    lines = [
        {"prompt": "When Mary and John went to the store, John gave a drink to", "target": " Mary", "foil": " John"},
        {"prompt": "Then Tom and Anne ate. Anne thanked", "target": " Tom", "foil": " Anne"},
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    task = ioi_task(small_model, prompts=read_prompts(path))
    assert task.corrupted is None and task.n_read == 2
    tok = gpt2_tokenizer()
    for row, line in enumerate(lines):
        ids = tok(line["prompt"])["input_ids"]
        at = task.where[row].nonzero().flatten().tolist()
        assert at == [len(ids)]  # BOS first, then the prompt: its last token
        assert task.target[row, at[0]] == tok(line["target"])["input_ids"][0]
        assert task.foil[row, at[0]] == tok(line["foil"])["input_ids"][0]


def test_unknown_task_and_prompts_with_induction_are_config_errors(small_model):
    with pytest.raises(ConfigError, match="unknown task"):
        make_task(small_model, "copying")
    with pytest.raises(ConfigError, match="--task ioi"):
        make_task(small_model, "induction", prompts=[])


def test_a_tasks_evalset_scores_its_targets_as_ablate_does(small_model):
    from headlens.intervene.sums import ablated_sums

    for task in (induction_task(small_model, n=3, seq_len=6), ioi_task(small_model, n=5)):
        evalset = task.evalset()
        rows, cols = task.where.nonzero(as_tuple=True)
        assert torch.equal(evalset.input_ids[rows, cols + 1], task.target[rows, cols])
        assert evalset.n_tokens == task.n_read
        with torch.no_grad():
            logits = small_model.model(input_ids=task.tokens, attention_mask=task.mask.long()).logits
        total = ablated_sums(small_model.model, evalset, [], [None] * small_model.spec.n_layers).sum()
        assert float(total) / evalset.n_tokens == pytest.approx(float(task.metric(logits)), rel=1e-4, abs=1e-5)
