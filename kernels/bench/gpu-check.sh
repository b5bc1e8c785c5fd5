#!/bin/sh
# Runs stheno's GPU test binaries (built here by `make gpu-bins`) on a GPU
# machine, from the repository root. Logs go to $OUT (default ./out).
#   sh kernels/bench/gpu-check.sh [tests|sanitize|bench|anchors]...
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
root=$(pwd)
what=${*:-tests sanitize bench anchors}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
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
		echo "== ops GPU tests"
		(cd ops && "$root/bin/ops.test" -test.v -test.run GPU -test.timeout 5m >"$OUT/ops-gpu.log" 2>&1; echo "exit $?" >>"$OUT/ops-gpu.log")
		grep -E "^(--- |FAIL|ok|PASS|exit)|    gpu_test" "$OUT/ops-gpu.log" | grep -v "^    --- PASS" | head -60
		;;
	sanitize)
		for tool in memcheck racecheck; do
			echo "== compute-sanitizer $tool"
			(cd ops && compute-sanitizer --tool $tool --error-exitcode 9 "$root/bin/ops.test" \
				-test.run 'GPU(RoIAlignParity|MSDeformAttnParity|MSDeformAttn(Backward|Forward)Variants|MSDeformAttnSortedParity|MSDeformAttnQueryOrder|RoIAlignRunTimeErrors|ConvParity|ConvGradParity|ConvFpropVariants|ConvBackwardVariants|BatchNormOpsParity|ReLUMaskEdges)' >"$OUT/sanitizer-$tool.log" 2>&1
			echo "exit $?" >>"$OUT/sanitizer-$tool.log")
			tail -n 4 "$OUT/sanitizer-$tool.log"
		done
		;;
	bench)
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
			-k regex:'roialign_forward_cols_s2_f32|msdeform_backward_f32_q4_r4_h_b3' -c 2 "$root/bin/ops.test" -test.run '^$' \
			-test.bench 'Suite(RoIAlign|MSDeformAttn)$/impl=cuda/dtype=float32/case=(box_head_P2|detr_encoder)$' \
			-test.benchtime 1x >"$OUT/ncu-stalls.txt" 2>&1)
		grep -E "^  [a-z_0-9]+.*\(|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible Warps|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|Mem Pipes" "$OUT/ncu-stalls.txt" | head -60
		;;
	anchors)
		echo "== anchors (PyTorch) on the suite's inputs, side by side"
		python3 kernels/bench/anchors.py --inputs /tmp/stheno-inputs --stheno "$OUT/bench.log" 2>&1 | tee "$OUT/anchors.log"
		python3 kernels/bench/anchors_conv.py 2>&1 | tee "$OUT/anchors-conv.log"
		;;
	esac
done
