#!/usr/bin/env python3
# A model of the waits of kernels/cuda/decode1.cuh's dataflow form (decode1_flow_kernel), not of its
# arithmetic: each consumer warp, each block's stager and the block-wide attention run as generators
# that yield while a wait is unmet (piece counts in shared memory, row counters per segment, the
# consumers' phase exits, the attention's per-head counters and merge), scheduled round-robin in a
# shuffled order, with the real phase shapes (gemv_ksplit pieces, the unit sizes) and the loader's
# unit rotation. It fails on a deadlock (a round in which nothing moves), on a buffer rewritten
# before every block that reads its earlier use has staged it (x by o / down, qkv, attn, h), and on
# a counter that does not end at its final value. A check of the protocol written before the kernel
# first ran on a GPU (docs/CUDA.md "Session 52"); keep it in step with the kernel's waits.
# Rows are written and counted one per turn, so warps interleave at row granularity; each wrong
# wait tried (a wait one row short for gate / up or down, o not waiting for the attention, the
# stager waiting for its own phase's exits) fails it.
#   python3 tests/cuda/decode1_flow_model.py [SEEDS=1] [small: skip the 132-block grids (slow)]
import sys, itertools, random
def ksplit(n, k, vec=8):
    ks = 1
    while ks < 8 and n * ks < 16384 and (k // vec) // (ks * 4) >= 32: ks *= 2
    return ks
def phase(K, N, nsrc, rdiv):
    row_ch = K // 8; KS = ksplit(N, K); PC = row_ch // KS
    maxch = 8192 // (16 * nsrc)
    u = 1
    while row_ch * u * 2 <= maxch and rdiv % (u * 2) == 0: u *= 2
    U = u if row_ch * u <= maxch else 1
    return dict(K=K, N=N, KS=KS, PC=PC, U=U, NU=N // U)
def gcd(a, b): return a if b == 0 else gcd(b, a % b)
def run(HID, HQ, HKV, D, FFN, VOCAB, L, blocks, NW):
    NQ, NKV = HQ * D, HKV * D; NQKV = NQ + 2 * NKV
    P = [phase(HID, NQKV, 1, gcd(NQ, NKV)), phase(NQ, HID, 1, HID), phase(HID, FFN, 2, FFN), phase(FFN, HID, 1, HID)]
    PH = phase(HID, VOCAB, 1, VOCAB)
    NWC = NW - 1; GW = blocks * NWC
    units_layer = sum(p['NU'] for p in P)
    def pshape(q): return P[q % 4] if q < 4 * L else PH
    def ubefore(q):
        kind = q % 4 if q < 4 * L else 0
        return (q // 4) * units_layer + sum(P[i]['NU'] for i in range(kind))
    SEG_X1, SEG_H, SEG_X0 = HID // P[2]['KS'], FFN // P[3]['KS'], HID // P[0]['KS']
    ctr = {}
    def c(name, i): return ctr.get((name, i), 0)
    # Each buffer row's version: (layer, phase) of its last write, checked at every read, apart from
    # the counters (so a wrong wait shows as a read of a row not yet written).
    ver = {'x': [(-1, 3)] * HID, 'qkv': [None] * NQKV, 'attn': [None] * NQ, 'h': [None] * FFN}
    def read(buf, lo, hi, want, what):
        bad = [r for r in range(lo, hi) if ver[buf][r] != want]
        assert not bad, f"{what} read {buf} rows {bad[:3]}... at versions {[ver[buf][r] for r in bad[:3]]}, not {want}"
    def add(name, i, n=1): ctr[(name, i)] = c(name, i) + n
    staged = [0] * blocks; done = [0] * blocks; arrive = {}; head_done = [0] * HQ
    full = set()   # (b, q): every piece of phase q staged in block b
    has_units = {} # (b, q): some consumer warp of b has units in phase q
    items_started = {}  # ly -> attention items past their wait (they have read qkv)
    def check_write(q):
        # the buffer a phase writes was last read by the phase (or attention) one use earlier
        kind = q % 4; ly = q // 4
        if kind == 1 or kind == 3:  # x rewritten in place: every block that reads x for the phase before (QKV / gate-up) staged it all
            src = q - 1
            for b in range(blocks):
                if has_units.get((b, src)): assert (b, src) in full, f"x overwritten by phase {q} before block {b} staged phase {src}"
        if kind == 0 and ly > 0:    # qkv rewritten: every attention item of the layer before has read it
            assert items_started.get(ly - 1, 0) == HQ * VS, f"qkv of layer {ly} written before the attention of {ly - 1} read it"
        if kind == 2 and ly > 0:    # h rewritten: every block with down units staged the layer before's h
            for b in range(blocks):
                if has_units.get((b, q - 3)): assert (b, q - 3) in full, f"h overwritten before block {b} staged it"
    out_seg = {0: ('qkv', D), 1: ('x1', SEG_X1), 2: ('h', SEG_H), 3: ('x0', SEG_X0)}
    NWV = 16; VS = max(1, min(NWV, blocks // HQ))
    def block_sync(b, key):
        arrive[(b, key)] = arrive.get((b, key), 0) + 1
        while arrive[(b, key)] < NW: yield
    def attention(b, ly, is_leader):
        # block-wide: every warp takes part; one generator (the leader) models the block's items
        if not is_leader: return
        for item in range(b, HQ * VS, blocks):
            h, part = item // VS, item % VS; g = h // (HQ // HKV)
            while not (c('qkv', h) >= (ly + 1) * D and c('qkv', HQ + g) >= (ly + 1) * D and c('qkv', HQ + HKV + g) >= (ly + 1) * D): yield
            items_started[ly] = items_started.get(ly, 0) + 1
            for lo in (h * D, NQ + g * D, NQ + NKV + g * D): read('qkv', lo, lo + D, (ly, 0), f"attention of head {h}, layer {ly}")
            head_done[h] += 1
            if part == 0:
                while head_done[h] < (ly + 1) * VS: yield
                if ly > 0:  # attn rewritten: every block with o units staged the layer before's attn
                    for bb in range(blocks):
                        if has_units.get((bb, 4 * (ly - 1) + 1)): assert (bb, 4 * (ly - 1) + 1) in full, "attn overwritten early"
                for r in range(h * D, h * D + D): ver['attn'][r] = (ly, 'att')
                add('att', h, D)
    def warp_units(b, w, q):  # the loader's rotation: unit u of phase q is global warp (u + rot) % GW's
        ph = pshape(q); gw = b * NWC + w; rot = ubefore(q) % GW; first = ((gw - rot) % GW + GW) % GW
        return list(range(first, ph['NU'], GW)) if first < ph['NU'] else []
    def consumer(b, w):
        seq = 0
        for q in range(4 * L + 1):
            ph = pshape(q)
            units = warp_units(b, w, q)
            if units: has_units[(b, q)] = True
            have = 0
            for u in units:
                for r in range(ph['U']):
                    for kp in range(ph['KS']):
                        if kp >= have:
                            while staged[b] <= seq + kp: yield
                            have = min(staged[b] - seq, ph['KS'])
                    if q < 4 * L:
                        row = u * ph['U'] + r; ly = q // 4; kind = q % 4
                        if kind == 1: read('x', row, row + 1, (ly - 1, 3), f"o's residual, layer {ly}")
                        if kind == 3: read('x', row, row + 1, (ly, 1), f"down's residual, layer {ly}")
                        check_write(q)
                        buf = {0: 'qkv', 1: 'x', 2: 'h', 3: 'x'}[kind]
                        ver[buf][row] = (ly, kind)
                        name, seg = out_seg[q % 4]; add(name, (u * ph['U'] + r) // seg)
                        yield  # one row per turn: other warps interleave at row granularity
            seq += ph['KS']
            if q < 4 * L: done[b] += 1
            if q < 4 * L and q % 4 == 0:  # the attention after QKV
                yield from block_sync(b, ('att', q))
                yield from attention(b, q // 4, w == 0)
                yield from block_sync(b, ('attend', q))
    def stager(b):
        seq = 0
        for q in range(4 * L + 1):
            ph = pshape(q); ly = q // 4; kind = q % 4 if q < 4 * L else 4
            while done[b] < q * NWC: yield
            def ready(kp):
                if kind == 0: return ly == 0 or c('x0', kp) >= ly * SEG_X0
                if kind == 1:
                    fpp = NQ // ph['KS']; h0 = kp * fpp // D; h1 = ((kp + 1) * fpp - 1) // D
                    return all(c('att', h) >= (ly + 1) * D for h in range(h0, h1 + 1))
                if kind == 2: return c('x1', kp) >= (ly + 1) * SEG_X1
                if kind == 3: return c('h', kp) >= (ly + 1) * SEG_H
                R = P[0]['KS'] // ph['KS']; return all(c('x0', kp * R + i) >= L * SEG_X0 for i in range(R))
            k0 = 0
            while k0 < ph['KS']:
                k1 = k0
                while k1 < ph['KS'] and ready(k1): k1 += 1
                if k1 == k0: yield; continue
                if any(warp_units(b, w, q) for w in range(NWC)):  # a block with no rows here may stage stale rows: nothing reads them
                    lo, hi = k0 * ph['PC'] * 8, k1 * ph['PC'] * 8
                    if kind == 0 and ly > 0: read('x', lo, hi, (ly - 1, 3), f"block {b}'s QKV pieces, layer {ly}")
                    if kind == 1: read('attn', lo, hi, (ly, 'att'), f"block {b}'s o pieces, layer {ly}")
                    if kind == 2: read('x', lo, hi, (ly, 1), f"block {b}'s gate / up pieces, layer {ly}")
                    if kind == 3: read('h', lo, hi, (ly, 2), f"block {b}'s down pieces, layer {ly}")
                    if kind == 4: read('x', lo, hi, (L - 1, 3), f"block {b}'s lm_head pieces")
                seq += k1 - k0; staged[b] = seq; k0 = k1
            full.add((b, q))
            if kind == 0:
                yield from block_sync(b, ('att', q))
                yield from attention(b, ly, False)
                yield from block_sync(b, ('attend', q))
    gens = [consumer(b, w) for b in range(blocks) for w in range(NWC)] + [stager(b) for b in range(blocks)]
    live = list(gens); rounds = 0
    while live:
        rounds += 1; nxt = []; moved = False
        random.shuffle(live)
        snap = (sum(ctr.values()), sum(staged), sum(done), sum(arrive.values()), sum(head_done))
        for gen in live:
            try: next(gen); nxt.append(gen)
            except StopIteration: moved = True
        if not moved and snap == (sum(ctr.values()), sum(staged), sum(done), sum(arrive.values()), sum(head_done)):
            return f"DEADLOCK after {rounds} rounds, {len(nxt)} left"
        live = nxt
    # every counter at its final value
    for h in range(HQ + 2 * HKV): assert c('qkv', h) == L * D
    for h in range(HQ): assert c('att', h) == L * D
    for s in range(P[0]['KS']): assert c('x0', s) == L * SEG_X0
    return f"finished in {rounds} rounds (pieces QKV {P[0]['KS']}, o {P[1]['KS']}, gate/up {P[2]['KS']}, down {P[3]['KS']}, U {[p['U'] for p in P]})"
cfgs = {'tiny': (96, 6, 2, 16, 192, 640), '1b': (2048, 32, 8, 64, 8192, 128256), '8b': (4096, 32, 8, 128, 14336, 128256)}
for seed, (name, L, blocks, NW) in itertools.product(range(int(sys.argv[1]) if len(sys.argv) > 1 else 1), [('tiny', 3, 132, 16), ('tiny', 3, 3, 4), ('1b', 2, 7, 5), ('8b', 2, 16, 4)] + ([('1b', 2, 132, 12), ('8b', 2, 132, 12)] if len(sys.argv) < 3 else [])):
    random.seed(seed)
    HID, HQ, HKV, D, FFN, V = cfgs[name]
    print(name, f"L={L} blocks={blocks} NW={NW}:", run(HID, HQ, HKV, D, FFN, V, L, blocks, NW), flush=True)
