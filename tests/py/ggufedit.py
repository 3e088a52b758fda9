#!/usr/bin/env python3
"""Rewrites GGUF files byte by byte for the hostile-input tests: parses the header (metadata and
tensor infos) into Python values, lets a test change metadata or the layout, and writes a new
file. Works on any GGUF (the synthetic models, the default model), without the gguf writer, which
refuses most of what these tests need (alignment 1 with odd offsets, values of the wrong type,
strings with NULs).

    f = GGUF.read(path)
    f.set("general.alignment", U32, 1)
    f.write(out, odd_offsets=True)     # every tensor at an odd byte, data copied from the source
"""
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
       U64: "<Q", I64: "<q", F64: "<d"}


class _Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = bytes(self.b[self.o:self.o + n])
        self.o += n
        return s

    def value(self, t):
        if t == STR:
            return self.string()
        if t == ARR:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(FMT[t])


def _pack_value(t, v):
    if t == STR:
        b = v.encode() if isinstance(v, str) else v
        return struct.pack("<Q", len(b)) + b
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(_pack_value(et, x) for x in items)
    return struct.pack(FMT[t], v)


class Tensor:
    def __init__(self, name, dims, ttype, offset):
        self.name, self.dims, self.ttype, self.offset = name, dims, ttype, offset
        self.data = None  # bytes, filled by read()


class GGUF:
    def __init__(self):
        self.version = 3
        self.kv = []       # [key(bytes), type, value]
        self.tensors = []  # [Tensor]

    @staticmethod
    def read(path):
        with open(path, "rb") as fh:
            b = fh.read()
        r = _Reader(b)
        assert r.take("<I") == 0x46554747, f"{path}: not a GGUF file"
        g = GGUF()
        g.version = r.take("<I")
        n_t, n_kv = r.take("<Q"), r.take("<Q")
        align = 32
        for _ in range(n_kv):
            k = r.string()
            t = r.take("<I")
            v = r.value(t)
            if k == b"general.alignment":
                align = v
            g.kv.append([k, t, v])
        for _ in range(n_t):
            name = r.string()
            nd = r.take("<I")
            dims = [r.take("<Q") for _ in range(nd)]
            tt, off = r.take("<I"), r.take("<Q")
            g.tensors.append(Tensor(name, dims, tt, off))
        start = (r.o + align - 1) // align * align
        ordered = sorted(g.tensors, key=lambda t: t.offset)
        for i, t in enumerate(ordered):
            end = ordered[i + 1].offset if i + 1 < len(ordered) else len(b) - start
            t.data = b[start + t.offset:start + end]
        # trailing padding belongs to no tensor, but is harmless to keep with the last one
        return g

    # ---- metadata --------------------------------------------------------------------------
    def find(self, key):
        k = key.encode() if isinstance(key, str) else key
        for e in self.kv:
            if e[0] == k:
                return e
        return None

    def get(self, key):
        e = self.find(key)
        return None if e is None else e[2]

    def set(self, key, vtype, value):
        e = self.find(key)
        k = key.encode() if isinstance(key, str) else key
        if e is None:
            self.kv.append([k, vtype, value])
        else:
            e[1], e[2] = vtype, value

    def drop(self, key):
        k = key.encode() if isinstance(key, str) else key
        self.kv = [e for e in self.kv if e[0] != k]

    def tensor(self, name):
        n = name.encode() if isinstance(name, str) else name
        return next(t for t in self.tensors if t.name == n)

    # ---- writing ---------------------------------------------------------------------------
    def write(self, path, odd_offsets=False):
        """odd_offsets: general.alignment = 1 and every tensor at an odd absolute byte offset"""
        if odd_offsets:
            self.set("general.alignment", U32, 1)
        e = self.find("general.alignment")
        align = e[2] if e is not None and e[1] == U32 else 32
        head = struct.pack("<IIQQ", 0x46554747, self.version, len(self.tensors), len(self.kv))
        kvb = b"".join(_pack_value(STR, k) + struct.pack("<I", t) + _pack_value(t, v)
                       for k, t, v in self.kv)

        def infos(offsets):
            out = b""
            for t, off in zip(self.tensors, offsets):
                out += _pack_value(STR, t.name) + struct.pack("<I", len(t.dims))
                out += b"".join(struct.pack("<Q", d) for d in t.dims)
                out += struct.pack("<IQ", t.ttype, off)
            return out

        # the infos' size does not depend on the offsets' values, so lay out once
        base = len(head) + len(kvb) + len(infos([0] * len(self.tensors)))
        start = (base + align - 1) // align * align
        offsets, data, pos = [], bytearray(), 0
        for t in self.tensors:
            size = tensor_bytes(t)
            pad = (align - pos % align) % align
            if odd_offsets and (start + pos + pad) % 2 == 0:
                pad += 1
            data += b"\0" * pad
            pos += pad
            offsets.append(pos)
            data += t.data[:size]
            pos += size
        with open(path, "wb") as fh:
            fh.write(head + kvb + infos(offsets))
            fh.write(b"\0" * (start - base))
            fh.write(bytes(data))


# elements per block and bytes per block of the types the tests use (ggml's table)
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
         20: (32, 18), 23: (256, 136), 30: (1, 2), 39: (32, 17)}


def tensor_bytes(t):
    blck, size = BLOCK[t.ttype]
    n = 1
    for d in t.dims:
        n *= d
    return n // blck * size


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 4 or sys.argv[1] != "--odd-offsets":
        sys.exit("usage: ggufedit.py --odd-offsets IN.gguf OUT.gguf")
    GGUF.read(sys.argv[2]).write(sys.argv[3], odd_offsets=True)
