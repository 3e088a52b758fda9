# The aarch64 build (make aarch64) under user-mode emulation, sourced by tests/run.sh (its run/skip
# helpers, $TMP, $PY and the synthetic models it generated). qemu-user takes the CPU model from
# QEMU_CPU and passes it to every process it starts; the Arm kernel family follows from the
# AT_HWCAP bits that CPU model reports:
#   cortex-a53 (ARMv8.0: no dotprod)  -> neon
#   cortex-a76 (dotprod, no i8mm)     -> dotprod
#   max        (dotprod and i8mm)     -> i8mm
# The kernel tests run at all three; the rest of the suite once, at -cpu max. Timings under
# emulation mean nothing (no test asserts on time).
#
# A process started by an emulated one is started by the host kernel, which cannot run an aarch64
# binary: the CLI and the storage agent are reached through wrapper scripts that start the
# emulator, and TERRACE_STORAGED names the agent's wrapper for the runtime (and the KV tests).

ARM=build/aarch64
QEMU=qemu-aarch64-static
if [ ! -x "$ARM/terrace" ] || ! command -v "$QEMU" >/dev/null; then
    why="no $ARM build (aarch64-linux-gnu-gcc) or no $QEMU (qemu-user-static)"
    if [ "${CI:-}" = "true" ]; then
        echo "=== aarch64 under emulation: FAIL: $why and CI=true"
        RESULTS+=("FAIL     aarch64 under emulation ($why)")
        FAILED=1
    else
        skip "aarch64 under emulation" "$why"
    fi
else
    ARM_BIN="$TMP/aarch64-bin"
    mkdir -p "$ARM_BIN"
    for b in terrace terrace-storaged; do
        printf '#!/bin/sh\nexec %s %s "$@"\n' "$QEMU" "$PWD/$ARM/$b" >"$ARM_BIN/$b"
        chmod +x "$ARM_BIN/$b"
    done
    arm() { # arm CPU_MODEL COMMAND...: the command with the emulator's CPU model and agent set
        local cpu=$1
        shift
        env QEMU_CPU="$cpu" TERRACE_STORAGED="$ARM_BIN/terrace-storaged" "$@"
    }
    arm_test() { # arm_test CPU_MODEL TEST_BINARY ARGS...: an aarch64 binary under the emulator
        local cpu=$1
        shift
        arm "$cpu" "$QEMU" "$@"
    }
    arm_t0=$SECONDS

    # the family each CPU model gets, lowered by TERRACE_ISA, named by `terrace --version`
    arm_dispatch() {
        local ok=0 cpu want got
        for pair in cortex-a53:neon cortex-a76:dotprod neoverse-n1:dotprod max:i8mm; do
            cpu=${pair%%:*} want=${pair#*:}
            got=$(arm "$cpu" "$ARM_BIN/terrace" --version)
            echo "  -cpu $cpu: $got"
            [[ $got == *"(kernels: $want)" ]] || { echo "  want kernels: $want"; ok=1; }
        done
        for want in dotprod neon scalar; do
            got=$(TERRACE_ISA=$want arm max "$ARM_BIN/terrace" --version)
            echo "  -cpu max, TERRACE_ISA=$want: $got"
            [[ $got == *"(kernels: $want)" ]] || { echo "  want kernels: $want"; ok=1; }
        done
        got=$(TERRACE_ISA=i8mm arm cortex-a53 "$ARM_BIN/terrace" --version) # never raised
        echo "  -cpu cortex-a53, TERRACE_ISA=i8mm: $got"
        [[ $got == *"(kernels: neon)" ]] || ok=1
        return $ok
    }
    run "aarch64: kernel family per CPU model, TERRACE_ISA, --version" arm_dispatch

    # each Arm family against the scalar reference (as on x86), at the CPU model it is chosen on
    for pair in cortex-a53:neon cortex-a76:dotprod max:i8mm; do
        run "test_kernels ${pair#*:} [aarch64 -cpu ${pair%%:*}]" \
            arm_test "${pair%%:*}" "$ARM/tests/test_kernels" "${pair#*:}"
    done

    # the suite at -cpu max (family i8mm: dotprod kernels for one activation row, SMMLA for more)
    run "test_pool [aarch64]" arm_test max "$ARM/tests/test_pool"
    run "test_dequant [aarch64]" arm_test max "$ARM/tests/test_dequant" "$TMP/dequant.gguf"
    run "test_model qwen3 [aarch64]" arm_test max "$ARM/tests/test_model" "$TMP/synth-qwen3.gguf"
    run "test_model gemma3 (sliding window) [aarch64]" arm_test max "$ARM/tests/test_model" \
        "$TMP/synth-gemma3.gguf"
    run "test_moe qwen2moe [aarch64]" arm_test max "$ARM/tests/test_moe" "$TMP/synth-qwen2moe.gguf"
    run "test_expert_cache [aarch64]" arm_test max "$ARM/tests/test_expert_cache"
    run "test_tokenizer (synthetic vocabularies) [aarch64]" arm_test max "$ARM/tests/test_tokenizer"
    # no kernel of their own, but char is unsigned on AArch64 and long double is 128-bit: the
    # sampler, the chat formats, the template engine, GGUF data access, the public API, the expert
    # policies
    run "test_sample [aarch64]" arm_test max "$ARM/tests/test_sample"
    run "test_chat [aarch64]" arm_test max "$ARM/tests/test_chat"
    run "test_jinja [aarch64]" arm_test max "$ARM/tests/test_jinja"
    run "test_gguf (data access) [aarch64]" arm_test max "$ARM/tests/test_gguf" "$TMP/dequant.gguf"
    run "test_api (public text API) [aarch64]" arm_test max "$ARM/tests/test_api" \
        "$TMP/synth-qwen3.gguf"
    if [ -f "$TESTDATA/routes/qwen3-30b-a3b.route.csv" ]; then
        run "test_policy [aarch64]" arm_test max "$ARM/tests/test_policy" \
            "$TESTDATA/routes/qwen3-30b-a3b.route.csv"
    else
        skip "test_policy [aarch64]" "$TESTDATA not found"
    fi
    # the KV cache's tests that reach the Arm kernels: attention (F16 dot, axpy_f16), selection
    # and recall through the INT8/INT4 scoring copies (dot_rows), the tail estimate (axpy_rows),
    # the storage agent's scoring; not the placement, key-ring, speculation and rate-measurement
    # tests (test_kv_tiered: minutes under emulation, no kernel of their own)
    for t in test_kv_store test_kv_attend test_kv_select test_kv_agent; do
        run "$t [aarch64]" arm_test max "$ARM/tests/$t"
    done
    # llama.cpp's stored logits on the synthetic models of every architecture with Q8_0 weights
    # (the integer kernels and, at 256 tokens in one batch, SMMLA); the float kernels run in
    # test_model's F32 models and every attention's F16 cache
    run "logit parity vs llama.cpp, synthetic models (Q8_0) [aarch64]" \
        arm max $PY tests/py/parity.py check "$ARM_BIN/terrace" tests/ref/parity-synth.json \
        --types Q8_0 --one-batch
    # the default model: greedy `terrace run` against this machine's build and llama.cpp's
    # stored continuation (tokenization included)
    run "terrace run on the default model: emulated = native, = llama.cpp [aarch64]" \
        arm max $PY tests/py/test_emulated_run.py build/terrace "$ARM_BIN/terrace" \
        tests/ref/parity-real.json smollm2 16
    echo "=== aarch64 under emulation: $((SECONDS - arm_t0)) s in all"
fi
