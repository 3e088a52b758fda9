#!/usr/bin/env python3
"""Writes the dequantization reference file for tests/test_dequant.c.

For every tensor type terrace dequantizes, the file holds
  q.<TYPE>    the quantized blocks,
  ref.<TYPE>  their dequantization computed by the PyPI `gguf` package (gguf.quants, numpy) —
              an implementation independent of ours,
  src.<TYPE>  (F16/BF16 only) the f32 source, so the C side can also check its f32->f16/bf16
              conversion against numpy's.
Where gguf.quants can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, MXFP4, F16) random floats
are quantized with it; for the others (K-quants, IQ4_NL, IQ4_XS: gguf only dequantizes them)
the blocks are random bytes whose f16 scale fields are replaced by random finite values.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize

QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.MXFP4]
# type -> byte offsets of its f16 scale fields inside one block
RANDOM_BLOCKS = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}


def random_blocks(rng, qtype, n_blocks):
    blck, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in RANDOM_BLOCKS[qtype]:
        scales = (rng.standard_normal(n_blocks) * 0.02).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def main(path):
    rng = np.random.default_rng(20261129)
    w = gguf.GGUFWriter(path, "terrace-dequant-test")
    rows, cols = 64, 512  # 64 rows of 512 elements: every block type divides 512
    for qt in QUANTIZABLE:
        src = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0, (rows, 1))).astype(np.float32)
        src[0, :32] = 0.0  # an all-zero block (d = 0 paths)
        q = quantize(src, qt)
        ref = dequantize(q, qt).astype(np.float32)
        w.add_tensor(f"q.{qt.name}", q, raw_dtype=qt)
        w.add_tensor(f"ref.{qt.name}", ref.reshape(rows, cols))
        if qt == T.BF16:
            w.add_tensor(f"src.{qt.name}", src)
    for qt in RANDOM_BLOCKS:
        blck, size = gguf.GGML_QUANT_SIZES[qt]
        raw = random_blocks(rng, qt, rows * cols // blck).reshape(rows, -1)
        ref = dequantize(raw, qt).astype(np.float32)
        w.add_tensor(f"q.{qt.name}", raw, raw_dtype=qt)
        w.add_tensor(f"ref.{qt.name}", ref.reshape(rows, cols))
    # F16: every finite bit pattern (normals, subnormals, zeros, infinities; NaNs excluded because
    # hardware conversions quiet signalling NaNs) plus a conversion check from random f32
    bits = np.arange(65536, dtype=np.uint16)
    is_nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0)
    bits = bits[~is_nan]
    bits = bits[: (len(bits) // 32) * 32]
    h = bits.view(np.float16).reshape(-1, 32)
    w.add_tensor("q.F16", h)
    w.add_tensor("ref.F16", h.astype(np.float32))
    src = (rng.standard_normal((rows, cols)) * 100).astype(np.float32)
    src[0, :8] = [65504.0, 65520.0, 1e-8, -1e-8, 6.1e-5, 5.96e-8, 1e9, -0.0]
    w.add_tensor("src.F16", src)
    with np.errstate(over="ignore"):  # 1e9 -> inf on purpose
        w.add_tensor("conv.F16", src.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
