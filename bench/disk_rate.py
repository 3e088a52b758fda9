#!/usr/bin/env python3
"""The disk's rate for the reads the expert cache makes, on the model file itself.

  disk_rate.py MODEL.gguf [--threads N] [--chunk BYTES] [--experts N] [--json]

Picks N random (layer, expert) pairs of the model's routed experts, and reads each one's parts
(ffn_gate/up/down_exps slices) the way the cache does: O_DIRECT, the 4 KiB-aligned superset of
each slice, in chunks of at most --chunk bytes (default 512 KiB), from --threads workers at once
(default 4, terrace's --io-threads default: its queue depth). Prints bytes of expert data per
second of wall time. Drop the page cache before (root: `echo 1 > /proc/sys/vm/drop_caches`);
O_DIRECT reads do not go through it, but the file system's metadata might.

Needs the venv (gguf, for the tensor table).
"""
import argparse
import json
import mmap
import os
import random
import threading
import time

import gguf

ALIGN = 4096


def expert_ranges(path):
    r = gguf.GGUFReader(path)
    layers = {}
    for t in r.tensors:
        if t.name.endswith("_exps.weight"):
            layer = int(t.name.split(".")[1])
            n_exp = int(t.shape[-1])
            layers.setdefault(layer, []).append((int(t.data_offset), int(t.n_bytes) // n_exp, n_exp))
    out = []
    for layer, parts in layers.items():
        n_exp = parts[0][2]
        for e in range(n_exp):
            out.append([(off + e * per, per) for off, per, _ in parts])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=512 << 10)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    experts = expert_ranges(a.model)
    rnd = random.Random(1)
    pick = rnd.sample(experts, min(a.experts, len(experts)))
    jobs = []
    payload = 0
    for parts in pick:
        for off, n in parts:
            payload += n
            lo, hi = off // ALIGN * ALIGN, -(-(off + n) // ALIGN) * ALIGN
            for x in range(lo, hi, a.chunk):
                jobs.append((x, min(a.chunk, hi - x)))
    fd = os.open(a.model, os.O_RDONLY | os.O_DIRECT)
    lock = threading.Lock()
    it = iter(jobs)

    def worker():
        buf = mmap.mmap(-1, a.chunk)  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            off, n = job
            view = memoryview(buf)[:n]
            got = os.preadv(fd, [view], off)
            if got <= 0:
                raise SystemExit(f"short read at {off}")

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    res = {"experts": len(pick), "reads": len(jobs), "payload_bytes": payload, "seconds": dt,
           "gbs": payload / dt / 1e9, "threads": a.threads, "chunk": a.chunk,
           "expert_bytes": payload / len(pick)}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{len(pick)} experts ({payload / len(pick) / 1024:.0f} KiB each), {len(jobs)} reads of "
              f"<= {a.chunk >> 10} KiB at queue depth {a.threads}: {res['gbs']:.2f} GB/s")


if __name__ == "__main__":
    main()
