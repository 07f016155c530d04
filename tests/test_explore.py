"""`headlens explore`'s JSON endpoints through Starlette's TestClient, on `tiny`: each view against an
independent computation (Hugging Face's own attention weights and logits, the direct path written out from
GPT-2's weights, `ablate_heads`), malformed requests, the token cap, two clients at once, the cached
classification and the CLI's refusals."""

from __future__ import annotations

import base64
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headlens.ablation import ablate_heads
from headlens.cli.commands_classify import _csv, _json
from headlens.cli.main import cli
from headlens.reports.explore import Explorer, create_app
from tests.helpers.explore_setup import OTHER, REPEATED, explore_client, hf_patterns, tiny_setup

# Patterns travel as one byte per weight (0..255) and rows with 4 decimals.
BYTE_ATOL = 1 / 255 / 2 + 1e-6
ROW_ATOL = 0.5e-4 + 1e-6
# A mean over a few dozen float32 losses, summed in float64 in two orders: agreement to ~1e-12 relative.
LOSS_RTOL = 1e-9


@pytest.fixture(scope="module")
def setup():
    return tiny_setup()


@pytest.fixture(scope="module")
def client(setup):
    loaded, frame, _ = setup
    return explore_client(create_app(Explorer(loaded, frame)))


def _run(client, text: str) -> dict:
    response = client.post("/api/run", json={"text": text})
    assert response.status_code == 200, response.text
    return response.json()


def _bytes(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.uint8).astype(np.float64) / 255


def test_page_forbids_external_requests_and_inline_script(client):
    response = client.get("/")
    csp = response.headers["content-security-policy"]
    for rule in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
        assert rule in csp
    html = response.text
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert urls  # the page does load its own files
    assert all(url.startswith("/static/") or url == "data:," for url in urls), urls  # data:, the empty icon
    assert "http://" not in html and "https://" not in html
    assert re.findall(r"<script(?![^>]*(?:src=|type=\"application/json\"))", html) == []  # no inline script
    for name in ("viewer_core.js", "explore.js", "explore.css", "report.css"):
        assert client.get(f"/static/{name}").status_code == 200


def test_page_scripts_have_no_prose_of_their_own():
    """Every word the scripts show comes from the catalogue (as test_report_i18n checks report.js)."""
    from importlib import resources

    for package, name in (("headlens.reports", "viewer_core.js"), ("headlens.reports.explore", "explore.js")):
        code = re.sub(r"^\s*//.*$", "", (resources.files(package) / name).read_text(encoding="utf-8"), flags=re.M)
        literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', code)) - {"use strict"}
        prose = [text for text in literals if re.search(r"[A-Za-z]{2,} [A-Za-z]{2,}", text)]
        assert prose == [], name


def test_thumbnails_head_and_token_row_are_the_models_attention(client, setup):
    loaded = setup[0]
    run = _run(client, REPEATED)
    truth = hf_patterns(loaded, REPEATED).numpy()  # [layer, head, q, k]
    pos = truth.shape[-1]
    assert len(run["tokens"]) == pos > 48  # longer than a thumbnail: the grid gets pooled cells
    layer = client.get(f"/api/layer?run={run['run']}&layer=1").json()
    size = layer["size"]
    thumbs = _bytes(layer["thumbs_b64"]).reshape(-1, size, size)  # [head, size, size]
    start = [i * pos // size for i in range(size)]  # adaptive pooling's bins: [floor(i n / s), ceil((i + 1) n / s))
    stop = [-(-(i + 1) * pos // size) for i in range(size)]
    for q in range(size):
        for k in range(size):
            block = truth[1, :, start[q] : stop[q], start[k] : stop[k]]  # [head, rows, cols]
            np.testing.assert_allclose(thumbs[:, q, k], block.max(axis=(1, 2)), atol=BYTE_ATOL)
    head = client.get(f"/api/head?run={run['run']}&layer=1&head=2").json()
    np.testing.assert_allclose(_bytes(head["pattern_b64"]).reshape(pos, pos), truth[1, 2], atol=BYTE_ATOL)
    assert head["labels"] == list(setup[1].set_index(["layer", "head"]).loc[(1, 2)].labels)
    assert "prefix_matching_score" in head["scores"]
    row = client.get(f"/api/row?run={run['run']}&layer=0&q={pos - 5}").json()
    np.testing.assert_allclose(np.array(row["weights"]), truth[0, :, pos - 5, : pos - 4], atol=ROW_ATOL)


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_ablation_equals_ablate_heads_and_top5_the_models_softmax(client, setup, method):
    loaded = setup[0]
    run = _run(client, REPEATED)
    at = len(run["tokens"]) - 3
    body = {"run": run["run"], "heads": ["1.0", "1.2"], "method": method, "position": at}
    shown = client.post("/api/ablate", json=body).json()
    truth = ablate_heads(loaded, "1.0,1.2", method=method, metric="loss", text=REPEATED, seed=0).meta
    assert shown["loss"] == pytest.approx(truth["loss"], rel=LOSS_RTOL)
    assert shown["loss_ablated"] == pytest.approx(truth["loss_ablated"], rel=LOSS_RTOL)
    assert len(shown["clean"]) == truth["n_tokens"] == len(run["tokens"]) - 1
    assert abs(shown["loss_ablated"] - shown["loss"]) > 1e-3  # the heads matter: not a comparison of equals
    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor([run["ids"]])).logits[0].double()  # [pos, d_vocab]
    probs = torch.softmax(logits[at], -1)
    best = torch.topk(probs, 5)
    assert [row["id"] for row in shown["top_clean"]] == best.indices.tolist()
    np.testing.assert_allclose([row["prob"] for row in shown["top_clean"]], best.values.numpy(), atol=1e-5)
    losses = -torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(run["ids"][1:])[:, None])[:, 0]
    np.testing.assert_allclose(shown["clean"], losses.numpy(), atol=1e-4)
    again = client.post("/api/ablate", json={**body, "heads": ["0.0"]}).json()  # the clean part reused
    truth = ablate_heads(loaded, "0.0", method=method, metric="loss", text=REPEATED, seed=0).meta
    assert (again["loss"], again["loss_ablated"]) == pytest.approx(
        (truth["loss"], truth["loss_ablated"]), rel=LOSS_RTOL
    )


def test_a_role_is_ablated_as_its_heads(client, setup):
    frame = setup[1]
    induction = [f"{r.layer}.{r.head}" for r in frame.itertuples() if "induction" in r.labels]
    assert induction  # tiny has induction heads (test_classify_tiny.py checks them against controls)
    run = _run(client, REPEATED)
    by_role = client.post(
        "/api/ablate", json={"run": run["run"], "heads": "induction", "method": "zero", "position": 3}
    ).json()
    by_name = client.post(
        "/api/ablate", json={"run": run["run"], "heads": induction, "method": "zero", "position": 3}
    ).json()
    assert by_role["heads"] == sorted(induction) and by_role["ablated"] == by_name["ablated"]


def test_direct_effects_are_the_direct_path_written_out(client, setup):
    """GPT-2's direct path: head h writes z_h W_O^h; the final LayerNorm, its scale frozen at the clean
    residual, centres it and divides by that scale; the unembedding row of the target, times the norm's gain."""
    loaded = setup[0]
    model = loaded.model
    run = _run(client, REPEATED)
    at = 20
    shown = client.post("/api/direct", json={"run": run["run"], "position": at}).json()
    ids = torch.tensor([run["ids"]])
    z, final_in = {}, []
    blocks = model.transformer.h
    hooks = [
        blocks[i].attn.c_proj.register_forward_pre_hook(lambda m, a, i=i: z.__setitem__(i, a[0][0, at].double()))
        for i in range(len(blocks))
    ]
    hooks.append(model.transformer.ln_f.register_forward_pre_hook(lambda m, a: final_in.append(a[0][0, at].double())))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, at].double()
    for hook in hooks:
        hook.remove()
    target = int(logits.argmax())
    assert loaded.tokenizer.decode([target]) == shown["target"]
    assert shown["logit"] == pytest.approx(float(logits[target]), abs=1e-4)
    ln = model.transformer.ln_f
    scale = (final_in[0].var(unbiased=False) + ln.eps).sqrt()
    direction = (ln.weight.double() * model.lm_head.weight[target].double() / scale).detach()  # [d_model]
    n_heads = model.config.n_head
    for layer, block in enumerate(blocks):
        w_o = block.attn.c_proj.weight.double().view(n_heads, -1, block.attn.c_proj.weight.shape[1])  # Conv1D [in, out]
        for head in range(n_heads):
            written = z[layer].view(n_heads, -1)[head] @ w_o[head].detach()  # [d_model]
            expected = float((written - written.mean()) @ direction)
            assert shown["direct"][layer][head] == pytest.approx(expected, abs=1e-5)
    foil = client.post("/api/direct", json={"run": run["run"], "position": at, "target": "x", "foil": "k"}).json()
    x, k = (loaded.tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in "xk")
    assert foil["logit"] == pytest.approx(float(logits[x] - logits[k]), abs=1e-4)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/api/run", b"not json", 400),
        ("/api/run", b"[1, 2]", 400),
        ("/api/run", json.dumps({"text": 7}).encode(), 400),
        ("/api/run", json.dumps({"text": "   "}).encode(), 422),
        ("/api/ablate", json.dumps({"run": "nope", "heads": ["0.0"], "method": "zero", "position": 1}).encode(), 422),
        ("/api/ablate", json.dumps({"run": "x", "heads": [1], "method": "zero", "position": 1}).encode(), 400),
        ("/api/direct", json.dumps({"run": "x", "position": "3"}).encode(), 400),
        ("/api/run", b"x" * 300_000, 413),
    ],
)
def test_malformed_requests_get_a_4xx_and_one_line(client, path, body, status):
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert set(response.json()) == {"error"} and "\n" not in response.json()["error"]


def test_bad_values_of_a_good_run_are_refused(client):
    run = _run(client, "short text")["run"]
    for url in (f"/api/layer?run={run}&layer=9", f"/api/head?run={run}&layer=0&head=-1", f"/api/row?run={run}&layer=x"):
        response = client.get(url)
        assert 400 <= response.status_code < 500 and "error" in response.json()
    for body in (
        {"run": run, "heads": ["0.0"], "method": "erase", "position": 1},
        {"run": run, "heads": [], "method": "zero", "position": 1},
        {"run": run, "heads": ["0.0"], "method": "zero", "position": 99},
    ):
        assert client.post("/api/ablate", json=body).status_code == 422
    assert client.post("/api/direct", json={"run": run, "position": 1, "target": "two tokens"}).status_code == 422
    assert client.get("/api/nothing").status_code == 404
    assert client.get("/static/../../etc/passwd").status_code == 404


def test_text_over_the_cap_is_refused_with_the_cap(setup):
    loaded, frame, _ = setup
    small = explore_client(create_app(Explorer(loaded, frame, max_tokens=20)))
    response = small.post("/api/run", json={"text": "a" * 21})
    assert response.status_code == 413 and "21 tokens" in response.json()["error"] and "20" in response.json()["error"]
    assert small.post("/api/run", json={"text": "a" * 20}).status_code == 200
    assert Explorer(loaded, frame).max_tokens == 255  # tiny's context (256, BOS included) caps the default 512


def test_two_clients_at_once_get_their_own_answers(setup):
    loaded, frame, _ = setup
    app = create_app(Explorer(loaded, frame))
    texts = [REPEATED, OTHER]
    truth = [hf_patterns(loaded, text).numpy() for text in texts]
    results: dict = {}
    barrier = threading.Barrier(2)

    def user(index: int) -> None:
        client = explore_client(app)
        barrier.wait()
        for _ in range(3):
            run = _run(client, texts[index])
            row = client.get(f"/api/row?run={run['run']}&layer=1&q=8").json()
            loss = client.post(
                "/api/ablate", json={"run": run["run"], "heads": ["1.1"], "method": "zero", "position": 4}
            ).json()
            results.setdefault(index, []).append((run["tokens"], row["weights"], loss["loss"]))

    threads = [threading.Thread(target=user, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, text in enumerate(texts):
        assert len(results[index]) == 3
        for tokens, weights, loss in results[index]:
            assert "".join(tokens[1:]) == text
            np.testing.assert_allclose(np.array(weights), truth[index][1, :, 8, :9], atol=ROW_ATOL)
            assert loss == pytest.approx(results[index][0][2], rel=1e-12)
    assert results[0][0][2] != pytest.approx(results[1][0][2])


def test_classification_is_cached_and_read_back(setup, monkeypatch, tmp_path):
    from headlens.classify import cache as classify_cache

    loaded, frame, cache = setup
    entries = sorted(Path(cache, "classify").glob("*/data"))  # tiny's, and whatever other tests put there
    assert entries
    monkeypatch.setenv("HEADLENS_CACHE", cache)
    monkeypatch.setattr(classify_cache, "classify_heads", lambda *a, **k: pytest.fail("classified again"))
    again = classify_cache.cached_classification(loaded)
    assert sorted(Path(cache, "classify").glob("*/data")) == entries  # read back, nothing new written
    assert list(again["labels"]) == list(frame["labels"])
    np.testing.assert_allclose(again["prefix_matching_score"], frame["prefix_matching_score"])
    for name, text in (("heads.csv", _csv(frame)), ("heads.json", _json(frame))):
        path = tmp_path / name
        path.write_text(text)
        read = classify_cache.read_classification(path)
        assert list(read["labels"]) == list(frame["labels"]) and len(read) == len(frame)


def test_cli_refuses_a_missing_labels_file_and_a_taken_port(tmp_path):
    result = CliRunner().invoke(cli, ["explore", "tiny", "--labels", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "labels file not found" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = CliRunner().invoke(cli, ["explore", "tiny", "--labels", str(bad)])
    assert result.exit_code == 2 and "not a classification" in result.output
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["explore", "tiny", "--port", str(port), "--labels", str(bad)])
        assert result.exit_code == 2
        result = CliRunner().invoke(cli, ["explore", "tiny", "--port", str(port)])
    assert result.exit_code == 2 and "in use" in result.output.lower() and result.output.count("\n") == 1


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_page_speaks_one_language_from_the_catalogue(lang):
    from headlens.reports.explore.page import page_html
    from headlens.reports.i18n import catalogue, js_messages

    model = {"name": "m", "n_layers": 1, "n_heads": 1, "max_tokens": 9, "labels": {}, "roles": [], "methods": []}
    html = page_html(model, lang)
    other = "es" if lang == "en" else "en"
    keys = [
        key for key in catalogue(lang) if key.startswith("explore.") and catalogue(lang)[key] != catalogue(other)[key]
    ]
    assert keys
    import html as html_lib

    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", html.split('<script type="application/json"')[0]))
    for key in keys:
        assert catalogue(lang)[key].split("{")[0][:40] in html_lib.unescape(html), key
        assert catalogue(other)[key].split("{")[0][:40] not in text, key
    assert f'<html lang="{lang}">' in html
    assert json.dumps(js_messages(lang)["x_working"], ensure_ascii=False) in html
