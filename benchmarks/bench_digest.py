"""`LoadedModel.digest()`, the weights' digest every headlens.cache key hashes: the load, then the digest three
times. Usage: python benchmarks/bench_digest.py MODEL [MODEL ...] (figures in BENCHMARKS.md)."""

import sys
import time

from headlens.load.models import load_model

for name in sys.argv[1:]:
    start = time.perf_counter()
    loaded = load_model(name)
    load_s = time.perf_counter() - start
    times = []
    for _ in range(3):
        start = time.perf_counter()
        loaded.digest()
        times.append(time.perf_counter() - start)
    params = loaded.spec.n_params
    print(f"{name}: load {load_s:.1f} s; digest {min(times):.2f}-{max(times):.2f} s over 3 ({params:,} params)")
