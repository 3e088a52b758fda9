#!/usr/bin/env python3
"""terrace serve under bad input and bad clients (run against the ASan/UBSan build): every case
gets the right status with OpenAI's error object (Ollama's {"error": ...} on /api/*), and the
server stays up and exact.

- an API key: 401 without it or with a wrong one (Bearer and Basic), /health open;
- unknown routes (404), wrong methods (405), bodies over the limit (413, with Content-Length and
  chunked);
- malformed JSON, wrong types, unknown roles, huge numbers, features it does not have, an unknown
  model (404), prompts and max_tokens beyond the context: 400;
- a client killed mid-stream: its slot is free for the next request; a full queue: 503;
- SIGTERM during two streams: both end with a final chunk and [DONE], the server exits 0 (and
  ASan finds no leak).

usage: test_serve_faults.py TERRACE MODEL
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import serve_util as su
from serve_util import check

TERRACE, MODEL = sys.argv[1], sys.argv[2]
KEY = "sekrit-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def error_shape(body, ollama=False):
    if ollama:
        return isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]
    e = isinstance(body, dict) and body.get("error")
    return isinstance(e, dict) and e.get("message") and e.get("type") and "code" in e


def expect(srv, status, method, path, body=None, raw=None, headers=None, what="", code=None,
           ollama=False):
    h = dict(AUTH)
    h.update(headers or {})
    st, hd, data = srv.request(method, path, body=body, raw=raw, headers=h)
    ok = check(st == status, f"{what or path}: status {st}, expected {status}: {str(data)[:200]}")
    if status >= 400:
        ok &= bool(check(error_shape(data, ollama), f"{what}: not an error object: {str(data)[:200]}"))
        if code and isinstance(data, dict) and isinstance(data.get("error"), dict):
            ok &= check(data["error"].get("code") == code, f"{what}: code {data['error'].get('code')}")
    return st, hd, data


def stream_client(port, body, n_chunks, out):
    """a client process that reads n_chunks of a stream and then waits to be killed"""
    code = f"""
import http.client, json, sys, time
c = http.client.HTTPConnection("127.0.0.1", {port})
c.request("POST", "/v1/chat/completions", body={json.dumps(json.dumps(body))},
          headers={{"Authorization": "Bearer {KEY}", "Content-Type": "application/json"}})
r = c.getresponse()
n = 0
while n < {n_chunks}:
    line = r.fp.readline()
    if line.startswith(b"data: "):
        n += 1
print("READY", flush=True)
time.sleep(600)
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=out)


def wait_metric(srv, name, value, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m, _ = srv.metrics(headers=AUTH)
        if m.get(name, 0) == value:
            return True
        time.sleep(0.1)
    return False


long_chat = {"messages": [{"role": "user", "content": "Count to a thousand."}], "stream": True,
             "max_tokens": 200, "ignore_eos": True, "temperature": 0}
hello = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}

srv = su.Server(TERRACE, MODEL, "-np", "1", "-c", "256", "--api-key", KEY, "--body-limit", "64K",
                "--queue", "1")
try:
    # ---- authentication ---------------------------------------------------------------------
    for h, what in (({}, "no key"), ({"Authorization": "Bearer nope"}, "wrong key"),
                    ({"Authorization": "Basic dTpub3Bl"}, "wrong Basic password"),
                    ({"Authorization": "Bearer " + KEY + "x"}, "key with a suffix")):
        st, hd, data = srv.request("GET", "/v1/models", headers=h)
        check(st == 401 and error_shape(data) and data["error"]["code"] == "invalid_api_key",
              f"{what}: {st} {data}")
    st, _, data = srv.request("POST", "/v1/chat/completions", body=hello)
    check(st == 401, f"chat without a key: {st}")
    st, _, data = srv.request("GET", "/metrics")
    check(st == 401, f"/metrics without a key: {st}")
    st, hd, _ = srv.request("GET", "/")
    check(st == 401 and "Basic" in hd.get("WWW-Authenticate", ""), f"page without a key: {st} {hd}")
    check(srv.request("GET", "/health")[0] == 200, "/health needs no key")
    import base64
    basic = {"Authorization": "Basic " + base64.b64encode(f"user:{KEY}".encode()).decode()}
    check(srv.request("GET", "/v1/models", headers=basic)[0] == 200, "Basic with the key")

    # ---- routes, methods, sizes ------------------------------------------------------------------
    expect(srv, 404, "GET", "/v2/nothing", what="unknown route")
    expect(srv, 405, "GET", "/v1/chat/completions", what="GET on a POST route")
    expect(srv, 405, "POST", "/v1/models", body={}, what="POST on a GET route")
    big = {"messages": [{"role": "user", "content": "x" * 70000}]}
    expect(srv, 413, "POST", "/v1/chat/completions", body=big, what="70 KB body", code="request_too_large")
    # chunked, no Content-Length: the limit holds as the body arrives
    c = srv.conn()
    c.putrequest("POST", "/v1/chat/completions")
    c.putheader("Authorization", AUTH["Authorization"])
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    payload = json.dumps(big).encode()
    for i in range(0, len(payload), 8192):
        part = payload[i:i + 8192]
        c.send(b"%x\r\n%s\r\n" % (len(part), part))
    c.send(b"0\r\n\r\n")
    r = c.getresponse()
    check(r.status == 413, f"chunked 70 KB body: {r.status}")
    r.read()
    c.close()

    # ---- malformed bodies and wrong values: 400 with the field named --------------------------
    msg = [{"role": "user", "content": "Hi"}]
    bad = [
        ("not JSON", b"{", None),
        ("empty body", b"", None),
        ("a JSON array", b"[]", None),
        ("JSON null", b"null", None),
        ("truncated", b'{"messages": [{"role": "user", "content": "Hi"', None),
        ("deep nesting", b"[" * 5000 + b"]" * 5000, None),
        ("NUL escape", b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}', None),
        ("messages not an array", {"messages": 5}, "messages"),
        ("no messages", {"temperature": 0}, "messages"),
        ("empty messages", {"messages": []}, "messages"),
        ("unknown role", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages"),
        ("role not a string", {"messages": [{"role": 7, "content": "Hi"}]}, "role"),
        ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages"),
        ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
        ("temperature a string", {"messages": msg, "temperature": "hot"}, "temperature"),
        ("temperature negative", {"messages": msg, "temperature": -1}, "temperature"),
        ("max_tokens huge", {"messages": msg, "max_tokens": 1e30}, "max_tokens"),
        ("max_tokens fractional", {"messages": msg, "max_tokens": 1.5}, "max_tokens"),
        ("max_tokens negative", {"messages": msg, "max_tokens": -5}, "max_tokens"),
        ("max_tokens a string", {"messages": msg, "max_tokens": "10"}, "max_tokens"),
        ("top_p above 1", {"messages": msg, "top_p": 2}, "top_p"),
        ("top_k huge", {"messages": msg, "top_k": 1e12}, "top_k"),
        ("seed huge", {"messages": msg, "seed": 1e300}, "seed"),
        ("n = 2", {"messages": msg, "n": 2}, "n"),
        ("stream a string", {"messages": msg, "stream": "yes"}, "stream"),
        ("stop a number", {"messages": msg, "stop": 1}, "stop"),
        ("stop list with a number", {"messages": msg, "stop": ["a", 1]}, "stop"),
        ("empty stop", {"messages": msg, "stop": ""}, "stop"),
        ("too many stops", {"messages": msg, "stop": [str(i) for i in range(40)]}, "stop"),
        ("logprobs", {"messages": msg, "logprobs": True}, "logprobs"),
        ("a tool without a name", {"messages": msg, "tools": [{"type": "function", "function": {}}]}, "tools"),
        ("tools not a list", {"messages": msg, "tools": {"name": "f"}}, "tools"),
        ("tool_choice required", {"messages": msg, "tools": [{"type": "function", "function": {"name": "f"}}],
                                  "tool_choice": "required"}, "tool_choice"),
        ("json mode", {"messages": msg, "response_format": {"type": "json_object"}}, "response_format"),
        ("stream_options a list", {"messages": msg, "stream_options": []}, "stream_options"),
        ("model a number", {"messages": msg, "model": 123}, "model"),
        ("presence_penalty huge", {"messages": msg, "presence_penalty": 1e9}, "presence_penalty"),
    ]
    for what, body, param in bad:
        raw = body if isinstance(body, bytes) else None
        st, _, data = expect(srv, 400, "POST", "/v1/chat/completions",
                             body=None if raw is not None else body, raw=raw, what=what,
                             headers={"Content-Type": "application/json"})
        if param and isinstance(data, dict) and isinstance(data.get("error"), dict):
            check(data["error"].get("param") == param or param in data["error"]["message"],
                  f"{what}: the error does not name {param}: {data['error']}")
    for what, body in (("no prompt", {"max_tokens": 2}),
                       ("prompt a number", {"prompt": 5}),
                       ("token id out of range", {"prompt": [1, 10 ** 9]}),
                       ("two prompts", {"prompt": ["a", "b"]}),
                       ("suffix", {"prompt": "a", "suffix": "b"})):
        expect(srv, 400, "POST", "/v1/completions", body=body, what="completions: " + what)
    for what, body in (("options a string", {"messages": msg, "options": "x"}),
                       ("num_predict a string", {"messages": msg, "options": {"num_predict": "5"}}),
                       ("format json", {"messages": msg, "format": "json"}),
                       ("images", {"messages": [{"role": "user", "content": "a", "images": ["x"]}]})):
        expect(srv, 400, "POST", "/api/chat", body=body, what="ollama: " + what, ollama=True)
    expect(srv, 400, "POST", "/api/generate", body={"stream": False}, what="ollama: no prompt", ollama=True)
    # an unknown model: 404 model_not_found (and Ollama's shape on /api/chat)
    expect(srv, 404, "POST", "/v1/chat/completions", body={"model": "gpt-9", "messages": msg},
           what="unknown model", code="model_not_found")
    expect(srv, 404, "POST", "/api/chat", body={"model": "llama9:70b", "messages": msg},
           what="ollama unknown model", ollama=True)
    # beyond the context (-c 256)
    expect(srv, 400, "POST", "/v1/completions", body={"prompt": "word " * 400, "max_tokens": 1},
           what="prompt longer than the context", code="context_length_exceeded")
    expect(srv, 400, "POST", "/v1/chat/completions", body={"messages": msg, "max_tokens": 255},
           what="prompt + max_tokens beyond the context", code="context_length_exceeded")
    # bytes that are not UTF-8 are text like any other: an answer, valid JSON
    st, _, data = srv.request("POST", "/v1/completions", raw=b'{"prompt": "caf\xe9 \xff\xfe", "max_tokens": 3}',
                              headers=AUTH)
    check(st == 200 and isinstance(data, dict) and data["usage"]["completion_tokens"] == 3,
          f"invalid UTF-8 prompt: {st} {data}")
    print(f"  {len(bad) + 14} malformed or refused requests: the right status and error object")

    # ---- a client killed mid-stream frees its slot ---------------------------------------------
    m0, _ = srv.metrics(headers=AUTH)
    p = stream_client(srv.port, long_chat, 3, subprocess.PIPE)
    check(p.stdout.readline().strip() == b"READY", "the streaming client started")
    p.kill()
    p.wait()
    check(wait_metric(srv, 'requests_finished_total{reason="cancelled"}',
                      m0['requests_finished_total{reason="cancelled"}'] + 1), "cancel counted")
    check(wait_metric(srv, "slots_busy", 0), "the slot was freed")
    st, _, data = srv.request("POST", "/v1/chat/completions", body=hello, headers=AUTH)
    check(st == 200 and data["usage"]["completion_tokens"] > 0, f"after the kill: {st} {data}")
    print("  a client killed mid-stream: cancelled at the next step, its slot served the next request")

    # ---- a full queue: 503 ---------------------------------------------------------------------
    p = stream_client(srv.port, long_chat, 2, subprocess.PIPE)  # holds the only slot
    check(p.stdout.readline().strip() == b"READY", "the streaming client started")
    queued = {}
    t = threading.Thread(target=lambda: queued.update(r=srv.request("POST", "/v1/chat/completions",
                                                                    body=hello, headers=AUTH)))
    t.start()
    check(wait_metric(srv, "queue_length", 1), "the second request waits in the queue")
    st, _, data = expect(srv, 503, "POST", "/v1/chat/completions", body=hello, what="queue full")
    check(st != 503 or "queue" in data["error"]["message"], f"503 message: {data}")
    p.kill()
    p.wait()
    t.join()
    check(queued["r"][0] == 200, f"the queued request, once the slot was free: {queued['r'][:2]}")
    print("  queue full: 503; the queued request ran once the slot was freed")
    check(srv.request("GET", "/health")[0] == 200, "still healthy")
finally:
    rc = srv.stop()
check(rc == 0, f"the server exited with {rc}:\n{srv.output()[-3000:]}")

# ---- SIGTERM during two streams ------------------------------------------------------------------
srv = su.Server(TERRACE, MODEL, "-np", "2", "-c", "256")
try:
    results = [None, None]
    ready = threading.Barrier(3)

    def streamer(i):
        c = srv.conn()
        c.request("POST", "/v1/chat/completions", body=json.dumps(long_chat),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events, n = [], 0
        it = su.sse_events(r)
        for ev in it:
            events.append(ev)
            n += 1
            if n == 3:
                ready.wait()
        results[i] = events

    th = [threading.Thread(target=streamer, args=(i,)) for i in range(2)]
    for t in th:
        t.start()
    ready.wait()
    srv.p.send_signal(signal.SIGTERM)
    for t in th:
        t.join(120)
    for i, ev in enumerate(results):
        ok = ev and ev[-1] == "[DONE]"
        check(ok, f"stream {i} did not end with [DONE]: {ev[-2:] if ev else ev}")
        if ok:
            last = json.loads(ev[-2])
            check(last["choices"][0]["finish_reason"] == "length",
                  f"stream {i}: final chunk {last}")
            n_tok = sum(1 for e in ev[:-1] if json.loads(e)["choices"][0]["delta"].get("content"))
            check(n_tok < 200, f"stream {i} ran to its end ({n_tok} tokens) instead of being cut")
    rc = srv.p.wait(timeout=60)
    check(rc == 0, f"exit status {rc} after SIGTERM:\n{srv.output()[-3000:]}")
    try:
        srv.conn(timeout=5).request("GET", "/health")
        check(False, "a connection after the shutdown was accepted")
    except OSError:
        pass
    print("  SIGTERM during 2 streams: both got a final chunk and [DONE]; exit 0")
finally:
    srv.stop(signal.SIGKILL)
su.done("test_serve_faults")
