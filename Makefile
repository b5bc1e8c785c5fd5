# stheno's build. `make test` is the project's test command (README); the GPU
# targets need the CUDA toolkit (`make cuda-toolkit`, as root).

GO        ?= go
NVCC      ?= nvcc
# The GPU path is behind this build tag. It is not called `cuda`: that tag
# also switches on gorgonia's own CUDA files, which need cuDNN headers and
# link cuBLAS/cuDNN (see README, "GPU build").
CUDA_TAG  := stheno_cuda

# SASS for A100 (sm_80) and Hopper (sm_90), and compute_90 PTX so newer GPUs
# can JIT the kernels. Every nvcc warning is an error. (No -lineinfo: nvcc
# 11.8 segfaults on msdeform.cu with it.)
NVCC_FLAGS := -std=c++17 -O3 --expt-relaxed-constexpr \
	-gencode arch=compute_80,code=sm_80 \
	-gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90 \
	-Werror all-warnings

# Kernels that package ops never chooses sit inside #if
# STHENO_KERNEL_VARIANTS: the shipped modules leave them out, and
# `make kernels VARIANTS=1` builds them in for experiments (the variant
# tests and benchmarks skip without them). The emulator always builds them,
# so their logic stays tested. A change of VARIANTS rebuilds the modules.
VARIANTS   ?= 0
NVCC_FLAGS += -DSTHENO_KERNEL_VARIANTS=$(VARIANTS)
VARIANTS_STAMP := kernels/build/variants-$(VARIANTS).stamp

CU_SOURCES := $(filter-out %_sm90a.cu,$(wildcard kernels/*.cu))
CU_HEADERS := $(wildcard kernels/*.cuh)
# One fatbin (one CUDA module) per .cu file, embedded with go:embed.
FATBINS    := $(CU_SOURCES:kernels/%.cu=kernels/build/%.fatbin)
# Kernels for sm_90a (Hopper's wgmma), which nvcc 11.8's assembler does not
# know: compiled to compute_90 PTX, retargeted to sm_90a (PTX ISA 8.0), and
# compiled by the driver when loaded, on compute capability 9.0 GPUs only.
SM90A_SOURCES := $(wildcard kernels/*_sm90a.cu)
SM90A_PTX     := $(SM90A_SOURCES:kernels/%.cu=kernels/build/%.ptx)
SM90A_FLAGS   := -std=c++17 -O3 --expt-relaxed-constexpr -arch=compute_90 -Werror all-warnings \
	-DSTHENO_KERNEL_VARIANTS=$(VARIANTS)

.PHONY: all test vet emu-test bench demo cuda-toolkit kernels kernels-go kernels-report gpu-vet gpu-bins clean

all: test

## test: vet, check the CUDA kernels in the host emulator, and run the CPU
## test suite (what CI runs).
test: vet emu-test
	$(GO) test ./...

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...

## emu-test: compile the CUDA kernels as plain C++ with kernels/emu/emu.h (a
## host emulator: each CUDA thread a fiber, a block's threads taking turns on
## one OS thread, blocks one after another) and check them against
## double-precision references. Needs only g++ (C++20), no GPU and no CUDA
## toolkit. The conv harness runs twice, with cp.async copies landing as late
## and as early as the PTX allows; the msdeform one also runs its default
## kernels, and the softmax one all of its, under AddressSanitizer, built
## at -O0 (every access checked, and a quarter of -O1 -g's compile time for
## a run of seconds). A harness is rebuilt when emu.h, harness.h (what the
## harnesses share), the Makefile or a file it includes changes (g++ -MMD
## lists those in a .d file beside it).
EMU_CXX   ?= g++
EMU_FLAGS := -std=c++20 -O1 -pthread -Wall -Wno-unknown-pragmas -Wno-maybe-uninitialized -DSTHENO_KERNEL_VARIANTS=1
EMU_DIR   := kernels/build/emu
EMU_DEPS  := kernels/emu/emu.h kernels/emu/harness.h Makefile
# Harnesses run as they are, one per line; conv's and the AddressSanitizer
# builds have runs of their own below.
EMU_HARNESSES := \
	roialign \
	msdeform \
	elementwise \
	softmax \
	layernorm \
	losses \
	layout \
	attention \
	adamw \
	groupnorm \
	pointwise \
	maxpool \
	dropout \
	upsample \
	convtranspose
EMU_BINS  := $(EMU_DIR)/conv_emu_test $(EMU_HARNESSES:%=$(EMU_DIR)/%_emu_test) \
	$(EMU_DIR)/msdeform_emu_test_asan $(EMU_DIR)/softmax_emu_test_asan

emu-test: $(EMU_BINS)
	$(EMU_DIR)/conv_emu_test > $(EMU_DIR)/conv.log || { cat $(EMU_DIR)/conv.log; exit 1; }
	@tail -n 1 $(EMU_DIR)/conv.log
	EMU_CP_EAGER=1 $(EMU_DIR)/conv_emu_test quick > $(EMU_DIR)/conv_eager.log || { cat $(EMU_DIR)/conv_eager.log; exit 1; }
	@tail -n 1 $(EMU_DIR)/conv_eager.log
	@for h in $(EMU_HARNESSES); do \
		echo "$(EMU_DIR)/$${h}_emu_test"; \
		$(EMU_DIR)/$${h}_emu_test > $(EMU_DIR)/$$h.log || { cat $(EMU_DIR)/$$h.log; exit 1; }; \
		tail -n 1 $(EMU_DIR)/$$h.log; \
	done
	$(EMU_DIR)/msdeform_emu_test_asan _c4_rs4_ _red4_rs4_occ3_ _fwd_v16b_ _sort_ > $(EMU_DIR)/msdeform_asan.log 2>&1 || { cat $(EMU_DIR)/msdeform_asan.log; exit 1; }
	@tail -n 1 $(EMU_DIR)/msdeform_asan.log
	$(EMU_DIR)/softmax_emu_test_asan > $(EMU_DIR)/softmax_asan.log 2>&1 || { cat $(EMU_DIR)/softmax_asan.log; exit 1; }
	@tail -n 1 $(EMU_DIR)/softmax_asan.log

$(EMU_DIR)/%_emu_test: kernels/emu/%_emu_test.cpp $(EMU_DIR)/%_emu_test.d $(EMU_DEPS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -MMD -MP -MT $@ -MF $@.d -o $@ $<

$(EMU_DIR)/%_emu_test_asan: kernels/emu/%_emu_test.cpp $(EMU_DIR)/%_emu_test_asan.d $(EMU_DEPS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -O0 -g -fsanitize=address -fno-omit-frame-pointer -MMD -MP -MT $@ -MF $@.d -o $@ $<

# A harness whose .d file is missing is rebuilt: a target without recipe or
# prerequisites counts as new when the file does not exist.
EMU_DEPFILES := $(EMU_BINS:=.d)
$(EMU_DEPFILES):
-include $(wildcard $(EMU_DEPFILES))

## bench: CPU benchmarks: the suite on TARGETS.md's cases (BENCHMARKS.md says
## how to run it on a GPU, and how to size cases with STHENO_BENCH_*), then the
## kernels' own CPU benchmarks.
bench:
	$(GO) test -run '^$$' -bench 'Suite/impl=cpu' -benchtime 3x ./ops/
	$(GO) test -run '^$$' -bench . -benchmem ./kernels/

## demo: train a small graph that uses all three ops and print the loss.
demo:
	$(GO) run ./examples/demo

## cuda-toolkit: install Debian's CUDA 11.8 toolkit (nvcc, cuda.h, libcuda stub). Needs root.
cuda-toolkit:
	sh .ci/install-cuda-toolkit.sh

## kernels: compile kernels/*.cu into the fatbins (and *_sm90a.cu into the
## PTX) embedded by the GPU build.
kernels: $(FATBINS) $(SM90A_PTX)

$(VARIANTS_STAMP):
	@mkdir -p $(dir $@)
	rm -f kernels/build/variants-*.stamp
	touch $@

kernels/build/%.fatbin: kernels/%.cu $(CU_HEADERS) Makefile $(VARIANTS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -fatbin -o $@ $<

# The retargeting must have happened: a PTX file left at sm_90 would fail
# to load with wgmma in it. PTX ISA 8.1 for red.global.v4.f32 (8.0 has
# wgmma); the GPU machine's driver (580) reads up to 9.0.
kernels/build/%_sm90a.ptx: kernels/%_sm90a.cu $(CU_SOURCES) $(CU_HEADERS) Makefile $(VARIANTS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(SM90A_FLAGS) -ptx -o $@.tmp $<
	sed -e 's/^\.target sm_90$$/.target sm_90a/' -e 's/^\.version 7\.[0-9]$$/.version 8.1/' $@.tmp > $@
	grep -q '^\.target sm_90a$$' $@ && grep -q '^\.version [89]\.' $@ || { rm -f $@; echo "$@: not retargeted to sm_90a"; exit 1; }
	rm -f $@.tmp

## kernels-go: regenerate package kernels/cuda (kernels/cuda/kernels_gen.go:
## params structs, kernel names, launchers, constants) and
## kernels/params_gen.cuh (the C++ side's layout asserts) from the kernels'
## declarations, after changing one. kernels/cuda/gen's tests fail while
## they are stale; nvcc and the emulator's g++ fail on a struct that no
## longer matches them.
kernels-go:
	$(GO) run ./kernels/cuda/gen

## kernels-report: registers, shared memory and spills of every kernel.
kernels-report:
	@for f in $(CU_SOURCES); do $(NVCC) $(NVCC_FLAGS) -Xptxas -v -cubin -gencode arch=compute_90,code=sm_90 -o /dev/null $$f; done

## gpu-vet: vet the GPU build (needs the toolkit; runs without a GPU).
gpu-vet: kernels
	$(GO) vet -tags $(CUDA_TAG) ./...

## gpu-bins: build GPU test and benchmark binaries into bin/ for a GPU machine
## that has no Go toolchain (see README, "Working on the GPU path").
gpu-bins: kernels
	@mkdir -p bin
	for p in $$($(GO) list -tags $(CUDA_TAG) -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do \
		name=$$(echo $$p | sed 's|github.com/stheno-ml/stheno/||; s|/|_|g'); \
		$(GO) test -tags $(CUDA_TAG) -ldflags="-s -w" -c -o bin/$$name.test $$p || exit 1; \
	done

clean:
	rm -rf kernels/build bin
