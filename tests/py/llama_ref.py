#!/usr/bin/env python3
"""llama.cpp as the reference, through the PyPI llama-cpp-python package (built from its source
distribution by scripts/peer.sh into .venv-peer; never vendored).

Subcommands (all print JSON or write files; run with .venv-peer/bin/python3):
  logits MODEL TOKENS_CSV OUT.f32 [--threads N] [--batch N]
        logits of every position, flash attention off (GGUF-FACTS §6), raw f32 [n][n_vocab]
  quantize IN.gguf OUT.gguf FTYPE       llama_model_quantize (15 = Q4_K_M)
  greedy MODEL TOKENS_CSV N             greedy continuation: N token ids, and the top-2 logit
                                        margin at every step
  tokenize MODEL TEXT                   token ids (add_special, parse_special as llama-cli)
  perplexity MODEL TEXTFILE CTX         llama.cpp's perplexity method (see tools/perplexity.c)
"""
import ctypes
import json
import os
import sys

import numpy as np
import llama_cpp


def load(model, n_ctx, threads, batch, logits_all=True):
    return llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch,
                           n_threads=threads, n_threads_batch=threads, logits_all=logits_all,
                           flash_attn=False, verbose=False, seed=0)


def cmd_logits(args):
    model, toks, out = args[0], [int(x) for x in args[1].split(",")], args[2]
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 2
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 512
    llm = load(model, max(len(toks), 16), threads, batch)
    llm.eval(toks)
    scores = np.array(llm.scores[: len(toks)], dtype=np.float32)
    scores.tofile(out)
    print(json.dumps({"n": len(toks), "n_vocab": llm.n_vocab()}))


def cmd_quantize(args):
    src, dst, ftype = args[0], args[1], int(args[2])
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed: {rc}")


def cmd_greedy(args):
    model, toks, n = args[0], [int(x) for x in args[1].split(",")], int(args[2])
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 2
    llm = load(model, len(toks) + n + 8, threads, 512, logits_all=True)
    llm.eval(toks)
    out, margins = [], []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top = np.argsort(-logits)[:2]
        out.append(int(top[0]))
        margins.append(float(logits[top[0]] - logits[top[1]]))
        llm.eval([int(top[0])])
    print(json.dumps({"tokens": out, "margins": margins}))


def cmd_tokenize(args):
    llm = llama_cpp.Llama(model_path=args[0], vocab_only=True, verbose=False)
    print(json.dumps(llm.tokenize(args[1].encode(), add_bos=True, special=True)))


def cmd_perplexity(args):
    model, path, n_ctx = args[0], args[1], int(args[2])
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 2
    llm = load(model, n_ctx, threads, min(n_ctx, 512))
    with open(path, "rb") as f:
        text = f.read()
    toks = llm.tokenize(text, add_bos=True, special=False)
    add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))
    bos = llm.token_bos()
    n_chunk = len(toks) // n_ctx
    first = n_ctx // 2
    nll, nll2, count = 0.0, 0.0, 0
    for c in range(n_chunk):
        chunk = toks[c * n_ctx:(c + 1) * n_ctx]
        if add_bos:
            chunk = [bos] + chunk[1:]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[first:n_ctx - 1], dtype=np.float32)
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp((logits - mx).astype(np.float64)).sum(axis=1))
        tgt = np.array(toks[c * n_ctx + first + 1:(c + 1) * n_ctx])
        v = -((logits[np.arange(len(tgt)), tgt] - mx[:, 0]).astype(np.float64) - lse)
        nll += v.sum()
        nll2 += (v * v).sum()
        count += len(v)
    mean, mean2 = nll / count, nll2 / count
    ppl = float(np.exp(mean))
    unc = mean2 - mean * mean
    unc = float(np.sqrt(unc / (count - 1))) if unc > 0 else 0.0
    print(json.dumps({"ppl": ppl, "uncertainty": unc * ppl, "tokens": len(toks), "chunks": n_chunk,
                      "ctx": n_ctx}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"logits": cmd_logits, "quantize": cmd_quantize, "greedy": cmd_greedy,
     "tokenize": cmd_tokenize, "perplexity": cmd_perplexity}[cmd](sys.argv[2:])
