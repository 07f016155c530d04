"""The tries of benchmarks/hostile_battery.py: the crafted inputs (written under one work folder) and the
command lines that give them to headlens, one group per finding of the security rounds (numbers, long echoes,
config.json, JSON readers, --labels, resume rows, outputs, train-tiny, GGUF, tokenizer, memory, treebank).
Every try expects a refusal; `check` names what else must hold for the tries that also write a file."""

from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = "1" * 5000  # past Python's 4,300-digit limit on converting a decimal string to int
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 50257}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
TINY_HEADS = [{"layer": layer, "head": head, "labels": []} for layer in range(2) for head in range(4)]
GOOD_ROW = {"layer": 0, "head": 0, "n": 4, "clean": 1.5, "ablated": 1.0, "delta": -0.5}
UINT32, INT32, STRING, ARRAY, UINT64 = 4, 5, 8, 9, 10  # GGUF value types
# A tokenizer.json regex that exhausts Oniguruma's retry limit on any piece of five characters or more
PANICS = r"(?=(?:(?:.|.|.|.|.|.|.|.|.|.|.|.|.|.|.|.)+)+(?<=\x00))"
WORDS = b"the quick brown fox jumps over the lazy dog and then some more words follow "


@dataclass
class Try:
    group: str  # the finding it performs
    name: str
    args: list[str]  # headlens's arguments; {W} is the work folder
    outputs: tuple[str, ...] = ()  # paths under the work folder the try may change
    check: str = ""  # what else is checked after the run (hostile_battery.CHECKS)
    env: dict = field(default_factory=dict)


def numbers() -> list[Try]:
    specs = [
        "²",
        "0.²",
        "layer:²",
        "٣.1",
        "+1.0",
        "-1.0",
        "0.-1",
        "1" + "0" * 30 + ".0",
        "0.4",
        "2.0",
        "1e3.0",
        "0x1.0",
        "1_0.0",
        "0.0.0",
        "NaN.0",
        "inf.0",
        ",",
        "",
        "０.０",
        "layer:-1",
        "layer:99",
        "all,x",
        "\x1b[2J0.0",
    ]
    tries = [Try("numbers", f"head spec {spec!r}", ["heads", spec, "tiny"]) for spec in specs]
    ablate = ["ablate", "tiny", "--heads", "0.0"]
    for option, values in {
        "--control": ["random:²", "random:" + DIGITS, "random:-1", "random:1e3", "random:"],
        "--batch-size": ["²", DIGITS, "0", "-1", "1.5"],
        "--max-memory": ["²=1GiB", "cpu=-1GiB", "cpu=" + DIGITS + "GiB", "cpu=1ZiB"],
        "--tokens": ["٣٠٠٠", "-5", DIGITS],
    }.items():
        tries += [Try("numbers", f"ablate {option} {value[:20]!r}", [*ablate, option, value]) for value in values]
    for seed in [str(10**30), str(2**64), str(-(2**70)), "1e999", "²"]:
        tries.append(Try("numbers", f"circuit --seed {seed[:12]}", ["circuit", "tiny", "--seed", seed]))
        tries.append(Try("numbers", f"classify --seed {seed[:12]}", ["classify", "tiny", "--seed", seed]))
    tries += [
        Try("numbers", f"classify {o} {v}", ["classify", "tiny", o, v])
        for o, v in (("--n-seq", "²"), ("--seq-len", "٣"), ("--resamples", "-1"), ("--max-windows", DIGITS))
    ]
    return tries


def long_echoes() -> list[Try]:
    long = ["a" * 120_000, "0." + "9" * 120_000, "0.0," * 30_000 + "x"]
    tries = [Try("echo", f"head spec of {len(spec):,} characters", ["heads", spec, "tiny"]) for spec in long]
    tries.append(Try("echo", "model name of 120,000 characters", ["heads", "0.0", "x" * 120_000]))
    tries.append(Try("echo", "--text path of 4,000 characters", ["validate", "tiny", "--text", "d/" * 2000]))
    return tries


def configs(work: Path) -> list[Try]:
    cases = {
        "list": [GPT2],
        "number": "7",
        "deep": DEEP,
        "negative-layers": {**GPT2, "n_layer": -1},
        "100k-layers": {**GPT2, "n_layer": 100_000},
        "layers-a-string": {**GPT2, "n_layer": "12"},
        "layers-a-float": {**GPT2, "n_layer": 2.0},
        "zero-heads": {**GPT2, "n_head": 0},
        "heads-not-dividing": {**GPT2, "n_head": 5},
        "huge-width": {**GPT2, "n_embd": 2**40},
        "kv-not-dividing": {**LLAMA, "num_key_value_heads": 3},
        "absurd-layers": {**LLAMA, "num_hidden_layers": 10**30},
        "model-type-a-list": {"model_type": ["gpt2"], "n_layer": 2},
        "digits": '{"model_type": "gpt2", "n_layer": ' + DIGITS + "}",
        "float-overflow": '{"model_type": "gpt2", "n_layer": 1e999}',
        "not-utf8": b'{"model_type": "\xff"}',
        "unknown-type": {"model_type": "evil", "n_layer": 2},
    }
    tries = []
    for name, config in cases.items():
        folder = work / "configs" / name
        folder.mkdir(parents=True)
        raw = config if isinstance(config, (str, bytes)) else json.dumps(config)
        (folder / "config.json").write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        tries.append(Try("config.json", name, ["heads", "0.0", str(folder)]))
    return tries


def json_readers(work: Path) -> list[Try]:
    bad = {
        "deep": DEEP,
        "digits": '{"prompt": "a", "target": "b", "n": ' + DIGITS + "}",
        "nan": '{"prompt": "a", "target": "b", "x": NaN}',
        "infinity": '{"prompt": "a", "target": " b", "x": Infinity}',
        "a-list": "[1, 2]",
        "no-target": '{"prompt": "a"}',
        "target-a-number": '{"prompt": "a", "target": 7}',
        "not-utf8": b'{"prompt": "\xff", "target": " b"}',
        "lone-surrogate": '{"prompt": "a\\ud800", "target": " b"}',
    }
    tries = []
    for name, line in bad.items():
        path = work / "prompts" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((line if isinstance(line, bytes) else line.encode()) + b"\n")
        tries.append(
            Try("json", f"ablate --prompts {name}", ["ablate", "tiny", "--heads", "0.0", "--prompts", str(path)])
        )
        tries.append(Try("json", f"circuit --prompts {name}", ["circuit", "tiny", "--prompts", str(path)]))
    for name, line in {
        "deep": DEEP,
        "digits": '{"text": ' + DIGITS + "}",
        "no-text": '{"x": 1}',
        "not-utf8": b'{"text": "\xff"}',
    }.items():
        path = work / "docs" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((line if isinstance(line, bytes) else line.encode()) + b"\n")
        tries.append(Try("json", f"classify --text {name}.jsonl", ["classify", "tiny", "--text", str(path)]))
    for name, text in {
        "deep": DEEP,
        "digits": '{"cfg": {"n_layers": ' + DIGITS + "}}",
        "not-an-object": "[]",
    }.items():
        path = work / "docs" / f"graph-{name}.json"
        path.write_text(text)
        tries.append(Try("json", f"circuit --circuit {name}", ["circuit", "tiny", "--circuit", str(path)]))
        path = work / "docs" / f"backups-{name}.json"
        path.write_text(text)
        tries.append(
            Try("json", f"explore --backups {name}", ["explore", "tiny", "--port", "0", "--backups", str(path)])
        )
    for special_file in ("/dev/zero", str(work / "labels" / "fifo.json")):
        tries.append(
            Try(
                "json",
                f"explore --backups {special_file}",
                ["explore", "tiny", "--port", "0", "--backups", special_file],
            )
        )
        tries.append(
            Try(
                "json",
                f"circuit --circuit {special_file}",
                ["circuit", "tiny", "--circuit", special_file],
            )
        )
    manifests = work / "store" / "manifests" / "registry.ollama.ai" / "library"
    for name, text in {
        "deep": DEEP,
        "digits": '{"layers": [' + DIGITS + "]}",
        "traversal": json.dumps(
            {"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}
        ),
    }.items():
        (manifests / name).mkdir(parents=True)
        (manifests / name / "latest").write_text(text)
        tries.append(Try("json", f"ollama manifest {name}", ["heads", "0.0", f"ollama:{name}"]))
    return tries


def labels(work: Path) -> list[Try]:
    cases = {
        "infinity": '[{"layer": Infinity, "head": 0, "labels": []}]',
        "float-overflow": '[{"layer": 1e999, "head": 0, "labels": []}]',
        "huge-layer": [{**TINY_HEADS[0], "layer": 10**30}, *TINY_HEADS[1:]],
        "layer-minus-one": [{**TINY_HEADS[0], "layer": -1}, *TINY_HEADS[1:]],
        "head-minus-one": [{**TINY_HEADS[0], "head": -1}, *TINY_HEADS[1:]],
        "layer-float": [{**TINY_HEADS[0], "layer": 0.0}, *TINY_HEADS[1:]],
        "labels-a-string": [{**TINY_HEADS[0], "labels": "induction"}, *TINY_HEADS[1:]],
        "deep": DEEP,
        "digits": "[" + DIGITS + "]",
        "an-object": {"layer": 0},
        "empty": "",
    }
    folder = work / "labels"
    folder.mkdir()
    paths = {}
    for name, records in cases.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(records if isinstance(records, str) else json.dumps(records))
    paths["fifo"] = folder / "fifo.json"
    os.mkfifo(paths["fifo"])
    paths["directory"] = folder / "dir.json"
    paths["directory"].mkdir()
    paths["over-the-cap"] = folder / "big.json"
    with open(paths["over-the-cap"], "wb") as handle:
        handle.truncate(1 << 30)  # sparse
    paths["dev-zero"] = Path("/dev/zero")
    run = ["ablate", "tiny", "--heads", "induction", "--metric", "repeat", "--labels"]
    return [Try("labels", name, [*run, str(path)]) for name, path in paths.items()]


def resume_rows(work: Path, good_sweep: Path) -> list[Try]:
    """A sweep folder whose rows.jsonl is damaged, resumed: refused, and no formula reaches sweep.csv."""
    row = json.dumps
    bad = {
        "not-json": "not json",
        "a-list": "[1, 2]",
        "no-head": '{"layer": 0}',
        "layer-a-string": '{"layer": "0", "head": 1}',
        "negative-layer": '{"layer": -1, "head": 0}',
        "delta-a-formula": row({**GOOD_ROW, "delta": '=HYPERLINK("http://evil.example","x")'}),
        "delta-infinite": '{"layer": 0, "head": 0, "n": 4, "clean": 1.5, "ablated": 1.0, "delta": Infinity}',
        "clean-null": row({**GOOD_ROW, "clean": None}),
        "n-a-bool": row({**GOOD_ROW, "n": True}),
        "extra-field": row({**GOOD_ROW, "note": "@SUM(A1)"}),
        "huge-layer": row({**GOOD_ROW, "layer": 10**30}),
        "digits": row(GOOD_ROW)[:-1] + ', "x": ' + DIGITS + "}",
        "deep": DEEP,
    }
    tries = []
    for name, line in bad.items():
        folder = work / "sweeps" / name
        shutil.copytree(good_sweep, folder)
        with open(folder / "rows.jsonl", "a") as handle:
            handle.write(line + "\n")
        args = ["ablate", "tiny", "--heads", "each", "--metric", "repeat", "--out-dir", str(folder), "--resume"]
        tries.append(Try("resume", name, args, outputs=(str(folder),), check="no-formula"))
    return tries


def special(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name("real.html").write_text("the link's target")
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(path.with_name("real.html"))
    return path


def outputs(work: Path) -> list[Try]:
    tries = []
    commands = {
        "classify --report": ["classify", "tiny", "--report"],
        "report --out": ["report", "tiny", "--out"],
        "ablate --report": ["ablate", "tiny", "--heads", "0.0", "--report"],
        "prune --report": ["prune", "tiny", "--report"],
        "classify --out": ["classify", "tiny", "--out"],
    }
    for kind in ("FIFO", "socket", "directory", "symlink"):
        for label, command in commands.items():
            suffix = ".csv" if label == "classify --out" else ".html"
            target = special(work / "out" / f"{label.split()[0]}-{kind}" / f"target{suffix}", kind)
            tries.append(Try("outputs", f"{label} to a {kind}", [*command, str(target)]))
        for command, name in (
            (["classify", "tiny"], "heads.csv"),
            (["ablate", "tiny", "--heads", "each"], "rows.jsonl"),
        ):
            folder = work / "out" / f"dir-{name}-{kind}"
            special(folder / name, kind)
            tries.append(Try("outputs", f"--out-dir holding a {kind} {name}", [*command, "--out-dir", str(folder)]))
    link = work / "out" / "link-dir"
    link.symlink_to(work / "sentinel", target_is_directory=True)
    tries.append(
        Try("outputs", "ablate --out-dir a symlink", ["ablate", "tiny", "--heads", "each", "--out-dir", str(link)])
    )
    return tries


def train_tiny(work: Path) -> list[Try]:
    other = work / "train" / "other-model"
    other.mkdir(parents=True)
    for name in ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (other / name).write_text("another model's file\n")
    tries = [
        Try("train-tiny", "out-dir holding another model", ["train-tiny", "--steps", "2", "--out-dir", str(other)])
    ]
    tries.append(Try("train-tiny", "out-dir ~ (HOME)", ["train-tiny", "--steps", "2", "--out-dir", "~"]))
    tries.append(Try("train-tiny", "out-dir /", ["train-tiny", "--steps", "2", "--out-dir", "/"]))
    (work / "train" / "link").symlink_to(work / "sentinel", target_is_directory=True)
    tries.append(
        Try(
            "train-tiny", "out-dir a symlink", ["train-tiny", "--steps", "2", "--out-dir", str(work / "train" / "link")]
        )
    )
    for kind in ("FIFO", "socket", "symlink"):
        folder = work / "train" / f"holding-{kind}"
        special(folder / "config.json", kind)
        tries.append(
            Try("train-tiny", f"out-dir holding a {kind}", ["train-tiny", "--steps", "2", "--out-dir", str(folder)])
        )
    return tries
