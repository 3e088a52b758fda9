# terrace — build, test, demo, benchmarks.
#   make            library + CLI (build/terrace, build/libterrace.a)
#   make test       install what is missing, build, run every test (the CI command)
#   make demo       install what is missing, build, run the main job on the default model
#   make bench-kernels   matvec bandwidth table (not part of make test)
#   make bench-expert    a GimmeMoE-shaped expert FFN with every kernel family
#   make fuzz       run each fuzzer (FUZZ=gguf|tokenizer|model, default all) for FUZZ_SECONDS (300)
#   make fuzz-jinja run the chat-template engine's fuzzer for FUZZ_SECONDS

CC      ?= cc
ARCH    := $(shell $(CC) -dumpmachine | cut -d- -f1)
BUILD   ?= build
PY      := .venv/bin/python3

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
           -Wvla -Wformat=2
# -ffp-contract=off: no silent FMA contraction, so scalar kernels are bit-exact with ggml's
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -ffp-contract=off -fno-math-errno $(INC) $(WARN)
# the library, its tests and benchmarks see src/; tools/ see the public headers only (the CLI is
# the API's first user)
INC = -Iinclude -Isrc
TOOLS_INC = -Iinclude
OPT     ?= -O2 -g
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(OPT) $(CFLAGS) $(if $(WERROR),-Werror)
LDLIBS  := -lpcre2-8 -lxxhash -lcjson -lpthread -lm
CLI_LIBS := -lmicrohttpd

LIB_SRC := $(wildcard src/core/*.c src/gguf/*.c src/tensor/*.c src/text/*.c src/model/*.c src/experts/*.c src/kv/*.c)
X86_SRC := src/tensor/x86/kernels_avx2.c src/tensor/x86/kernels_avx512.c src/tensor/x86/hash_avx2.c
ARM_SRC := src/tensor/arm/kernels_neon.c src/tensor/arm/kernels_dotprod.c src/tensor/arm/kernels_i8mm.c
CLI_SRC := $(wildcard tools/*.c)

ifeq ($(ARCH),x86_64)
LIB_SRC += $(X86_SRC)
endif
ifeq ($(ARCH),aarch64)
LIB_SRC += $(ARM_SRC)
endif

# per-file ISA flags: only these files may contain instructions beyond the baseline
FLAGS_src/tensor/x86/kernels_avx2.c   := -mavx2 -mfma -mf16c
FLAGS_src/tensor/x86/hash_avx2.c      := -mavx2
FLAGS_src/tensor/x86/kernels_avx512.c := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl \
                                         -mavx512dq -mavx512vnni
# (the neon family is the AArch64 baseline)
FLAGS_src/tensor/arm/kernels_dotprod.c := -march=armv8.2-a+dotprod
FLAGS_src/tensor/arm/kernels_i8mm.c    := -march=armv8.2-a+dotprod+i8mm

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
$(CLI_OBJ): INC = $(TOOLS_INC) $(INC_$<)
# one set of library objects serves libterrace.a and libterrace.so: position-independent, and
# every symbol hidden unless include/terrace.h marks it TR_API
$(LIB_OBJ): LIB_CFLAGS := -fPIC -fvisibility=hidden

# the version and the soname's major number come from the header
VERSION := $(shell sed -n 's/^\#define TR_VERSION_STRING "\(.*\)"/\1/p' include/terrace.h)
MAJOR   := $(shell sed -n 's/^\#define TR_VERSION_MAJOR \([0-9]*\)/\1/p' include/terrace.h)
SONAME  := libterrace.so.$(MAJOR)

.PHONY: all test demo deps clean install uninstall peer parity bench bench-moe bench-serve bench-kv \
        bench-kv-quality bench-long bench-plan bench-replay bench-kernels cross-aarch64 aarch64 bench-expert bench-aarch64-emulated fuzz fuzz-build fuzz-jinja format

all: $(BUILD)/terrace $(BUILD)/terrace-storaged $(BUILD)/$(SONAME)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LIB_CFLAGS) $(FLAGS_$<) -MMD -MP -c $< -o $@

$(BUILD)/libterrace.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the shared library: libterrace.so.<version>, its soname libterrace.so.<major> and the link-time
# name libterrace.so as symlinks; --no-undefined so a missing library shows here, not in an app
$(BUILD)/libterrace.so.$(VERSION): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined -o $@ $^ $(LDLIBS)

$(BUILD)/$(SONAME): $(BUILD)/libterrace.so.$(VERSION)
	ln -sf libterrace.so.$(VERSION) $@
	ln -sf $(SONAME) $(BUILD)/libterrace.so

# the live page is assembled into the server (.incbin), so the object depends on the HTML
$(BUILD)/tools/serve_page.o: tools/serve_page.html

$(BUILD)/terrace: $(CLI_OBJ) $(BUILD)/libterrace.a
	$(CC) $(ALL_CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libterrace.a $(CLI_LIBS) $(LDLIBS)

# the KV cache's storage agent, a process of its own (src/kv/csd.h)
$(BUILD)/terrace-storaged: $(BUILD)/src/agent/storaged.o $(BUILD)/libterrace.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libterrace.a $(LDLIBS)

# ---- install ------------------------------------------------------------------------------------
# make install PREFIX=/usr/local DESTDIR=/tmp/stage  (uninstall takes the same variables)
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
DOCDIR     ?= $(PREFIX)/share/doc/terrace
PCDIR      ?= $(LIBDIR)/pkgconfig
# paths under the prefix are written relative to it, so pkg-config --define-prefix can move them
pcpath = $(patsubst $(PREFIX)%,$${prefix}%,$(1))

$(BUILD)/terrace.pc: Makefile include/terrace.h
	@mkdir -p $(dir $@)
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call pcpath,$(LIBDIR))' \
	    'includedir=$(call pcpath,$(INCLUDEDIR))' '' 'Name: terrace' \
	    'Description: run GGUF language models on machines whose memory is smaller than the model' \
	    'Version: $(VERSION)' 'Libs: -L$${libdir} -lterrace' 'Libs.private: $(LDLIBS)' \
	    'Cflags: -I$${includedir}' >$@

$(BUILD)/terrace.1: man/terrace.1 include/terrace.h
	@mkdir -p $(dir $@)
	sed 's/@VERSION@/$(VERSION)/' $< >$@

install: all $(BUILD)/libterrace.a $(BUILD)/terrace.pc $(BUILD)/terrace.1
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(PCDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DOCDIR)
	install -m 755 $(BUILD)/terrace $(BUILD)/terrace-storaged $(DESTDIR)$(BINDIR)/
	install -m 755 $(BUILD)/libterrace.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libterrace.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libterrace.so
	install -m 644 $(BUILD)/libterrace.a $(DESTDIR)$(LIBDIR)/
	install -m 644 include/terrace.h include/terrace_replay.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(BUILD)/terrace.pc $(DESTDIR)$(PCDIR)/
	install -m 644 $(BUILD)/terrace.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 644 LICENSE README.md $(DESTDIR)$(DOCDIR)/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/terrace $(DESTDIR)$(BINDIR)/terrace-storaged \
	    $(DESTDIR)$(LIBDIR)/libterrace.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	    $(DESTDIR)$(LIBDIR)/libterrace.so $(DESTDIR)$(LIBDIR)/libterrace.a \
	    $(DESTDIR)$(INCLUDEDIR)/terrace.h $(DESTDIR)$(INCLUDEDIR)/terrace_replay.h \
	    $(DESTDIR)$(PCDIR)/terrace.pc \
	    $(DESTDIR)$(MANDIR)/man1/terrace.1 $(DESTDIR)$(DOCDIR)/LICENSE $(DESTDIR)$(DOCDIR)/README.md
	-rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null

# ---- tests --------------------------------------------------------------------------------------
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

KV_TESTS := test_kv_store test_kv_attend test_kv_select test_kv_tiered test_kv_agent

$(BUILD)/tests/%: tests/%.c tests/testutil.h tests/kv_test.h $(BUILD)/libterrace.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< $(BUILD)/libterrace.a $(LDLIBS)

deps:
	@bash scripts/deps.sh

# make test's builds compile on every CPU (JOBS, default: all of them) unless make was given -jN,
# whose jobserver the sub-makes share instead; tests/run.sh builds the fuzzers with JOBS too
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
TEST_J = $(if $(findstring --jobserver,$(MAKEFLAGS)),,-j$(JOBS))

test: deps
	@$(MAKE) $(TEST_J) --no-print-directory WERROR=1 all $(TEST_BIN)
	@$(MAKE) $(TEST_J) --no-print-directory WERROR=1 BUILD=build/asan \
	    OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    build/asan/terrace build/asan/terrace-storaged $(TEST_BIN:build/%=build/asan/%)
	@$(MAKE) $(TEST_J) --no-print-directory WERROR=1 BUILD=build/tsan OPT="-O1 -g -fsanitize=thread" \
	    build/tsan/tests/test_moe build/tsan/tests/test_pool build/tsan/tests/test_expert_cache \
	    $(addprefix build/tsan/tests/,$(KV_TESTS)) build/tsan/terrace-storaged build/tsan/terrace
	@$(MAKE) $(TEST_J) --no-print-directory aarch64
	@JOBS=$(JOBS) bash tests/run.sh

demo: deps all
	@bash scripts/demo.sh

# llama.cpp, the peer (PyPI llama-cpp-python built from source into .venv-peer)
peer:
	@bash scripts/peer.sh

# re-record llama.cpp's reference outputs and compare live (make test compares the stored ones)
parity: deps all peer
	$(PY) tests/py/parity.py record build/terrace tests/ref/parity-synth.json
	$(PY) tests/py/parity_real.py record build/terrace tests/ref/parity-real.json smollm2 gemma3

# terrace vs llama.cpp speed, same files and prompts, one run (results: bench/results/dense.md)
bench: deps all peer
	@bash bench/bench_dense.sh

# a MoE model bigger than memory, in a capped cgroup (root; results: bench/results/moe.md)
bench-moe: deps all peer
	@bash bench/bench_moe.sh

# terrace serve vs llama.cpp's server (llama-cpp-python[server]) at 1, 4, 8, 16 streams, the default
# model and the 1 GiB MoE in a capped cgroup (root; results: bench/results/serve.md)
bench-serve: deps all peer
	@.venv/bin/python3 bench/bench_serve.py

# KV decode step, offload vs tiered (and h2o, quest), 7B-like attention, most KV on disk, in a
# capped cgroup (root). KV_SCENARIOS: bench/bench_kv.sh's scenarios (main, agent, spec, tail-cost,
# beta, persist, batch, paired); results: bench/results/kv-<scenarios>.md, findings in kv.md
KV_SCENARIOS ?= main
bench-kv: deps all $(BUILD)/bench/bench_kv
	@.venv/bin/pip install -q --disable-pip-version-check matplotlib
	@bash bench/bench_kv.sh $(KV_SCENARIOS)

# KV-cache policies' quality against the full cache (results: bench/results/kv-quality.md + PNGs)
# the user's long-context path: prefill + 128 decoded tokens per KV policy, and the memory plan
# against the peak RSS (results: bench/results/long.md)
bench-long: deps all
	.venv/bin/python3 bench/bench_long.py smollm2-8k qwen2-16k qwen2-32k
bench-plan: deps all
	.venv/bin/python3 bench/plan_rss.py --qwen2

bench-kv-quality: deps all
	@.venv/bin/pip install -q --disable-pip-version-check matplotlib
	.venv/bin/python3 bench/kv_quality.py smollm2 qwen2

# expert-cache policies on the shared Qwen3-30B routing trace (results: bench/results/replay.md)
bench-replay: all
	./build/terrace replay ../shared/testdata/routes/qwen3-30b-a3b.route.csv

# the library, CLI, storage agent and every C test cross-built for aarch64 with the Arm kernels;
# tests/run.sh runs them under qemu-user (tests/run_aarch64.sh)
AARCH64_CC ?= aarch64-linux-gnu-gcc
aarch64:
	@if command -v $(AARCH64_CC) >/dev/null; then \
	    $(MAKE) --no-print-directory CC=$(AARCH64_CC) BUILD=build/aarch64 WERROR=1 \
	        build/aarch64/terrace build/aarch64/terrace-storaged $(TEST_BIN:build/%=build/aarch64/%); \
	else echo "aarch64: SKIPPED ($(AARCH64_CC) not installed)"; fi

# every source file must compile for aarch64 (no x86 intrinsics leak into the generic code)
cross-aarch64:
	@if command -v aarch64-linux-gnu-gcc >/dev/null; then \
	    for f in $(wildcard src/*/*.c src/*/*/*.c tools/*.c); do \
	        case $$f in src/tensor/arm/kernels_dotprod.c) fl="$(FLAGS_src/tensor/arm/kernels_dotprod.c)";; \
	            src/tensor/arm/kernels_i8mm.c) fl="$(FLAGS_src/tensor/arm/kernels_i8mm.c)";; *) fl="";; esac; \
	        aarch64-linux-gnu-gcc $(CFLAGS_BASE) $$fl -O2 -Werror -c $$f -o /dev/null || exit 1; \
	    done; echo "cross-aarch64: every source file compiles for aarch64"; \
	else echo "cross-aarch64: SKIPPED (aarch64-linux-gnu-gcc not installed)"; fi

bench-kernels: deps all $(BUILD)/bench/bench_kernels
	@$(BUILD)/bench/bench_kernels $(BENCH_ARGS)

# prefill products per type, gemm against the per-row kernels, one thread (BENCH_ARGS: --isa ...)
bench-gemm: deps all $(BUILD)/bench/bench_gemm
	@$(BUILD)/bench/bench_gemm $(BENCH_ARGS)

# a GimmeMoE-shaped expert FFN (2048 -> 768 -> 2048, INT8 = Q8_0 and Q4_K) with every kernel
# family this CPU runs, one thread (results: bench/results/arm.md)
bench-expert: deps all $(BUILD)/bench/bench_expert
	@$(BUILD)/bench/bench_expert $(BENCH_ARGS)

# both benchmarks cross-built for aarch64 and run under qemu-user at -cpu max, small: they show
# that the Arm builds run; their timings under emulation mean nothing (bench/results/arm.md)
bench-aarch64-emulated: deps
	@$(MAKE) --no-print-directory CC=$(AARCH64_CC) BUILD=build/aarch64 \
	    build/aarch64/bench/bench_kernels build/aarch64/bench/bench_expert
	QEMU_CPU=max qemu-aarch64-static build/aarch64/bench/bench_kernels --gib 0.05 --reps 1 \
	    --threads 1 --types Q8_0,Q4_K,Q6_K
	QEMU_CPU=max qemu-aarch64-static build/aarch64/bench/bench_expert --reps 20

# benchmarks see the public header and the test seam only (include/terrace_seam.h); private: the
# library objects it depends on keep their own include path
$(BUILD)/bench/%: private INC = -Iinclude
$(BUILD)/bench/%: bench/%.c $(BUILD)/libterrace.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -O3 -o $@ $< $(BUILD)/libterrace.a $(LDLIBS)

# ---- fuzzing (clang + libFuzzer) ----------------------------------------------------------------
FUZZ_SECONDS ?= 300
FUZZ_CFLAGS := $(CFLAGS_BASE) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
               -fno-omit-frame-pointer

# the reader and what it links against; no SIMD files (nothing of theirs is reachable from it)
FUZZ_SRC := src/gguf/gguf.c src/core/error.c src/core/mapguard.c src/tensor/types.c src/tensor/dequant.c \
            src/tensor/quantize.c src/tensor/vecdot_ref.c

build/fuzz/fuzz_gguf: fuzz/fuzz_gguf.c $(FUZZ_SRC) $(wildcard src/*/*.h include/*.h)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ fuzz/fuzz_gguf.c $(FUZZ_SRC) $(LDLIBS)

# the tokenizer and model-loader targets link the whole library, built by clang with the
# sanitizers and libFuzzer's coverage (SIMD files included: the model target runs the kernels)
FUZZ_LIB := build/fuzzlib/libterrace.a
.PHONY: fuzz-lib
fuzz-lib:
	@$(MAKE) --no-print-directory CC=clang BUILD=build/fuzzlib \
	    OPT="-O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" $(FUZZ_LIB)
# but the x86 kernel files without coverage or sanitizers: instrumenting their intrinsics takes
# clang minutes (kernels_avx512.c: ~470 s of CPU, ~15 s plain) and the fuzzers explore the code
# that calls them, not their loops. Their memory accesses are checked in build/asan (test_kernels
# against the scalar reference over ragged lengths, the models' tests), and make test replays the
# model corpus at TERRACE_ISA=scalar too, where every kernel the fuzzer reaches is instrumented
# (TERRACE_ISA=scalar make fuzz FUZZ=model fuzzes that way)
ifeq ($(BUILD),build/fuzzlib)
$(X86_SRC:%.c=$(BUILD)/%.o): override OPT := -O1 -g
endif

# the template engine and the reasoning splitter, nothing else
FUZZ_JINJA_SRC := $(wildcard src/text/jinja_*.c) src/text/reasoning.c src/core/error.c

build/fuzz/fuzz_jinja: fuzz/fuzz_jinja.c $(FUZZ_JINJA_SRC) $(wildcard src/*/*.h include/*.h)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ fuzz/fuzz_jinja.c $(FUZZ_JINJA_SRC) -lm

build/fuzz/fuzz_tokenizer build/fuzz/fuzz_model: build/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/gguf_writer.h fuzz-lib
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Ifuzz -o $@ $< $(FUZZ_LIB) $(LDLIBS)

FUZZ_TARGETS := gguf tokenizer model
FUZZ ?= $(FUZZ_TARGETS)
fuzz-build: $(FUZZ_TARGETS:%=build/fuzz/fuzz_%) build/fuzz/fuzz_jinja

# new inputs go to build/fuzz/corpus-*, beside the committed corpus each target replays in make test
# (fuzz/corpus for gguf, which predates the naming, fuzz/corpus-T for the others); merge the interesting ones into the committed corpus with
# `build/fuzz/fuzz_T -merge=1 CORPUS build/fuzz/corpus-T`. The tokenizer target also reads the
# shared test vocabularies when they are there.
fuzz: deps $(FUZZ:%=build/fuzz/fuzz_%)
	@for t in $(FUZZ); do \
	    c=$$(case $$t in gguf) echo fuzz/corpus;; *) echo fuzz/corpus-$$t;; esac); \
	    mkdir -p build/fuzz/corpus-$$t $$c; \
	    echo "=== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    TERRACE_FUZZ_VOCAB=$${TERRACE_FUZZ_VOCAB:-../shared/testdata/vocab} \
	    build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
	        -print_final_stats=1 build/fuzz/corpus-$$t $$c || exit 1; \
	done

# new inputs go to fuzz/corpus-jinja; the shared chat templates seed it (read only)
fuzz-jinja: deps build/fuzz/fuzz_jinja
	@mkdir -p fuzz/corpus-jinja
	build/fuzz/fuzz_jinja -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 \
	    -dict=fuzz/jinja.dict fuzz/corpus-jinja $(wildcard ../shared/testdata/templates)

format:
	clang-format -i $(wildcard include/*.h src/*/*.[ch] src/*/*/*.[ch] tools/*.[ch] tests/*.[ch] bench/*.c fuzz/*.c)

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
