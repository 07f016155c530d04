"""More tries of benchmarks/hostile_battery.py, on crafted files: GGUF headers written byte by byte, model folders
with a hostile tokenizer.json, inputs of many megabytes (memory that must not grow with the input) and
treebanks."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

from hostile_tries import ARRAY, DEEP, GPT2, INT32, PANICS, STRING, UINT32, UINT64, WORDS, Try

from tests.test_security_gguf import LLAMA as LLAMA_KV
from tests.test_security_gguf import gguf_bytes as test_gguf_bytes
from tests.test_security_gguf import gguf_string


def gguf_bytes(kv: dict, tensors=(("t", (4,), 0, 0),), raw_kv: bytes = b"", extra_kv: int = 0, version=3) -> bytes:
    """A GGUF file as tests/test_security_gguf.py writes one (`kv`, tensors, `raw_kv`), of format `version`."""
    data = test_gguf_bytes(kv, tensors, raw_kv, extra_kv)
    return data[:4] + struct.pack("<I", version) + data[8:]


def ggufs(work: Path) -> list[Try]:
    evil = "\x1b[2J\x1b]0;owned\x07llama"
    cases = {
        f"alignment {v!r}": gguf_bytes({**LLAMA_KV, "general.alignment": v})
        for v in ((UINT32, 0), (INT32, -8), (STRING, "32"), (UINT32, 24), (UINT64, 1 << 40))
    }
    cases |= {
        "dims whose product overflows": gguf_bytes(LLAMA_KV, [("token_embd.weight", (2**62, 2**62, 2**40), 0, 0)]),
        "64 dimensions": gguf_bytes(LLAMA_KV, [("t", (1,) * 64, 0, 0)]),
        "array past the end": gguf_bytes(
            LLAMA_KV,
            raw_kv=gguf_string("tokenizer.ggml.scores") + struct.pack("<IIQ", ARRAY, UINT32, 2**61),
            extra_kv=1,
        ),
        "no architecture": gguf_bytes({k: v for k, v in LLAMA_KV.items() if k != "general.architecture"}),
        "architecture a number": gguf_bytes({**LLAMA_KV, "general.architecture": (UINT32, 7)}),
        "zero heads": gguf_bytes({**LLAMA_KV, "llama.attention.head_count": (UINT32, 0)}),
        "heads not dividing": gguf_bytes({**LLAMA_KV, "llama.attention.head_count": (UINT32, 6)}),
        "kv heads not dividing": gguf_bytes({**LLAMA_KV, "llama.attention.head_count_kv": (UINT32, 3)}),
        "100k blocks": gguf_bytes({**LLAMA_KV, "llama.block_count": (UINT32, 100_000)}),
        "negative blocks": gguf_bytes({**LLAMA_KV, "llama.block_count": (INT32, -2)}),
        "huge width": gguf_bytes({**LLAMA_KV, "llama.embedding_length": (UINT64, 2**40)}),
        "blocks a string": gguf_bytes({**LLAMA_KV, "llama.block_count": (STRING, "2")}),
        "control characters": gguf_bytes({"general.architecture": (STRING, evil), f"{evil}.block_count": (UINT32, 0)}),
        "huge tokenizer array": gguf_bytes(
            LLAMA_KV,
            raw_kv=gguf_string("tokenizer.ggml.token_type")
            + struct.pack("<IIQ", ARRAY, 0, 5_000_000)
            + b"\x01" * 5_000_000,
            extra_kv=1,
        ),
        "bad magic": b"GGUX" + gguf_bytes(LLAMA_KV)[4:],
        "version 99": gguf_bytes(LLAMA_KV, version=99),
        "truncated header": gguf_bytes(LLAMA_KV)[:40],
        "key count 2**63": b"GGUF" + struct.pack("<IQQ", 3, 0, 2**63),
        "empty file": b"",
    }
    folder = work / "gguf"
    folder.mkdir()
    tries = []
    for index, (name, data) in enumerate(cases.items()):
        path = folder / f"{index}.gguf"
        path.write_bytes(data)
        tries.append(Try("gguf", name, ["heads", "0.0", str(path)], check="escaped"))
    sparse = folder / "sparse.gguf"
    sparse.write_bytes(gguf_bytes(LLAMA_KV))
    os.truncate(sparse, 1 << 40)  # a terabyte of holes after a valid header
    tries.append(Try("gguf", "sparse terabyte (not hashed whole)", ["heads", "0.0", str(sparse)], check="fast"))
    named = work / "gguf-named"
    named.mkdir()
    (named / "\x1b[2J\x07\u202eevil.gguf").write_bytes(gguf_bytes(LLAMA_KV, version=99))
    tries.append(
        Try(
            "gguf", "explore DIR with an ESC/BEL/RTL file name", ["explore", str(named), "--port", "0"], check="escaped"
        )
    )
    return tries


def hostile_tokenizer_folder(folder: Path, gpt2: bool) -> Path:
    """tiny's folder, or a 2-layer random GPT-2 (GPT-2's tokenizer), whose tokenizer.json panics (PANICS)."""
    if gpt2:
        from transformers import GPT2Config

        from headlens.load.models import build_model, gpt2_tokenizer, save_model

        config = GPT2Config(**{k: v for k, v in GPT2.items() if k != "model_type"})
        save_model(build_model(config, tokenizer=gpt2_tokenizer()), folder)
    else:
        from headlens.files import shipped_path

        shutil.copytree(shipped_path("tiny"), folder)
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    split = {"type": "Split", "pattern": {"Regex": PANICS}, "behavior": "Isolated", "invert": False}
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tokenizer["pre_tokenizer"]]}
    path.write_text(json.dumps(tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"  # tokenizer.json as written
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def tokenizers(work: Path) -> list[Try]:
    tiny, gpt2 = hostile_tokenizer_folder(work / "tok-tiny", False), hostile_tokenizer_folder(work / "tok-gpt2", True)
    text = work / "fox.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 64)
    prompts = work / "paris.jsonl"
    prompts.write_text(json.dumps({"prompt": "The capital of France is", "target": " Paris"}) + "\n")
    runs = {
        "validate": ["validate", tiny, "--text", text],
        "classify": ["classify", tiny, "--text", text],
        "ablate --text": ["ablate", tiny, "--heads", "0.0", "--text", text],
        "ablate --prompts": ["ablate", gpt2, "--heads", "0.0", "--prompts", prompts],
        "circuit induction": ["circuit", tiny, "--task", "induction"],
        "circuit ioi": ["circuit", gpt2, "--task", "ioi"],
        "circuit greater-than": ["circuit", gpt2, "--task", "greater-than"],
        "classify name movers": ["classify", gpt2, "--text", text, "--no-needles"],
        "classify --syntax sample": ["classify", gpt2, "--text", text, "--syntax", "sample"],
    }
    return [Try("tokenizer", name, [str(a) for a in args], check="no-panic") for name, args in runs.items()]


def big_inputs(work: Path, size: int) -> list[Try]:
    """Inputs of `size` bytes: one-line text, one-line .jsonl, a GGUF holding one huge array, a big heads.json."""
    folder = work / "big"
    folder.mkdir()
    block = WORDS * (1 << 14)
    with open(folder / "one.txt", "wb") as text, open(folder / "one.jsonl", "wb") as jsonl:
        jsonl.write(b'{"text": "')
        for _ in range(size // len(block)):
            text.write(block)
            jsonl.write(block)
        jsonl.write(b'"}\n')
    kv = gguf_bytes(
        LLAMA_KV, tensors=(), raw_kv=gguf_string("general.junk") + struct.pack("<IIQ", ARRAY, 0, size), extra_kv=1
    )
    with open(folder / "array.gguf", "wb") as handle:
        handle.write(kv[: kv.index(b"general.junk") + len("general.junk") + 16])
        for _ in range(size >> 20):
            handle.write(b"\x01" * (1 << 20))
    record = json.dumps({"layer": 0, "head": 0, "labels": ["induction"], "score": 0.5}).encode()
    with open(folder / "heads.json", "wb") as handle:
        handle.write(b"[" + (record + b",") * (size // 2 // (len(record) + 1)) + record + b"]")
    mb = f"{size / 1e6:.0f} MB"
    return [
        Try(
            "memory",
            f"validate one-line text {mb}",
            ["validate", "tiny", "--text", str(folder / "one.txt")],
            check="memory",
        ),
        Try(
            "memory",
            f"ablate one-line text {mb}",
            ["ablate", "tiny", "--heads", "0.0", "--text", str(folder / "one.txt")],
            check="memory",
        ),
        Try(
            "memory",
            f"classify one-line .jsonl {mb}",
            ["classify", "tiny", "--text", str(folder / "one.jsonl")],
            check="memory",
        ),
        Try("memory", f"GGUF with a {mb} array", ["heads", "0.0", str(folder / "array.gguf")], check="memory"),
        Try(
            "memory",
            f"--labels heads.json {size / 2e6:.0f} MB",
            ["ablate", "tiny", "--heads", "induction", "--labels", str(folder / "heads.json")],
            check="memory",
        ),
    ]


def treebanks(work: Path) -> list[Try]:
    rows = {
        "superscript id": "1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n²\tb\t_\t_\t_\t_\t1\tdep\t_\t_\n",
        "head 10**30": "1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n2\tb\t_\t_\t_\t_\t1" + "0" * 30 + "\tdep\t_\t_\n",
        "negative head": "1\ta\t_\t_\t_\t_\t-1\troot\t_\t_\n",
        "three columns": "1\ta\tb\n",
        "deep json": DEEP,
        "not utf-8": "1\t\udcff\t_\t_\t_\t_\t0\troot\t_\t_\n",
    }
    folder = work / "treebanks"
    folder.mkdir()
    tries = []
    for index, (name, body) in enumerate(rows.items()):
        path = folder / f"{index}.conllu"
        path.write_bytes(("# text = a b\n" + body + "\n").encode("utf-8", "surrogateescape"))
        tries.append(Try("treebank", name, ["classify", "tiny", "--syntax", str(path), "--resamples", "0"]))
    tries.append(Try("treebank", "a folder", ["classify", "tiny", "--syntax", str(folder), "--resamples", "0"]))
    tries.append(Try("treebank", "/dev/zero", ["classify", "tiny", "--syntax", "/dev/zero", "--resamples", "0"]))
    return tries
