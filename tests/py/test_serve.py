#!/usr/bin/env python3
"""terrace serve through the official `openai` package and Ollama's API, on the default model:

- models, chat (non-streamed and streamed), completions; for greedy requests the reassembled
  stream equals the non-streamed text, and usage agrees;
- stop strings, max_tokens, the prefix of a conversation reused by its next turn;
- Ollama's /api/tags, /api/chat and /api/generate (NDJSON streams) give the OpenAI endpoints' text;
- 16 concurrent clients with different prompts: each greedy answer equals the same request served
  alone, the steps really batched them, and the throughput counters add up;
- a long prompt is prefilled in chunks while another request keeps generating;
- /metrics is valid Prometheus text.

usage: test_serve.py TERRACE MODEL
"""
import json
import re
import sys
import threading
import time

import openai

import serve_util as su
from serve_util import check

TERRACE, MODEL = sys.argv[1], sys.argv[2]
srv = su.Server(TERRACE, MODEL, "-np", "16", "-c", "512")
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused",
                           max_retries=0, timeout=300)
    models = client.models.list()
    mid = models.data[0].id
    check(len(models.data) == 1 and mid.startswith("SmolLM2"), f"models: {models}")

    # ---- chat: streamed == non-streamed for a greedy request ------------------------------------
    msgs = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three colors of the rainbow."}]
    r = client.chat.completions.create(model=mid, messages=msgs, temperature=0, max_tokens=32)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat shape")
    check(len(text) > 0 and r.choices[0].finish_reason in ("stop", "length"), f"chat: {r}")
    check(r.usage.completion_tokens > 0 and r.usage.total_tokens ==
          r.usage.prompt_tokens + r.usage.completion_tokens, f"usage: {r.usage}")
    parts, finish, usage, roles = [], None, None, 0
    for ch in client.chat.completions.create(model=mid, messages=msgs, temperature=0,
                                             max_tokens=32, stream=True,
                                             stream_options={"include_usage": True}):
        check(ch.object == "chat.completion.chunk", f"chunk object {ch.object}")
        if ch.usage:
            usage = ch.usage
        if ch.choices:
            d = ch.choices[0].delta
            roles += d.role == "assistant"
            if d.content:
                parts.append(d.content)
            if ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
    streamed = "".join(parts)
    check(streamed == text, f"stream {streamed!r} != non-streamed {text!r}")
    check(finish == r.choices[0].finish_reason, f"finish {finish} vs {r.choices[0].finish_reason}")
    check(roles == 1, f"the role came {roles} times")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens and
          usage.prompt_tokens == r.usage.prompt_tokens, f"stream usage {usage} vs {r.usage}")
    print(f"  chat: {text!r} ({r.usage.completion_tokens} tokens); the stream is the same")

    # ---- the next turn of the conversation reuses its prefix -------------------------------------
    msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "And one more?"}]
    r2 = client.chat.completions.create(model=mid, messages=msgs2, temperature=0, max_tokens=8)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check(cached >= r.usage.prompt_tokens - 1,
          f"second turn reused {cached} tokens of a {r.usage.prompt_tokens}-token first prompt")
    print(f"  second turn: {cached} of {r2.usage.prompt_tokens} prompt tokens reused")

    # ---- completions ------------------------------------------------------------------------------
    c = client.completions.create(model=mid, prompt="Once upon a time", temperature=0, max_tokens=24)
    ctext = c.choices[0].text
    check(c.object == "text_completion" and c.usage.completion_tokens == 24 and
          c.choices[0].finish_reason == "length", f"completion: {c}")
    cs = "".join(ch.choices[0].text for ch in client.completions.create(
        model=mid, prompt="Once upon a time", temperature=0, max_tokens=24, stream=True) if ch.choices)
    check(cs == ctext, f"completion stream {cs!r} != {ctext!r}")
    d16 = client.completions.create(model=mid, prompt="Once upon a time", temperature=0)
    check(d16.usage.completion_tokens == 16, f"default max_tokens: {d16.usage}")
    # a stop string ends the text before it
    first_word = ctext.strip().split()[0] if ctext.strip() else ","
    st = client.completions.create(model=mid, prompt="Once upon a time", temperature=0,
                                   max_tokens=24, stop=[first_word])
    check(st.choices[0].finish_reason == "stop" and first_word not in st.choices[0].text and
          ctext.startswith(st.choices[0].text), f"stop {first_word!r}: {st.choices[0]}")
    # token ids as the prompt, and echo
    ids = client.completions.create(model=mid, prompt=[1, 2, 3], temperature=0, max_tokens=4)
    check(ids.usage.prompt_tokens == 3, f"token-id prompt: {ids.usage}")
    ec = client.completions.create(model=mid, prompt="Once upon a time", temperature=0,
                                   max_tokens=24, echo=True)
    check(ec.choices[0].text == "Once upon a time" + ctext, f"echo: {ec.choices[0].text!r}")
    # a seeded sampled request is repeatable
    s1 = client.completions.create(model=mid, prompt="Once upon a time", temperature=1.0, seed=7,
                                   max_tokens=16).choices[0].text
    s2 = client.completions.create(model=mid, prompt="Once upon a time", temperature=1.0, seed=7,
                                   max_tokens=16).choices[0].text
    check(s1 == s2, f"seed 7 gave {s1!r} then {s2!r}")
    print(f"  completion: {ctext!r}; stream, stop, ids, echo, seed agree")

    # ---- Ollama's API ------------------------------------------------------------------------------
    stc, _, tags = srv.request("GET", "/api/tags")
    check(stc == 200 and tags["models"][0]["name"] == mid, f"tags: {tags}")
    stc, _, oc = srv.request("POST", "/api/chat", {"model": mid + ":latest", "messages": msgs,
                                                   "stream": False,
                                                   "options": {"temperature": 0, "num_predict": 32}})
    check(stc == 200 and oc["message"]["content"] == text and oc["done"] and
          oc["eval_count"] == r.usage.completion_tokens, f"/api/chat: {oc}")
    conn = srv.conn()
    conn.request("POST", "/api/chat", body=json.dumps(
        {"model": mid, "messages": msgs, "options": {"temperature": 0, "num_predict": 32}}))
    resp = conn.getresponse()
    lines = [json.loads(x) for x in resp.read().decode().splitlines() if x.strip()]
    conn.close()
    check(resp.getheader("Content-Type") == "application/x-ndjson", "NDJSON content type")
    check("".join(x["message"]["content"] for x in lines) == text and lines[-1]["done"] and
          not any(x["done"] for x in lines[:-1]), f"/api/chat stream: {lines[-3:]}")
    stc, _, og = srv.request("POST", "/api/generate", {"model": mid, "prompt": "Once upon a time",
                                                       "raw": True, "stream": False,
                                                       "options": {"temperature": 0, "num_predict": 24}})
    check(stc == 200 and og["response"] == ctext, f"/api/generate raw: {og}")
    print("  ollama: /api/tags, /api/chat (and its stream), /api/generate match")

    # ---- 16 concurrent clients == each alone; the counters add up ------------------------------
    topics = ["cats", "the ocean", "mountains", "coffee", "rain", "the moon", "bicycles", "music",
              "trees", "winter", "bread", "trains", "stars", "gardens", "rivers", "books"]

    # the whole prompt computed (cache_prompt false): reused rows were computed as part of another
    # request, so the answer alone would otherwise depend on what the slot held
    def ask(t):
        return client.chat.completions.create(
            model=mid, temperature=0, max_tokens=24, extra_body={"cache_prompt": False},
            messages=[{"role": "user", "content": f"Write one sentence about {t}."}])

    m0, _ = srv.metrics()
    together = [None] * 16
    go = threading.Barrier(16)

    def worker(i):
        go.wait()
        together[i] = ask(topics[i])

    th = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    m1, _ = srv.metrics()
    alone = [ask(t) for t in topics]
    same = sum(a.choices[0].message.content == b.choices[0].message.content
               for a, b in zip(together, alone))
    check(same == 16, f"{16 - same} of 16 concurrent answers differ from the same request alone")
    for a, b in zip(together, alone):
        if a.choices[0].message.content != b.choices[0].message.content:
            print(f"    together {a.choices[0].message.content!r}\n    alone    {b.choices[0].message.content!r}")
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
    gen = sum(x.usage.completion_tokens for x in together)
    prompt = sum(x.usage.prompt_tokens for x in together)
    check(d["generated_tokens_total"] == gen, f"generated_tokens_total +{d['generated_tokens_total']} "
          f"vs {gen} in the answers")
    check(d["prompt_tokens_total"] == prompt, f"prompt_tokens_total +{d['prompt_tokens_total']} vs {prompt}")
    key = 'requests_total{route="/v1/chat/completions",code="200"}'
    check(d.get(key) == 16, f"{key} +{d.get(key)}")
    check(d['requests_finished_total{reason="stop"}'] + d['requests_finished_total{reason="length"}'] == 16,
          "finished counters")
    decode_steps = d["steps_total"]
    rows = d["step_decode_rows_total"]
    check(rows >= gen - 16, f"decode rows {rows} for {gen} tokens")
    check(rows / max(1, decode_steps) >= 4, f"{rows} decode rows in {decode_steps} steps: not batched")
    print(f"  16 concurrent: 16/16 equal alone; {gen} tokens in {decode_steps:.0f} steps "
          f"({rows / max(1, decode_steps):.1f} rows a step); counters add up")

    # ---- a long prompt is prefilled in chunks next to another request's decode -----------------
    counts = {"n": 0}
    started = threading.Event()

    enough = threading.Event()

    def long_stream():
        stream = client.completions.create(model=mid, prompt="Count: 1, 2, 3,", temperature=0,
                                           max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True})
        for ch in stream:
            if ch.choices and ch.choices[0].text:
                counts["n"] += 1
                if counts["n"] == 5:
                    started.set()
            if enough.is_set():
                stream.close()  # the server cancels it at its next step
                break

    t = threading.Thread(target=long_stream)
    t.start()
    started.wait(120)
    # a prompt of one chunk gets a step of its own: its first token waits for no decode row
    sp = client.completions.create(model=mid, prompt="The sky is", temperature=0, max_tokens=1)
    stm = (sp.model_extra or {}).get("timings") or {}
    check(stm.get("prompt_steps") == 1 and stm.get("prompt_beside_tokens") == 0,
          f"a one-chunk prompt beside a generating stream: timings {stm}")
    long_prompt = " ".join(f"word{i}" for i in range(110))  # ~380 tokens: 3 chunks of 128
    n0 = counts["n"]
    lp = client.completions.create(model=mid, prompt=long_prompt, temperature=0, max_tokens=1)
    n1 = counts["n"]
    enough.set()
    t.join()
    chunks = -(-lp.usage.prompt_tokens // 128)
    check(lp.usage.prompt_tokens > 300, f"long prompt {lp.usage.prompt_tokens} tokens")
    # The server counts what its steps held: every chunk in a step of its own, each beside the
    # other stream's decode row (a prefill that stalled the other stream would give it no token
    # in those steps). What this client received meanwhile may lag by the last step's token.
    tm = (lp.model_extra or {}).get("timings") or {}
    steps, beside = tm.get("prompt_steps"), tm.get("prompt_beside_tokens")
    check(steps == chunks, f"the {lp.usage.prompt_tokens}-token prompt took {steps} steps, not {chunks}")
    check(beside is not None and beside >= chunks,
          f"the other stream got {beside} tokens in the {steps} prefill steps "
          f"({lp.usage.prompt_tokens} tokens, {chunks} chunks)")
    check(n1 - n0 >= chunks - 1, f"the other stream's client got {n1 - n0} tokens during a "
          f"{lp.usage.prompt_tokens}-token prefill ({chunks} chunks)")
    print(f"  a {lp.usage.prompt_tokens}-token prompt prefilled in {steps} steps; the other stream "
          f"got {beside} tokens in them ({n1 - n0} received meanwhile)")

    # ---- /metrics is Prometheus text ------------------------------------------------------------
    _, text_m = srv.metrics()
    sample = re.compile(r'^terrace_[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [-+0-9.eEinfINFNa]+$')
    bad = [l for l in text_m.splitlines() if l and not l.startswith("# ") and not sample.match(l)]
    check(not bad, f"/metrics lines that are not samples: {bad[:3]}")
    for name in ("requests_total", "generated_tokens_total", "decode_tokens_per_second",
                 "queue_length", "slots_busy", "ttft_seconds", "expert_cache_hits_total",
                 "expert_bytes_read_total", "expert_io_wait_seconds_total", "kv_hot_bytes",
                 "kv_cold_bytes", "rss_bytes"):
        check(f"# TYPE terrace_{name} " in text_m, f"/metrics lacks {name}")
    check(srv.request("GET", "/health")[0] == 200, "/health")
finally:
    rc = srv.stop()
check(rc == 0, f"the server exited with {rc}")
su.done("test_serve")
