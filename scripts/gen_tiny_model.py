#!/usr/bin/env python3
"""Writes a small synthetic GGUF (random weights, qwen3moe layout, mixed tensor types) so that
`make demo` has something to inspect before a real model is installed.

usage: gen_tiny_model.py OUT.gguf
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

rng = np.random.default_rng(0)
n_embd, n_layer, n_head, n_kv, hd, n_exp, top_k, n_ff_exp, n_vocab = 256, 2, 4, 2, 64, 8, 2, 128, 512

w = gguf.GGUFWriter(sys.argv[1], "qwen3moe")
w.add_name("terrace tiny demo (random weights)")
w.add_context_length(4096)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_head_count(n_head)
w.add_head_count_kv(n_kv)
w.add_key_length(hd)
w.add_value_length(hd)
w.add_rope_freq_base(1e6)
w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(n_exp)
w.add_expert_used_count(top_k)
w.add_expert_feed_forward_length(n_ff_exp)
w.add_file_type(7)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list([f"tok{i}" for i in range(n_vocab)])
w.add_token_types([1] * n_vocab)
w.add_bos_token_id(0)
w.add_eos_token_id(1)


def q8(shape):
    return quantize((rng.standard_normal(shape) * 0.02).astype(np.float32), T.Q8_0)


w.add_tensor("token_embd.weight", q8((n_vocab, n_embd)), raw_dtype=T.Q8_0)
w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
for i in range(n_layer):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor(p + "attn_q.weight", q8((n_head * hd, n_embd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "attn_k.weight", q8((n_kv * hd, n_embd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "attn_v.weight", q8((n_kv * hd, n_embd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "attn_output.weight", q8((n_embd, n_head * hd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "attn_q_norm.weight", np.ones(hd, dtype=np.float32))
    w.add_tensor(p + "attn_k_norm.weight", np.ones(hd, dtype=np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_exp, n_embd)) * 0.02).astype(np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", q8((n_exp, n_ff_exp, n_embd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "ffn_up_exps.weight", q8((n_exp, n_ff_exp, n_embd)), raw_dtype=T.Q8_0)
    w.add_tensor(p + "ffn_down_exps.weight", q8((n_exp, n_embd, n_ff_exp)), raw_dtype=T.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
