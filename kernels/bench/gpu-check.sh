#!/bin/sh
# Runs stheno's GPU test binaries (built here by `make gpu-bins`) on a GPU
# machine, from the repository root. Logs go to $OUT (default ./out).
#   sh kernels/bench/gpu-check.sh [tests|sanitize|bench|anchors|core|profile|stalls]...
#
# The anchors step also times Deformable-DETR's own CUDA kernels (the
# MSDeformAttn targets' anchor) on the suite's inputs when a copy of
# ../shared/anchors/deformable_detr_msda is in $DD_DIR (default
# gpucarry/deformable_detr_msda, ignored by git): it is built on this
# machine, in the background from the start so that the build overlaps the
# tests, and the bench step waits for it so that it does not share the CPU
# with the timings. Without the copy, anchors.py says DD-CUDA was not
# measured and gives no ratio against it.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
root=$(pwd)
what=${*:-tests sanitize bench anchors}
DD_DIR=${DD_DIR:-gpucarry/deformable_detr_msda}
# The GPU parity tests compute-sanitizer runs (a regexp of test names
# after TestGPU).
SANITIZED='RoIAlignParity|MSDeformAttnParity|MSDeformAttn(Backward|Forward)Variants|MSDeformAttnSortedParity|MSDeformAttnQueryOrder|RoIAlignRunTimeErrors|ConvParity|ConvGradParity|ConvFpropVariants|ConvBackwardVariants|BatchNormOpsParity|ReLUMaskEdges'
SANITIZED="$SANITIZED|LinearParity|SoftmaxParity|LayerNormParity|GroupNormParity|PointwiseParity|ReduceParity|LayoutParity|GatherRowsBadIndex|MultiHeadAttentionParity|MaxPool2dParity|DropoutParity|LossesParity|BoxConvertParity|AdamWParity"
# The general ops' benchmarks (the core step), and their anchors scripts.
CORE_BENCH='GPU(Softmax|LayerNorm|GroupNorm|Pointwise|Reduce|Layout|MultiHeadAttention|MaxPool2d|Dropout|Losses|AdamW)$'
CORE_ANCHORS='softmax layernorm groupnorm pointwise layout attention maxpool dropout losses adamw'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ddpid=
case " $what " in
*" anchors "*)
	if [ -f "$DD_DIR/build.py" ]; then
		echo "== building Deformable-DETR's CUDA kernels in $DD_DIR (background, log $OUT/dd-build.log)"
		(cd "$DD_DIR" && python3 build.py >"$OUT/dd-build.log" 2>&1; echo "exit $?" >>"$OUT/dd-build.log") &
		ddpid=$!
	fi
	;;
esac
wait_dd() {
	if [ -n "$ddpid" ]; then
		wait "$ddpid"
		ddpid=
		tail -n 1 "$OUT/dd-build.log" | sed 's/^/== Deformable-DETR build: /'
	fi
}
for step in $what; do
	case $step in
	tests)
		# bin/ops.test and bin/backend.test together exceed the device
		# tool's 64 MiB carry: a run may bring only ops.test.
		if [ -x bin/backend.test ]; then
			echo "== backend tests"
			(cd backend && "$root/bin/backend.test" -test.v -test.timeout 5m >"$OUT/backend.log" 2>&1; echo "exit $?" >>"$OUT/backend.log")
			grep -E "^(--- FAIL|FAIL|ok|PASS|exit)" "$OUT/backend.log"; grep -c -- "--- SKIP" "$OUT/backend.log" | sed 's/^/skipped: /'
		else
			echo "== backend tests: no bin/backend.test, skipped"
		fi
		# kernels/cuda's tests load every generated kernel on the GPU and
		# launch one through its typed launcher (a small binary: 32 MB).
		if [ -x bin/kernels_cuda.test ]; then
			echo "== kernels/cuda tests"
			(cd kernels/cuda && "$root/bin/kernels_cuda.test" -test.v -test.timeout 5m >"$OUT/kernels-cuda.log" 2>&1; echo "exit $?" >>"$OUT/kernels-cuda.log")
			grep -E "^(--- |FAIL|ok|PASS|exit)|loaded" "$OUT/kernels-cuda.log"
		fi
		echo "== ops GPU tests"
		(cd ops && "$root/bin/ops.test" -test.v -test.run GPU -test.timeout 5m >"$OUT/ops-gpu.log" 2>&1; echo "exit $?" >>"$OUT/ops-gpu.log")
		grep -E "^(--- |FAIL|ok|PASS|exit)|    gpu_test" "$OUT/ops-gpu.log" | grep -v "^    --- PASS" | head -60
		;;
	sanitize)
		for tool in memcheck racecheck; do
			echo "== compute-sanitizer $tool"
			(cd ops && compute-sanitizer --tool $tool --error-exitcode 9 "$root/bin/ops.test" \
				-test.run "GPU($SANITIZED)" >"$OUT/sanitizer-$tool.log" 2>&1
			echo "exit $?" >>"$OUT/sanitizer-$tool.log")
			tail -n 4 "$OUT/sanitizer-$tool.log"
		done
		;;
	bench)
		wait_dd
		echo "== GPU benchmark suite (CUDA events, median of 30) and kernel variants"
		rm -rf /tmp/stheno-inputs
		(cd ops && STHENO_BENCH_DUMP=/tmp/stheno-inputs "$root/bin/ops.test" -test.run '^$' \
			-test.bench 'Suite/impl=cuda' -test.benchtime 30x >"$OUT/bench.log" 2>&1
		"$root/bin/ops.test" -test.run '^$' -test.bench 'Variants' -test.benchtime 30x >>"$OUT/bench.log" 2>&1)
		grep -E "^Benchmark|FAIL" "$OUT/bench.log"
		;;
	profile)
		echo "== Nsight Compute (one call of each TARGETS case family)"
		(cd ops && ncu --clock-control none --section SpeedOfLight --section Occupancy \
			-k regex:'roialign|transpose|msdeform' -c 30 "$root/bin/ops.test" -test.run '^$' \
			-test.bench 'Suite(RoIAlign|MSDeformAttn)$/impl=cuda/dtype=float32/case=(box_head_P2|box_head_P2_adaptive|detr_encoder)$' \
			-test.benchtime 1x >"$OUT/ncu.txt" 2>&1)
		grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy" "$OUT/ncu.txt" | head -150
		;;
	stalls)
		echo "== Nsight Compute: where the slowest kernels wait"
		(cd ops && ncu --clock-control none --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
			-k regex:'roialign_fwd_nchw_cols_s2(_cmajor)?_f32|msdeform_bwd_red4_rs4_occ3_f32' -c 2 "$root/bin/ops.test" -test.run '^$' \
			-test.bench 'Suite(RoIAlign|MSDeformAttn)$/impl=cuda/dtype=float32/case=(box_head_P2|detr_encoder)$' \
			-test.benchtime 1x >"$OUT/ncu-stalls.txt" 2>&1)
		grep -E "^  [a-z_0-9]+.*\(|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible Warps|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|Mem Pipes" "$OUT/ncu-stalls.txt" | head -60
		;;
	anchors)
		wait_dd
		dd=
		if ls "$DD_DIR"/msda_ext*.so >/dev/null 2>&1; then
			echo "== Deformable-DETR's CUDA kernels (DD-CUDA) on the suite's inputs"
			python3 "$DD_DIR/bench_dd.py" --inputs /tmp/stheno-inputs --stheno "$OUT/bench.log" 2>&1 | tee "$OUT/anchors-dd.log"
			dd="--dd $OUT/anchors-dd.log"
		elif [ -f "$DD_DIR/build.py" ]; then
			echo "== Deformable-DETR's CUDA kernels did not build (see $OUT/dd-build.log): DD-CUDA not measured"
		else
			echo "== no $DD_DIR: DD-CUDA not measured (copy ../shared/anchors/deformable_detr_msda there)"
		fi
		echo "== anchors (PyTorch) on the suite's inputs, side by side"
		# shellcheck disable=SC2086 # $dd is empty or two words
		python3 kernels/bench/anchors.py --inputs /tmp/stheno-inputs --stheno "$OUT/bench.log" $dd 2>&1 | tee "$OUT/anchors.log"
		python3 kernels/bench/anchors_conv.py --stheno "$OUT/bench.log" 2>&1 | tee "$OUT/anchors-conv.log"
		;;
	core)
		# The general ops (softmax, norms, elementwise, layout, attention,
		# pooling, dropout, losses, AdamW) and cuBLAS's GEMM against
		# PyTorch eager, each anchor right after the benchmarks, then the
		# copy bandwidth their GB/s are read against.
		echo "== general ops: benchmarks (CUDA events, median of 30), then their PyTorch anchors"
		(cd ops && "$root/bin/ops.test" -test.run '^$' -test.bench "$CORE_BENCH" -test.benchtime 30x >"$OUT/core-bench.log" 2>&1)
		grep -cE "^Benchmark" "$OUT/core-bench.log" | sed 's/^/benchmarks: /'
		grep -E "^(FAIL|panic)" "$OUT/core-bench.log"
		if [ -x bin/backend.test ]; then
			(cd backend && "$root/bin/backend.test" -test.run '^$' -test.bench GPUGemm -test.benchtime 30x >"$OUT/gemm-bench.log" 2>&1)
			python3 kernels/bench/anchors_gemm.py --stheno "$OUT/gemm-bench.log" 2>&1 | tee "$OUT/anchors-gemm.log"
		fi
		for a in $CORE_ANCHORS; do
			python3 "kernels/bench/anchors_$a.py" --stheno "$OUT/core-bench.log" 2>&1 | tee "$OUT/anchors-$a.log"
		done
		python3 kernels/bench/timing.py 2>&1 | tee "$OUT/copy.log"
		;;
	esac
done
