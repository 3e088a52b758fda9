#!/usr/bin/env python3
"""terrace serve's threads under ThreadSanitizer: concurrent streamed and non-streamed requests,
a telemetry stream, /metrics, a client that disconnects mid-stream and a SIGTERM, against the
TSan build; any report fails the test.

usage: test_serve_threads.py TERRACE_TSAN MODEL

MODEL is a small synthetic one (tests/py/synth.py): the threads are what is tested, and the
model's forward pass under TSan would take minutes on a real one.
"""
import json
import sys
import threading
import time

import serve_util as su
from serve_util import check

TERRACE, MODEL = sys.argv[1], sys.argv[2]
srv = su.Server(TERRACE, MODEL, "-np", "4", "-c", "256", "--chat-template", "chatml",
                env={"TSAN_OPTIONS": "halt_on_error=0 second_deadlock_stack=1"})
answers = {}


def ask(i, stream):
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": f"Say the number {i}."}], "max_tokens": 8,
         "temperature": 0, "stream": stream}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    answers[i] = (r.status, r.read())
    c.close()


def telemetry():
    c = srv.conn()
    c.request("GET", "/telemetry")
    r = c.getresponse()
    for k, _ in enumerate(su.sse_events(r)):
        if k >= 3:
            break
    c.close()


try:
    th = [threading.Thread(target=ask, args=(i, i % 2 == 0)) for i in range(6)]
    th.append(threading.Thread(target=telemetry))
    for t in th:
        t.start()
    srv.metrics()
    for t in th:
        t.join()
    check(all(st == 200 for st, _ in answers.values()) and len(answers) == 6,
          f"answers: {[st for st, _ in answers.values()]}")
    # a client that goes away mid-stream
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 100, "stream": True}))
    r = c.getresponse()
    next(su.sse_events(r))
    c.sock.close()
    deadline = time.time() + 60
    while time.time() < deadline and srv.metrics()[0].get("slots_busy", 1) != 0:
        time.sleep(0.1)
    # a stream in flight at SIGTERM
    go = threading.Event()

    def last():
        c2 = srv.conn()
        c2.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Once", "max_tokens": 200, "stream": True, "ignore_eos": True}))
        r2 = c2.getresponse()
        events = su.sse_events(r2)
        next(events)
        go.set()
        tail = list(events)
        check(tail and tail[-1] == "[DONE]", f"the stream cut by SIGTERM ended with {tail[-1:]}")

    t = threading.Thread(target=last)
    t.start()
    go.wait(60)
finally:
    rc = srv.stop()
t.join(60)
out = srv.output()
reports = out.count("WARNING: ThreadSanitizer")
if reports:
    i = out.find("WARNING: ThreadSanitizer")
    print(out[i:i + 4000], file=sys.stderr)
check(reports == 0, f"{reports} ThreadSanitizer reports")
check(rc == 0, f"exit status {rc}")
print(f"  6 requests, telemetry, a disconnect and a SIGTERM under TSan: {reports} reports")
su.done("test_serve_threads")
