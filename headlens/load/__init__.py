"""Load: a model and its tokenizer from a name (the shipped models, pinned pulls, `ollama:` names), a Hugging Face
folder or hub id, or a GGUF file, read from the float folder a GGUF is dequantized into once; where it runs
(device, dtype, placement over devices). `load_model` (models.py) is the entry point; `locate` finds a GGUF behind
a name; `pulls`, `ollama` and `cache` own the files headlens fetches, reads and converts."""
