#!/usr/bin/env python3
"""Synthetic random-weight GGUF models of every architecture terrace runs, written with the PyPI
`gguf` writer, for logit parity against llama.cpp.

Random numbers come from a splitmix64 stream implemented here (not numpy's generators, whose
streams may change between numpy versions), so the same file is produced on every machine and
stored reference logits stay valid.

usage: synth.py ARCH TYPE OUT.gguf      TYPE in F32, F16, Q8_0 (Q4_K_M: quantize an F16 file
                                          with llama.cpp, see parity.py)
       synth.py ARCH TYPE OUT.gguf --chat TEMPLATES_DIR
                                        a chat model (ARCH in CHAT_SPECS): the real chat template
                                        of the family from TEMPLATES_DIR, its special tokens, and
                                        weights that make greedy decoding write a fixed reply
       synth.py --list                  print the ARCH names

The --chat models: every layer's output projections are scaled down a thousandfold, so the
residual stream stays the token's embedding, and the output head's row for each token of the
scripted reply is the normalised embedding of the token before it. Greedy decoding after the
prompt's last token then writes the reply token by token (a bigram model), in the family's own
format: gpt-oss's harmony channels, Qwen3's <think>, DeepSeek-R1's reasoning (its template opens
<think> in the prompt), Phi-3.5's plain turn. Parity files are written without --chat.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

MASK = (1 << 64) - 1


def splitmix(seed, n):
    """n uint64 values of the splitmix64 sequence started at `seed` (vectorised)"""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class Rng:
    def __init__(self, seed):
        self.seed = seed

    def normal(self, shape, std=1.0):
        n = int(np.prod(shape))
        self.seed = (self.seed * 6364136223846793005 + 1442695040888963407) & MASK
        u = splitmix(self.seed, 4 * n).reshape(4, n)
        f = (u >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # [0, 1)
        z = (f.sum(axis=0) - 2.0) * np.sqrt(3.0)  # Irwin-Hall(4), mean 0, var 1
        return (z * std).astype(np.float32).reshape(shape)


# shapes are small but exercise what matters: GQA, head_dim != n_embd/n_head (qwen3), biases
# (qwen2), sliding-window + global layers (gemma3, 6 layers, window 16)
ARCHS = {
    "llama":  dict(n_embd=256, n_layer=2, n_head=8, n_head_kv=2, head_dim=32, n_ff=512),
    "qwen2":  dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512),
    "qwen3":  dict(n_embd=256, n_layer=2, n_head=8, n_head_kv=4, head_dim=64, n_ff=512),
    "gemma3": dict(n_embd=256, n_layer=6, n_head=4, n_head_kv=1, head_dim=64, n_ff=512),
}
# MoE models: 8 experts, top-2 (gpt-oss: top-4), expert width 256 (a K-quant block row), every
# layer MoE; each architecture with its routing rule and extras (GGUF-FACTS §3.3-3.12)
MOE_ARCHS = {
    "qwen3moe": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, top_k=2, n_ff_exp=256),
    "qwen2moe": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, top_k=2, n_ff_exp=256,
                     n_ff_shexp=512),
    "olmoe": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=4, head_dim=64, n_expert=8, top_k=2, n_ff_exp=256),
    "phimoe": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, top_k=2, n_ff_exp=256),
    "mixtral": dict(n_embd=256, n_layer=2, n_head=8, n_head_kv=2, head_dim=32, n_expert=8, top_k=2, n_ff_exp=256),
    "gpt-oss": dict(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, top_k=4, n_ff_exp=256),
}
N_VOCAB = 1024
CTX = 2048


def byte_tokens():
    """the GPT-2 byte alphabet, so llama.cpp's BPE vocabulary loader accepts the file"""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


# a ~1.1B-parameter llama-shaped model for speed benchmarks (bench/bench_dense.sh)
BIG = {"llama-1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                        n_vocab=32000)}
# a >= 1 GiB (at Q4_K_M) qwen3moe for the bigger-than-memory benchmark (bench/bench_moe.sh)
BIG_MOE = {"qwen3moe-1g": dict(n_embd=1024, n_layer=18, n_head=16, n_head_kv=4, head_dim=64,
                               n_expert=64, top_k=8, n_ff_exp=512)}


# MoE models whose routers have structure, for recording route traces (tests/py/route_traces.py):
# every architecture, 12 layers, 32 experts. Each expert prefers one of TOPICS groups of tokens
# (routing drifts as the text changes topic), experts' popularity follows a Zipf law (skew), and
# layer l+1's router is layer l's with its rows permuted and noise added (per-layer correlation).
ROUTE_ARCHS = {
    a + "-routes": dict(MOE_ARCHS[a], n_embd=128, n_layer=12, n_head=4, n_head_kv=2, head_dim=32,
                        n_expert=32,
                        top_k={"mixtral": 2, "gpt-oss": 4}.get(a, 4), n_ff_exp=64, routes=True)
    for a in MOE_ARCHS
}
TOPICS = 4
ROUTE_SKEW, ROUTE_TOPIC, ROUTE_SCALE = 1.5, 1.0, 2.0
EMB_COMMON, EMB_TOPIC = 0.2, 0.4


def topic_of_token(i):
    """the topic group of token id i (route_traces.py writes text by these groups)"""
    return i % TOPICS


class FastRng:
    """numpy's generator: fast, for benchmark models whose exact bytes do not matter"""

    def __init__(self, seed):
        self.g = np.random.default_rng(seed)

    def normal(self, shape, std=1.0):
        return self.g.standard_normal(shape, dtype=np.float32) * np.float32(std)


# the chat models: template file, BOS/EOS, the special tokens (text, GGUF token type: 3 control,
# 4 user-defined), the prompt's last token, and the reply greedy decoding must write. Texts are
# in GPT-2's byte alphabet (Ġ = space, Ċ = newline); a reply token is used once (it has one
# successor); single characters are the byte tokens themselves.
FWB = "\uff5c"  # DeepSeek's fullwidth bar
CHAT_SPECS = {
    "qwen3moe": dict(
        template="Qwen-Qwen3-0.6B.jinja", bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
        specials=[("<|im_start|>", 3), ("<|im_end|>", 3), ("<|endoftext|>", 3), ("<think>", 4),
                  ("</think>", 4), ("<tool_call>", 4), ("</tool_call>", 4)],
        last="Ċ",
        reply=["<think>", "ĊThe", "Ġuser", "Ġgreets", "Ġme", ".Ċ", "</think>", "ĊĊ", "Hello", "!",
               "ĠHow", "Ġcan", "ĠI", "Ġhelp", "?", "<|im_end|>"]),
    "qwen2": dict(  # DeepSeek-R1-Distill-Qwen
        template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        bos=f"<{FWB}begin▁of▁sentence{FWB}>", eos=f"<{FWB}end▁of▁sentence{FWB}>", add_bos=True,
        specials=[(f"<{FWB}begin▁of▁sentence{FWB}>", 3), (f"<{FWB}end▁of▁sentence{FWB}>", 3),
                  (f"<{FWB}User{FWB}>", 3), (f"<{FWB}Assistant{FWB}>", 3), ("<think>", 4),
                  ("</think>", 4)],
        last="Ċ",
        reply=["Okay", ",", "Ġthe", "Ġuser", "Ġsays", "Ġhi", ".Ċ", "</think>", "ĊĊ", "Hi", "Ġthere",
               "!", f"<{FWB}end▁of▁sentence{FWB}>"]),
    "phimoe": dict(  # Phi-3.5-MoE shares Phi-3.5-mini's template
        template="microsoft-Phi-3.5-mini-instruct.jinja", bos="<s>", eos="<|endoftext|>", add_bos=False,
        specials=[("<s>", 3), ("<|endoftext|>", 3), ("<|system|>", 3), ("<|user|>", 3),
                  ("<|assistant|>", 3), ("<|end|>", 3)],
        last="Ċ",
        reply=["Hello", "!", "ĠI", "Ġam", "Ġa", "Ġtest", "Ġmodel", ".", "<|end|>"]),
    "gpt-oss": dict(
        template="openai-gpt-oss-120b.jinja", bos="<|startoftext|>", eos="<|return|>", add_bos=False,
        specials=[("<|startoftext|>", 3), ("<|return|>", 3), ("<|start|>", 3), ("<|end|>", 3),
                  ("<|message|>", 3), ("<|channel|>", 3), ("<|call|>", 3), ("<|constrain|>", 3)],
        last="t",
        # the second header spells <|channel|> and <|message|> with ordinary tokens: a bigram
        # model cannot give one token two successors
        reply=["<|channel|>", "analysis", "<|message|>", "The", "Ġuser", "Ġsaid", "Ġhi", ".", "<|end|>",
               "<|start|>", "assistant", "<|chan", "nel|>", "final", "<|mes", "sage|>", "Hello", "!",
               "<|return|>"]),
}
CHAT = None  # the spec being written, with its template text (set by --chat)


def chat_vocab():
    """the chat model's tokens and types: bytes, the specials, the reply's own tokens, fillers"""
    toks = byte_tokens()
    types = [1] * len(toks)
    for text, ty in CHAT["specials"]:
        toks.append(text)
        types.append(ty)
    for text in CHAT["reply"]:
        if text not in toks:
            toks.append(text)
            types.append(1)
    while len(toks) < N_VOCAB:
        toks.append(f"<extra_{len(toks)}>")
        types.append(1)
    return toks, types


def write(arch, qtype, path):
    global N_VOCAB
    if arch in MOE_ARCHS:
        return _write_moe(arch, MOE_ARCHS[arch], qtype, path)
    if arch in BIG_MOE:
        return _write_moe("qwen3moe", BIG_MOE[arch], qtype, path, FastRng(2))
    if arch in ROUTE_ARCHS:
        return _write_moe(arch[: -len("-routes")], ROUTE_ARCHS[arch], qtype, path,
                          FastRng(hash_seed(arch) & 0xFFFFFFFF))
    big = arch in BIG
    cfg = BIG[arch] if big else ARCHS[arch]
    saved_vocab = N_VOCAB
    if big:
        N_VOCAB = cfg["n_vocab"]
        arch = "llama"
    try:
        _write(arch, cfg, qtype, path, FastRng(1) if big else None)
    finally:
        N_VOCAB = saved_vocab


def _write(arch, cfg, qtype, path, fast_rng):
    E, L, H, KV, HD, F = (cfg[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff"))
    rng = fast_rng or Rng(hash_seed(arch))
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"terrace synthetic {arch} {qtype}")
    w.add_context_length(CTX)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-6 if arch != "llama" else 1e-5)
    w.add_rope_freq_base({"llama": 10000.0, "qwen2": 1e6, "qwen3": 1e6, "gemma3": 1e6}[arch])
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(HD)
        w.add_value_length(HD)
    if arch == "llama":
        w.add_rope_dimension_count(HD)
    if arch == "gemma3":
        w.add_sliding_window(16)
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[qtype])

    _tokenizer(w)
    saved = {}

    def mat(name, rows, cols, std, row_scale=None):
        data = rng.normal((rows, cols), std)
        if row_scale is not None:
            data *= row_scale[:, None]
        data = chat_weights(arch, name, data, saved)
        if qtype == "F32":
            w.add_tensor(name, data)
        elif qtype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, quantize(data, T.Q8_0), raw_dtype=T.Q8_0)

    def vec(name, n, mean=1.0, std=0.1):
        data = chat_weights(arch, name, (mean + rng.normal((n,), std)).astype(np.float32), saved)
        w.add_tensor(name, data)

    # weight scales give peaked but finite logits: top-1 margins well above float noise
    mat("token_embd.weight", N_VOCAB, E, 1.0)
    vec("output_norm.weight", E)
    if arch != "gemma3":
        mat("output.weight", N_VOCAB, E, 0.25, head_scale())
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", H * HD, E, E ** -0.5)
        mat(p + "attn_k.weight", KV * HD, E, E ** -0.5)
        mat(p + "attn_v.weight", KV * HD, E, E ** -0.5)
        mat(p + "attn_output.weight", E, H * HD, 0.5 * (H * HD) ** -0.5)
        if arch == "qwen2":
            vec(p + "attn_q.bias", H * HD, 0.0, 0.5)
            vec(p + "attn_k.bias", KV * HD, 0.0, 0.5)
            vec(p + "attn_v.bias", KV * HD, 0.0, 0.5)
        if arch in ("qwen3", "gemma3"):
            vec(p + "attn_q_norm.weight", HD)
            vec(p + "attn_k_norm.weight", HD)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", E)
            vec(p + "post_ffw_norm.weight", E)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", F, E, E ** -0.5)
        mat(p + "ffn_up.weight", F, E, E ** -0.5)
        mat(p + "ffn_down.weight", E, F, 0.5 * F ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tokenizer(w):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    if CHAT:
        toks, types = chat_vocab()
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(["Ġ t"])
        w.add_bos_token_id(toks.index(CHAT["bos"]))
        w.add_eos_token_id(toks.index(CHAT["eos"]))
        w.add_add_bos_token(CHAT["add_bos"])
        w.add_chat_template(CHAT["text"])
        return
    toks = byte_tokens()
    toks += [f"<extra_{i}>" for i in range(N_VOCAB - len(toks) - 2)] + ["<|bos|>", "<|eos|>"]
    w.add_token_list(toks)
    w.add_token_types([1] * (N_VOCAB - 2) + [3, 3])
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(N_VOCAB - 2)
    w.add_eos_token_id(N_VOCAB - 1)


# tensors whose output joins the residual stream: scaled down in the chat models
SCALED = ("attn_output.weight", "attn_output.bias", "ffn_down.weight", "ffn_down_exps.weight",
          "ffn_down_exps.bias", "ffn_down_shexp.weight")


def chat_weights(arch, name, data, saved):
    """the chat models' changes to a freshly drawn tensor (identity without --chat)"""
    if not CHAT:
        return data
    if name in ("token_embd.weight", "output_norm.weight"):
        saved[name] = data
    if name.endswith(SCALED):
        return data * np.float32(1e-3)
    if name in ("output.bias", "output_norm.bias"):  # (drawn after output.weight in phimoe)
        return np.zeros_like(data)
    if name != "output.weight":
        return data
    toks, _ = chat_vocab()
    emb, g = saved["token_embd.weight"].astype(np.float64), saved["output_norm.weight"].astype(np.float64)
    if arch == "phimoe":  # LayerNorm (its bias is zeroed above)
        x = emb - emb.mean(axis=1, keepdims=True)
        v = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * g
    else:
        v = emb / np.sqrt((emb * emb).mean(axis=1, keepdims=True) + 1e-6) * g
    head = (rng_small(data.shape) * 0.01).astype(np.float32)
    chain = [CHAT["last"]] + CHAT["reply"]
    for prev, nxt in zip(chain, chain[1:]):
        row = v[toks.index(prev)]
        head[toks.index(nxt)] += (20.0 * row / np.linalg.norm(row)).astype(np.float32)
    return head


def rng_small(shape):
    return Rng(7).normal(shape)


def _write_moe(arch, cfg, qtype, path, fast_rng=None):
    E, L, H, KV, HD = (cfg[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim"))
    NE, K, FE = cfg["n_expert"], cfg["top_k"], cfg["n_ff_exp"]
    rng = fast_rng or Rng(hash_seed(arch))
    garch = "llama" if arch == "mixtral" else arch
    w = gguf.GGUFWriter(path, garch)
    w.add_name(f"terrace synthetic {arch} {qtype}")
    w.add_context_length(CTX)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5 if arch in ("mixtral", "olmoe", "phimoe", "gpt-oss") else 1e-6)
    w.add_rope_freq_base({"gpt-oss": 150000.0, "mixtral": 1e6, "phimoe": 10000.0}.get(arch, 1e6))
    w.add_expert_count(NE)
    w.add_expert_used_count(K)
    if arch in ("qwen3moe", "qwen2moe", "gpt-oss"):
        w.add_expert_feed_forward_length(FE)
        w.add_feed_forward_length(FE * K if arch != "gpt-oss" else FE)
    else:
        w.add_feed_forward_length(FE)  # the expert width for mixtral / olmoe / phimoe
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg["n_ff_shexp"])
    if arch in ("qwen3moe", "gpt-oss"):
        w.add_key_length(HD)
        w.add_value_length(HD)
    if arch in ("mixtral", "phimoe"):
        w.add_rope_dimension_count(HD)
    if arch == "phimoe":
        # LongRoPE: long factors apply when the context exceeds the original 64 tokens
        w.add_rope_scaling_orig_ctx_len(64)
        w.add_key_value("phimoe.rope.scaling.attn_factor", 1.19024, gguf.GGUFValueType.FLOAT32)
        w.add_sliding_window(0)
    if arch == "gpt-oss":
        w.add_sliding_window(16)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[qtype])
    _tokenizer(w)

    def stored(data):
        if qtype == "F32":
            return data, None
        if qtype == "F16":
            return data.astype(np.float16), None
        return quantize(data, T.Q8_0), T.Q8_0

    saved = {}

    def mat(name, rows, cols, std, row_scale=None):
        data = rng.normal((rows, cols), std)
        if row_scale is not None:
            data *= row_scale[:, None]
        d, t = stored(chat_weights(arch, name, data, saved))
        w.add_tensor(name, d, raw_dtype=t)

    def exps(name, n_out, n_in, std):
        d, t = stored(chat_weights(arch, name, rng.normal((NE, n_out, n_in), std), saved))
        w.add_tensor(name, d, raw_dtype=t)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, chat_weights(arch, name, (mean + rng.normal((n,), std)).astype(np.float32), saved))

    routes = cfg.get("routes", False)
    if routes:
        # token embeddings: a common direction (every token's state shares it: the skew's axis),
        # the token's topic direction and noise
        common = rng.normal((E,), 1.0)
        topic_dirs = rng.normal((TOPICS, E), 1.0)
        emb = rng.normal((N_VOCAB, E), 1.0) + EMB_COMMON * common[None, :]
        emb += EMB_TOPIC * topic_dirs[[topic_of_token(i) for i in range(N_VOCAB)]]
        d, t = stored(emb.astype(np.float32))
        w.add_tensor("token_embd.weight", d, raw_dtype=t)
        zipf = 1.0 / (1.0 + np.arange(NE)) ** 0.8
        expert_topic = np.arange(NE) % TOPICS
        router = None
    else:
        mat("token_embd.weight", N_VOCAB, E, 1.0)
    vec("output_norm.weight", E)
    # a more peaked head than the dense models': MoE adds routing flips to the rounding noise
    mat("output.weight", N_VOCAB, E, 0.25, head_scale(8.0, 4.0))
    if arch == "phimoe":
        vec("output_norm.bias", E, 0.0, 0.1)
        vec("output.bias", N_VOCAB, 0.0, 0.5)
        vec("rope_factors_long.weight", HD // 2, 1.5, 0.3)
        vec("rope_factors_short.weight", HD // 2, 1.0, 0.05)
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", E)
        if arch == "phimoe":
            vec(p + "attn_norm.bias", E, 0.0, 0.1)
        mat(p + "attn_q.weight", H * HD, E, E ** -0.5)
        mat(p + "attn_k.weight", KV * HD, E, E ** -0.5)
        mat(p + "attn_v.weight", KV * HD, E, E ** -0.5)
        mat(p + "attn_output.weight", E, H * HD, 0.5 * (H * HD) ** -0.5)
        if arch in ("qwen2moe", "phimoe", "gpt-oss"):
            vec(p + "attn_q.bias", H * HD, 0.0, 0.5)
            vec(p + "attn_k.bias", KV * HD, 0.0, 0.5)
            vec(p + "attn_v.bias", KV * HD, 0.0, 0.5)
        if arch in ("phimoe", "gpt-oss"):
            vec(p + "attn_output.bias", E, 0.0, 0.1)
        if arch == "qwen3moe":
            vec(p + "attn_q_norm.weight", HD)
            vec(p + "attn_k_norm.weight", HD)
        if arch == "olmoe":
            vec(p + "attn_q_norm.weight", H * HD)
            vec(p + "attn_k_norm.weight", KV * HD)
        if arch == "gpt-oss":
            vec(p + "attn_sinks.weight", H, 0.0, 1.0)
        norm = "post_attention_norm" if arch == "gpt-oss" else "ffn_norm"
        vec(p + norm + ".weight", E)
        if arch == "phimoe":
            vec(p + "ffn_norm.bias", E, 0.0, 0.1)
        # router in F32, as the converters write it; a larger scale gives decisive routing
        if routes:
            fresh = (rng.normal((NE, E), 1.0) + ROUTE_SKEW * zipf[:, None] * common[None, :]
                     + ROUTE_TOPIC * topic_dirs[expert_topic])
            # layer l+1 = layer l's rows in a new order (expert e here is expert perm[e] there)
            # plus noise: co-activation across layers without identical routers
            router = fresh if router is None else (
                0.8 * router[rng.g.permutation(NE)] + 0.6 * fresh)
            # rows of norm ROUTE_SCALE: logits of a few units, so the top-k is decided by the
            # state but the weights are not one-hot
            w.add_tensor(p + "ffn_gate_inp.weight",
                         (router * (ROUTE_SCALE / np.linalg.norm(router, axis=1, keepdims=True)))
                         .astype(np.float32))
        else:
            w.add_tensor(p + "ffn_gate_inp.weight", rng.normal((NE, E), 8.0 * E ** -0.5))
        if arch == "gpt-oss":
            vec(p + "ffn_gate_inp.bias", NE, 0.0, 0.5)
        exps(p + "ffn_gate_exps.weight", FE, E, E ** -0.5)
        exps(p + "ffn_up_exps.weight", FE, E, E ** -0.5)
        exps(p + "ffn_down_exps.weight", E, FE, 0.5 * FE ** -0.5)
        if arch == "gpt-oss":
            w.add_tensor(p + "ffn_gate_exps.bias", rng.normal((NE, FE), 0.1))
            w.add_tensor(p + "ffn_up_exps.bias", rng.normal((NE, FE), 0.1))
            w.add_tensor(p + "ffn_down_exps.bias", chat_weights(arch, "ffn_down_exps.bias", rng.normal((NE, E), 0.1), saved))
        if arch == "qwen2moe":
            FS = cfg["n_ff_shexp"]
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", rng.normal((E,), E ** -0.5))
            mat(p + "ffn_gate_shexp.weight", FS, E, E ** -0.5)
            mat(p + "ffn_up_shexp.weight", FS, E, E ** -0.5)
            mat(p + "ffn_down_shexp.weight", E, FS, 0.5 * FS ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def head_scale(amp=4.0, width=8.0):
    """Zipf-like output row norms: a trained LM head makes a few tokens far likelier than the
    rest, so its next-token distributions are peaked. With i.i.d. rows the top-1 is the maximum
    of 1024 similar logits and its margin over the runner-up is often below the noise that F16 and
    Q8 rounding of activations add on any two implementations (see tests/py/parity.py)."""
    rank = np.arange(N_VOCAB, dtype=np.float64)
    perm = splitmix(99, N_VOCAB).argsort()  # hot tokens spread over the vocabulary
    rank = rank[:N_VOCAB]
    scale = np.empty(N_VOCAB)
    scale[perm] = 1.0 + amp / (1.0 + rank / width)
    return scale.astype(np.float32)


def hash_seed(s):
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & MASK
    return h


def token_sequence(n, seed=1):
    """a deterministic prompt of n ids (avoiding the two special ids)"""
    u = splitmix(seed, n)
    return [int(x % np.uint64(N_VOCAB - 2)) for x in u]


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(list(ARCHS) + list(MOE_ARCHS) + list(ROUTE_ARCHS)))
        sys.exit(0)
    args = sys.argv[1:]
    if "--chat" in args:
        i = args.index("--chat")
        tdir = args[i + 1]
        del args[i:i + 2]
        if args[0] not in CHAT_SPECS:
            sys.exit(f"synth.py: no chat model for {args[0]} (one of {', '.join(CHAT_SPECS)})")
        CHAT = dict(CHAT_SPECS[args[0]])
        with open(f"{tdir}/{CHAT['template']}", encoding="utf-8") as f:
            CHAT["text"] = f.read()
    write(args[0], args[1], args[2])
