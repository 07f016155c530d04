"""The explorer on `tiny`, shared by the tests/test_explore*.py files (built once per process): the shipped
model, its default classification (computed into a temporary headlens cache), a test client that has
visited the address with the server's token (as a user's browser does first), and the library's own
pattern of a text, read through Hugging Face's eager attention (a peer of our capture)."""

from __future__ import annotations

import functools
import os
import tempfile

import torch
from starlette.testclient import TestClient

# A phrase twice: tiny is a byte-level model, so random-looking "words" make its induction heads copy.
REPEATED = "xq7 kz9 wp2 fj4 bn8 lt3. xq7 kz9 wp2 fj4 bn8 lt3."
OTHER = "Sentences differ: this one is another client's text."
BASE = "http://127.0.0.1:8765"  # where the test clients believe the explorer is


def explore_client(app, base_url: str = BASE, **kwargs) -> TestClient:
    """A TestClient of the explorer app that has opened the printed address (`/?token=...`): the server
    answered with a redirect to `/` and the cookie that every later request of this client carries."""
    client = TestClient(app, base_url=base_url, **kwargs)
    first = client.get(f"/?token={app.token}")
    assert first.status_code == 200 and [r.status_code for r in first.history] == [303], first.text
    return client


@functools.lru_cache(maxsize=1)
def tiny_setup():
    """(loaded tiny, its classify frame, the cache folder the classification went to)."""
    from headlens.classify.cache import cached_classification
    from headlens.load.models import load_model

    cache = tempfile.mkdtemp(prefix="headlens-explore-cache-")
    saved = os.environ.get("HEADLENS_CACHE")
    os.environ["HEADLENS_CACHE"] = cache
    try:
        loaded = load_model("tiny")
        frame = cached_classification(loaded)
    finally:
        if saved is None:
            del os.environ["HEADLENS_CACHE"]
        else:
            os.environ["HEADLENS_CACHE"] = saved
    return loaded, frame, cache


def hf_patterns(loaded, text: str) -> torch.Tensor:
    """Every head's pattern on BOS + text from the model's own eager forward: [layer, head, q, k] float32."""
    body = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[loaded.bos_token_id] + body])  # [1, pos]
    with torch.no_grad():
        out = loaded.model(input_ids=ids, output_attentions=True)
    return torch.stack([a[0].float() for a in out.attentions])  # [layer, head, q, k]
