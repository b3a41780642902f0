#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Seeded generator of PyTorch memory-snapshot pickles (segments + device_traces) for
workload shapes unlike the recorded histories, for expseg-replay (docs/benchmarks.md, "Shapes
no constant was chosen on"). Usage: shapes.py SHAPE SEED OUT.pickle
Prints a JSON line {shape, seed, events, peak_live} (peak live requested incl. pre-live)."""
import json, pickle, random, sys

MiB = 1 << 20
GiB = 1 << 30
STREAMS = [0, 0x5A5A1000, 0x5A5A2000, 0x5A5A3000]


class Trace:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.ev = []
        self.next_addr = 0x7F0000000000
        self.live = {}          # addr -> (size, stream)
        self.cur = 0
        self.peak = 0
        self.prelive = []       # (addr, size, stream): live before recording, never freed
        self.t = 1_700_000_000_000_000

    def _addr(self, size):
        a = self.next_addr
        self.next_addr += ((size + 511) // 512) * 512 + 512
        return a

    def pre(self, size, stream=0):
        a = self._addr(size)
        self.prelive.append((a, size, stream))
        self.cur += size
        self.peak = max(self.peak, self.cur)
        return a

    def _e(self, action, addr, size, stream):
        self.t += self.r.randint(1, 50)
        self.ev.append({'action': action, 'addr': addr, 'size': size, 'stream': stream,
                        'time_us': self.t, 'compile_context': 'N/A', 'user_metadata': '',
                        'frames': []})

    def alloc(self, size, stream=0):
        size = max(1, int(size))
        a = self._addr(size)
        self.live[a] = (size, stream)
        self.cur += size
        self.peak = max(self.peak, self.cur)
        self._e('alloc', a, size, stream)
        return a

    def free(self, a):
        size, stream = self.live.pop(a)
        self.cur -= size
        self._e('free_requested', a, size, stream)
        self._e('free_completed', a, size, stream)

    def free_req(self, a):      # cross-stream: completion comes later
        size, stream = self.live[a]
        self._e('free_requested', a, size, stream)

    def free_done(self, a):
        size, stream = self.live.pop(a)
        self.cur -= size
        self._e('free_completed', a, size, stream)

    def finish(self, path):
        for a in list(self.live):
            self.free(a)
        segs = []
        for a, size, stream in self.prelive:
            total = ((size + 2 * MiB - 1) // (2 * MiB)) * 2 * MiB
            small = size <= MiB
            if small:
                total = 2 * MiB
            blocks = [{'address': a, 'size': ((size + 511) // 512) * 512, 'requested_size': size,
                       'state': 'active_allocated', 'frames': []}]
            rest = total - blocks[0]['size']
            if rest:
                blocks.append({'address': a + blocks[0]['size'], 'size': rest,
                               'requested_size': 0, 'state': 'inactive', 'frames': []})
            segs.append({'device': 0, 'address': a, 'total_size': total,
                         'allocated_size': blocks[0]['size'], 'active_size': blocks[0]['size'],
                         'requested_size': size, 'stream': stream,
                         'segment_type': 'small' if small else 'large',
                         'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
                         'blocks': blocks})
        d = {'segments': segs, 'device_traces': [self.ev],
             'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1,
                                    'garbage_collection_threshold': 0.0,
                                    'expandable_segments': False,
                                    'roundup_power2_divisions': {}},
             'external_annotations': []}
        with open(path, 'wb') as f:
            pickle.dump(d, f, protocol=4)


def tiny(t):
    for _ in range(3):
        a = t.alloc(3 * MiB + 100); b = t.alloc(4096); t.free(a); t.free(b)


def kvpage(t):
    """LLM serving: fp16 weights pre-live, KV cache grows by fixed pages (16 tokens x layers
    per page) per request, all of a request's pages freed when it finishes; per-step temps."""
    r = t.r
    layers, d = 32, r.choice([2048, 2560])
    for _ in range(layers):
        for sz in (4 * d * d * 2, 3 * d * 4 * d * 2):
            t.pre(sz)
    page = 16 * 2 * d * 2 * layers  # 16 tokens, K+V, fp16, all layers
    reqs, active, nid = 160, {}, 0
    while nid < reqs or active:
        while len(active) < 24 and nid < reqs and r.random() < 0.7:
            prompt = r.randint(16, 1500)
            pages = [t.alloc(page) for _ in range((prompt + 15) // 16)]
            tmp = t.alloc(prompt * d * 2 * 4); t.free(tmp)  # prefill activations
            active[nid] = [pages, prompt, r.randint(8, 700)]
            nid += 1
        bs = len(active)
        temps = [t.alloc(bs * d * 2 * k) for k in (1, 3, 4, 1)]
        logits = t.alloc(bs * 32000 * 4)
        for a in temps: t.free(a)
        t.free(logits)
        for k in list(active):
            st = active[k]
            st[1] += 1
            st[2] -= 1
            if st[1] % 16 == 0:
                st[0].append(t.alloc(page))
            if st[2] <= 0:
                for a in st[0]: t.free(a)
                del active[k]


def varbatch(t):
    """Training with batch x sequence drawn over a 30x range every step."""
    r = t.r
    layers, d = 16, 1024
    for _ in range(layers):
        for sz in (4 * d * d * 4, 8 * d * d * 4):
            t.pre(sz); t.pre(sz); t.pre(sz)  # weight, adam m, adam v
    for step in range(30):
        tokens = r.randint(256, 8192)
        acts = []
        for l in range(layers):
            for k in (1, 3, 4, 1, 2):
                acts.append(t.alloc(tokens * d * 2 * k))
            tmp = t.alloc(tokens * d * 4); t.free(tmp)
        grads = []
        for l in reversed(range(layers)):
            g = t.alloc(12 * d * d * 4)
            grads.append(g)
            gt = [t.alloc(tokens * d * 2 * k) for k in (4, 1)]
            for _ in range(5): t.free(acts.pop())
            for a in gt: t.free(a)
        for g in grads:
            tmp = t.alloc(12 * d * d * 4); t.free(tmp); t.free(g)


def smallmix(t):
    """Many 1-8 MiB large-pool tensors, long and short lifetimes mixed."""
    r = t.r
    pool = []  # (expiry, addr)
    for i in range(12000):
        sz = r.randint(1 * MiB + 1, 8 * MiB) // 4 * 4
        life = r.choice([1, 2, 3, 5, 8]) if r.random() < 0.8 else r.randint(200, 4000)
        pool.append((i + life, t.alloc(sz)))
        keep = []
        for e, a in pool:
            if e <= i: t.free(a)
            else: keep.append((e, a))
        pool = keep
        if r.random() < 0.3:
            a = t.alloc(r.randint(512, 900 * 1024)); t.free(a)


def hugechurn(t):
    """A few GB buffers held for long spans plus churn of 20-400 MiB buffers."""
    r = t.r
    huge = []
    for it in range(60):
        if it % 10 == 0:
            for a in huge: t.free(a)
            huge = [t.alloc(r.randint(1 * GiB, 4 * GiB) // 256 * 256) for _ in range(r.randint(1, 3))]
        mids = []
        for _ in range(r.randint(20, 60)):
            mids.append(t.alloc(r.randint(20 * MiB, 400 * MiB) // 256 * 256))
            if len(mids) > 6 and r.random() < 0.6:
                t.free(mids.pop(r.randrange(len(mids))))
        for a in mids: t.free(a)


def streams(t):
    """3-4 streams; blocks allocated on one stream, used on another, freed with a
    free_requested then free_completed several events later (cross-stream frees)."""
    r = t.r
    ns = r.choice([3, 4])
    pending = []  # (due, addr)
    held = {s: [] for s in range(ns)}
    for i in range(9000):
        s = STREAMS[r.randrange(ns)]
        sz = int(r.lognormvariate(15.5, 1.6)) + 512
        a = t.alloc(min(sz, 600 * MiB), s)
        held[STREAMS.index(s)].append(a)
        for k in range(ns):
            h = held[k]
            while len(h) > r.randint(4, 30):
                b = h.pop(r.randrange(len(h)))
                if r.random() < 0.5:
                    t.free_req(b); pending.append((i + r.randint(1, 12), b))
                else:
                    t.free(b)
        still = []
        for due, b in pending:
            if due <= i: t.free_done(b)
            else: still.append((due, b))
        pending = still
    for _, b in pending: t.free_done(b)


def growcat(t):
    """Buffers grown by reallocation (torch.cat pattern): new = old + delta, then the old
    one freed; several growing buffers interleaved, reset at random points."""
    r = t.r
    bufs = [t.alloc(r.randint(1, 4) * MiB) for _ in range(6)]
    sizes = [0] * 6
    for i in range(6000):
        k = r.randrange(6)
        sizes[k] += r.randint(64 * 1024, 3 * MiB)
        if sizes[k] > 700 * MiB or r.random() < 0.003: sizes[k] = r.randint(1, 4) * MiB
        nb = t.alloc(sizes[k] + 1000)
        t.free(bufs[k]); bufs[k] = nb
        if r.random() < 0.5:
            a = t.alloc(r.randint(1, 64) * MiB); t.free(a)


def moe(t):
    """Mixture of experts: per layer and step, 16 experts get a random share of tokens
    (0..all), so expert buffers swing over a wide range; bf16 weights pre-live."""
    r = t.r
    d, ne, layers = 2048, 16, 12
    for _ in range(layers * ne):
        t.pre(3 * d * 4 * d * 2)
    for step in range(25):
        tokens = r.randint(2048, 16384)
        keep = []
        for l in range(layers):
            w = [r.random() ** 3 for _ in range(ne)]
            s = sum(w)
            x = t.alloc(tokens * d * 2)
            outs = []
            for e in range(ne):
                n = int(tokens * 2 * w[e] / s)
                if n == 0: continue
                h = t.alloc(n * 4 * d * 2)
                o = t.alloc(n * d * 2)
                keep.append(h); outs.append(o)
            y = t.alloc(tokens * d * 2)
            for o in outs: t.free(o)
            keep.append(x); keep.append(y)
        for a in reversed(keep): t.free(a)


def smallpool(t):
    """Small-pool storm (512 B .. 1 MiB) with sparse large tensors pinned among them."""
    r = t.r
    live = []
    for i in range(20000):
        if r.random() < 0.05:
            live.append(t.alloc(r.randint(2, 40) * MiB))
        else:
            live.append(t.alloc(r.randint(1, 2048) * 512))
        while len(live) > 3000 or (live and r.random() < 0.48):
            t.free(live.pop(r.randrange(len(live))))


def checker(t):
    """Fragmentation: interleaved long/short blocks, shorts freed, then larger requests
    that cannot fit the holes; repeated with shifting sizes."""
    r = t.r
    longs = []
    for rnd in range(12):
        base = r.randint(4, 48) * MiB + r.randint(0, MiB)
        shorts = []
        for _ in range(60):
            shorts.append(t.alloc(base))
            if r.random() < 0.3: longs.append(t.alloc(r.randint(1, 8) * MiB))
        for a in shorts: t.free(a)
        big = [t.alloc(base * r.randint(2, 5)) for _ in range(12)]
        for a in big: t.free(a)
        while len(longs) > 40: t.free(longs.pop(r.randrange(len(longs))))


def nearcap(t):
    """Varying-sequence inference burst on a device sized ~8 % over its peak live (run with
    --capacity): weights pre-live, large prefill activations of drawn sizes."""
    r = t.r
    d = 4096
    for _ in range(24):
        t.pre(12 * d * d * 2)
    for step in range(200):
        tokens = r.randint(128, 16384)
        acts = [t.alloc(tokens * d * 2 * k) for k in (1, 3, 1, 4)]
        kv = t.alloc(tokens * d * 2 * 2 * 24 // 8)
        for a in acts: t.free(a)
        if r.random() < 0.7: t.free(kv)
        else: t.live_kv = getattr(t, 'live_kv', []) + [kv]
        if len(getattr(t, 'live_kv', [])) > 3:
            t.free(t.live_kv.pop(0))


SHAPES = {f.__name__: f for f in (tiny, kvpage, varbatch, smallmix, hugechurn, streams, growcat,
                                  moe, smallpool, checker, nearcap)}

if __name__ == '__main__':
    shape, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    t = Trace(seed * 1000 + sorted(SHAPES).index(shape))
    SHAPES[shape](t)
    t.finish(out)
    print(json.dumps({'shape': shape, 'seed': seed, 'events': len(t.ev), 'peak_live': t.peak}))
