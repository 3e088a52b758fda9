#!/usr/bin/env python3
"""Write a vocab-only GGUF (no tensors) from the head of a GGUF model file.

    gen_tiny_vocab.py SRC.gguf DST.gguf

SRC may be truncated: only the header and the key/value section are read (they come first in a
GGUF file and hold the whole tokenizer), so the first part of a model split into chunks is enough.
DST keeps every key/value and declares zero tensors, like llama.cpp's ggml-vocab-*.gguf files.
Standard library only.
"""
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def kv_section_end(f):
    """Offset just past the last key/value record, reading only what is needed."""
    def read(n):
        b = f.read(n)
        if len(b) != n:
            raise SystemExit("truncated before the end of the key/value section")
        return b

    if read(4) != b"GGUF":
        raise SystemExit("not a GGUF file")
    version, = struct.unpack("<I", read(4))
    if version != 3:
        raise SystemExit(f"GGUF version {version} not supported")
    _n_tensors, n_kv = struct.unpack("<QQ", read(16))

    def skip_value(t):
        if t == STRING:
            n, = struct.unpack("<Q", read(8))
            f.seek(n, 1)
        elif t == ARRAY:
            at, n = struct.unpack("<IQ", read(12))
            if at == STRING:
                for _ in range(n):
                    skip_value(STRING)
            elif at in SCALAR:
                f.seek(SCALAR[at] * n, 1)
            else:
                raise SystemExit(f"unsupported array element type {at}")
        elif t in SCALAR:
            f.seek(SCALAR[t], 1)
        else:
            raise SystemExit(f"unsupported value type {t}")

    for _ in range(n_kv):
        n, = struct.unpack("<Q", read(8))
        f.seek(n, 1)
        t, = struct.unpack("<I", read(4))
        skip_value(t)
    return n_kv, f.tell()


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        n_kv, end = kv_section_end(f)
        f.seek(24)
        body = f.read(end - 24)
    if len(body) != end - 24:
        raise SystemExit("truncated key/value section")
    with open(dst, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + body)
    print(f"{dst}: {n_kv} keys, {end} bytes")


if __name__ == "__main__":
    main()
