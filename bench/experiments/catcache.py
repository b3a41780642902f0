#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Seeded generator of PyTorch memory-snapshot pickles of text generation with a torch.cat
K/V cache (as a DynamicCache does), in configurations drawn from the seed, for
expseg-replay (docs/benchmarks.md, "Moving idle chunks only near the bound"): 12..32 layers,
2..8 KiB of K per token and batch item, 0.5..8 GiB of weights live before recording, 4..6
requests one after another of batch 1..8, prompt 128..1024 and 64..256 new tokens; every
decode step reallocates each layer's K and V one token larger (the new buffer allocated
before the old one is freed), with an attention-score temporary and, for half the seeds,
MLP and prefill temporaries. Usage: catcache.py SEED OUT.pickle
Prints a JSON line with the configuration drawn."""
import json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import Trace, MiB  # noqa: E402

KiB = 1 << 10


def main():
    seed, out = int(sys.argv[1]), sys.argv[2]
    r = random.Random(seed * 31 + 7)
    t = Trace(seed)
    layers = r.choice([12, 16, 24, 32])
    kv_kib = r.choice([2, 4, 8])
    weights_mib = r.choice([512, 1024, 2048, 4096, 8192])
    for _ in range(layers):
        t.pre(weights_mib * MiB // layers)
    temps = r.random() < 0.5
    for _ in range(r.randint(4, 6)):
        b, prompt, steps = r.choice([1, 2, 4, 8]), r.randint(128, 1024), r.randint(64, 256)
        tok = b * kv_kib * KiB
        cache = [t.alloc(prompt * tok) for _ in range(2 * layers)]
        if temps:
            t.free(t.alloc(b * prompt * 4096 * 2))
        for s in range(1, steps + 1):
            tokens = prompt + s
            for l in range(layers):
                for k in range(2):
                    new_tok = t.alloc(tok)
                    grown = t.alloc(tokens * tok)
                    t.free(cache[2 * l + k])
                    t.free(new_tok)
                    cache[2 * l + k] = grown
                t.free(t.alloc(b * 32 * tokens * 2))
                if temps:
                    t.free(t.alloc(b * 11008 * 4))
        for c in cache:
            t.free(c)
    t.finish(out)
    print(json.dumps({'seed': seed, 'layers': layers, 'kv_kib': kv_kib,
                      'weights_mib': weights_mib, 'temporaries': temps}))


if __name__ == '__main__':
    main()
