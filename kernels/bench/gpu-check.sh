#!/bin/sh
# Runs stheno's GPU test binaries (built here by `make gpu-bins`) on a GPU
# machine, from the repository root. Logs go to $OUT (default ./out).
#   sh kernels/bench/gpu-check.sh [tests|sanitize|bench|anchors|core|encoder|maskrcnn|detr|profile|stalls]...
# The sanitize step reads SAN_TOOLS, SAN_GROUPS and SAN_TIMEOUT (below).
# It exits 1 when a test binary failed or a sanitizer tool reported errors
# (or ran out of time), else 0.
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
# The sanitize step runs compute-sanitizer's tools (SAN_TOOLS) over groups
# of ops' GPU tests (SAN_GROUPS), one run and one log per tool and group
# ($OUT/sanitize-<tool>-<group>.log), each under a limit of SAN_TIMEOUT
# seconds so that a slow run cannot take the others' logs with it, then
# prints a table ($OUT/sanitize-summary.txt): tool, group, exit code (9:
# the tool reported errors; 124 or 137: out of time; else the tests'
# own), seconds, tests passed, failed and skipped, and the tool's summary
# line. Select tools and groups to split the work over several calls, e.g.
#   SAN_TOOLS=racecheck SAN_GROUPS="conv conv-fprop-variants" sh kernels/bench/gpu-check.sh sanitize
SAN_TOOLS=${SAN_TOOLS:-memcheck racecheck synccheck initcheck}
SAN_ALL_GROUPS='roialign msdeform msdeform-variants conv conv-fprop-variants conv-backward-variants batchnorm rows elementwise attention pooling losses adamw'
SAN_GROUPS=${SAN_GROUPS:-$SAN_ALL_GROUPS}
SAN_TIMEOUT=${SAN_TIMEOUT:-540}
# san_tests prints group $1's tests: a regexp of the names after TestGPU.
# The groups follow the op families, the largest (convolutions,
# MSDeformAttn) split further, so that a tool runs one group at a time
# within SAN_TIMEOUT, racecheck (the slowest) included; the summary's
# seconds say how close each comes.
san_tests() {
	case $1 in
	roialign) echo 'RoIAlignParity|RoIAlignRunTimeErrors|MultiLevelRoIAlignParity|MultiLevelRoIAlignKernels|MultiLevelRoIAlignRunTimeErrors' ;;
	msdeform) echo 'MSDeformAttnParity|MSDeformAttnSortedParity|MSDeformAttnCellBoundary|MSDeformAttnQueryOrder' ;;
	msdeform-variants) echo 'MSDeformAttnForwardVariants|MSDeformAttnBackwardVariants' ;;
	conv) echo 'ConvParity|ConvGradParity|ConvEpilogueFoldsBatchNorm|ConvTransposeParity|ConvTransposeForcedPath' ;;
	conv-fprop-variants) echo 'ConvFpropVariants' ;;
	conv-backward-variants) echo 'ConvBackwardVariants' ;;
	batchnorm) echo 'BatchNormOpsParity|ReLUMaskEdges|BatchNormRunningStatsSteps' ;;
	rows) echo 'SoftmaxParity|LayerNormParity|GroupNormParity' ;;
	elementwise) echo 'PointwiseParity|ReduceParity|LayoutParity|GatherRowsBadIndex|BoxConvertParity' ;;
	attention) echo 'LinearParity|MultiHeadAttentionParity' ;;
	pooling) echo 'MaxPool2dParity|DropoutParity|UpsampleNearestParity|UpsampleNearestUnaligned' ;;
	losses) echo 'LossesParity|SoftmaxCrossEntropyBadLabelIsNaN' ;;
	adamw) echo 'AdamWParity' ;;
	*) return 1 ;;
	esac
}
# The general ops' benchmarks (the core step), and their anchors scripts.
CORE_BENCH='GPU(Softmax|LayerNorm|GroupNorm|Pointwise|Reduce|Layout|MultiHeadAttention|MaxPool2d|UpsampleNearest|MultiLevelRoIAlign|ConvTranspose|Dropout|Losses|AdamW)$'
CORE_ANCHORS='softmax layernorm groupnorm pointwise layout attention maxpool upsample dropout losses adamw'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ddpid=
# The encoder step's PyTorch side: a copy of ../shared/anchors/encoder_stack
# beside the copies of deformable_detr_msda and deformable_detr_model.
ENC_DIR=${ENC_DIR:-gpucarry/encoder_stack}
MRCNN_DIR=${MRCNN_DIR:-gpucarry/torchvision_maskrcnn}
# The detr step's anchor: a copy of ../shared/anchors/deformable_detr_model
# beside $DD_DIR (its dd_step.py imports ../deformable_detr_msda).
DETR_DIR=${DETR_DIR:-gpucarry/deformable_detr_model}
case " $what " in
*" anchors "* | *" encoder "* | *" detr "*)
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
# The script's exit status: 1 when a test binary failed or a sanitizer
# tool reported errors (or ran out of time), else 0.
status=0
note_rc() { [ "$1" = 0 ] || status=1; }
for step in $what; do
	case $step in
	tests)
		# bin/ops.test and bin/backend.test together exceed the device
		# tool's 64 MiB carry: a run may bring only ops.test.
		if [ -x bin/backend.test ]; then
			echo "== backend tests"
			(cd backend && "$root/bin/backend.test" -test.v -test.timeout 5m >"$OUT/backend.log" 2>&1)
			rc=$?
			echo "exit $rc" >>"$OUT/backend.log"
			note_rc $rc
			grep -E "^(--- FAIL|FAIL|ok|PASS|exit)" "$OUT/backend.log"; grep -c -- "--- SKIP" "$OUT/backend.log" | sed 's/^/skipped: /'
		else
			echo "== backend tests: no bin/backend.test, skipped"
		fi
		# kernels/cuda's tests load every generated kernel on the GPU and
		# launch one through its typed launcher (a small binary: 32 MB).
		if [ -x bin/kernels_cuda.test ]; then
			echo "== kernels/cuda tests"
			(cd kernels/cuda && "$root/bin/kernels_cuda.test" -test.v -test.timeout 5m >"$OUT/kernels-cuda.log" 2>&1)
			rc=$?
			echo "exit $rc" >>"$OUT/kernels-cuda.log"
			note_rc $rc
			grep -E "^(--- |FAIL|ok|PASS|exit)|loaded" "$OUT/kernels-cuda.log"
		fi
		echo "== ops GPU tests"
		(cd ops && "$root/bin/ops.test" -test.v -test.run GPU -test.timeout 5m >"$OUT/ops-gpu.log" 2>&1)
		rc=$?
		echo "exit $rc" >>"$OUT/ops-gpu.log"
		note_rc $rc
		grep -E "^(--- |FAIL|ok|PASS|exit)|    gpu_test" "$OUT/ops-gpu.log" | grep -v "^    --- PASS" | head -60
		;;
	sanitize)
		# Device backtraces only (host ones are mostly Go runtime frames:
		# the test's own -test.v lines, in the same log, say which case
		# ran), and at most 100 reports a log. racecheck's analysis mode
		# (its default) reports each race once, not every hazard of it.
		# The test binary's own timeout comes first, so that a run out of
		# time names its test.
		tools=
		for tool in $SAN_TOOLS; do
			case $tool in
			memcheck | racecheck | synccheck | initcheck) tools="$tools $tool" ;;
			*) echo "== sanitize: no tool $tool (memcheck racecheck synccheck initcheck)" ;;
			esac
		done
		groups=
		for group in $SAN_GROUPS; do
			if san_tests "$group" >/dev/null; then
				groups="$groups $group"
			else
				echo "== sanitize: no group $group ($SAN_ALL_GROUPS)"
			fi
		done
		summary=$OUT/sanitize-summary.txt
		printf '%-9s %-22s %4s %5s %-16s %s\n' tool group exit secs pass/fail/skip summary >"$summary"
		for tool in $tools; do
			flags=
			[ "$tool" = racecheck ] && flags='--racecheck-report analysis'
			for group in $groups; do
				tests=$(san_tests "$group")
				log=$OUT/sanitize-$tool-$group.log
				echo "== compute-sanitizer $tool, $group ($log)"
				start=$(date +%s)
				# shellcheck disable=SC2086 # $flags is empty or two words
				(cd ops && timeout -k 30 "$SAN_TIMEOUT" compute-sanitizer --tool "$tool" $flags \
					--error-exitcode 9 --print-limit 100 --show-backtrace device \
					"$root/bin/ops.test" -test.v -test.run "^TestGPU($tests)\$" \
					-test.timeout "$((SAN_TIMEOUT * 9 / 10))s" >"$log" 2>&1)
				rc=$?
				secs=$(($(date +%s) - start))
				echo "exit $rc" >>"$log"
				note_rc $rc
				line=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')
				if [ -z "$line" ]; then
					case $rc in
					124 | 137) line="no summary: out of time after ${SAN_TIMEOUT}s" ;;
					*) line='no summary' ;;
					esac
				fi
				counts=$(grep -c -- '--- PASS' "$log")/$(grep -c -- '--- FAIL' "$log")/$(grep -c -- '--- SKIP' "$log")
				printf '%-9s %-22s %4s %5s %-16s %s\n' "$tool" "$group" "$rc" "$secs" "$counts" "$line" | tee -a "$summary"
			done
		done
		echo "== sanitize summary ($summary)"
		cat "$summary"
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
	encoder)
		# A whole training step: the Deformable-DETR-encoder-shaped stack,
		# stheno's (ops' BenchmarkGPUEncoderStep, with NewTapeMachine and
		# with gorgonia's own machine) and PyTorch's (the encoder_stack
		# anchor, with Deformable-DETR's CUDA kernels) on the same
		# configurations, then a CPU profile of stheno's host at one image
		# and six layers, where the host's time per node shows.
		wait_dd
		echo "== encoder-shaped training step (log $OUT/encoder.log)"
		(cd ops && "$root/bin/ops.test" -test.run '^$' -test.bench 'GPUEncoderStep' -test.benchtime 20x >"$OUT/encoder.log" 2>&1)
		grep -E "^(Benchmark|FAIL|panic)|encoder_bench_test" "$OUT/encoder.log"
		echo "== the same without CUDA graphs (log $OUT/encoder-nographs.log)"
		(cd ops && STHENO_CUDA_GRAPHS=0 "$root/bin/ops.test" -test.run '^$' -test.bench 'GPUEncoderStep' -test.benchtime 20x >"$OUT/encoder-nographs.log" 2>&1)
		grep -E "^(Benchmark|FAIL|panic)" "$OUT/encoder-nographs.log"
		: >"$OUT/encoder-anchor.log"
		if [ -f "$ENC_DIR/encoder_step.py" ] && ls "$DD_DIR"/msda_ext*.so >/dev/null 2>&1; then
			for cfg in 1:1 1:6 1:12 2:6 8:6; do
				PROBE_N=${cfg%:*} PROBE_LAYERS=${cfg#*:} PROBE_STEPS=20 python3 "$ENC_DIR/encoder_step.py" >>"$OUT/encoder-anchor.log" 2>&1
			done
		else
			echo "== no $ENC_DIR or no built $DD_DIR: PyTorch's encoder step not measured"
		fi
		python3 kernels/bench/anchors_encoder.py --stheno "$OUT/encoder.log" --torch "$OUT/encoder-anchor.log" | tee "$OUT/anchors-encoder.log"
		(cd ops && STHENO_ENCODER='n=1,layers=6' "$root/bin/ops.test" -test.run '^$' -test.bench 'GPUEncoderStep/.*/.*/machine=stheno' \
			-test.benchtime 300x -test.cpuprofile "$OUT/encoder-cpu.prof" >"$OUT/encoder-profile.log" 2>&1)
		grep -E "^Benchmark" "$OUT/encoder-profile.log"
		;;
	maskrcnn)
		# Mask R-CNN's training step and prediction: the r50fpn preset
		# (examples/maskrcnn/model's BenchmarkGPUR50FPN*; the step also
		# without CUDA graphs and with full-float32 convolutions) against
		# torchvision's maskrcnn_resnet50_fpn ($MRCNN_DIR, a copy of
		# ../shared/anchors/torchvision_maskrcnn, with AdamW as the example
		# trains) on the same work, 512x512 x 8, in this run, and the RoIs
		# torchvision's mask head trains on (anchors_maskrcnn_rois.py).
		echo "== Mask R-CNN R50-FPN step and prediction (log $OUT/maskrcnn.log)"
		(cd examples/maskrcnn/model && "$root/bin/examples_maskrcnn_model.test" -test.run '^$' -test.bench 'GPUR50FPN' \
			-test.benchtime 20x -test.v >"$OUT/maskrcnn.log" 2>&1)
		grep -E "^(Benchmark|FAIL|panic)|bench_gpu_test" "$OUT/maskrcnn.log"
		echo "== the training step without CUDA graphs (log $OUT/maskrcnn-nographs.log)"
		(cd examples/maskrcnn/model && STHENO_CUDA_GRAPHS=0 "$root/bin/examples_maskrcnn_model.test" -test.run '^$' -test.bench 'GPUR50FPNStep' \
			-test.benchtime 20x -test.v >"$OUT/maskrcnn-nographs.log" 2>&1)
		grep -E "^(Benchmark|FAIL|panic)" "$OUT/maskrcnn-nographs.log"
		echo "== the training step with full-float32 convolutions, -tf32=false (log $OUT/maskrcnn-exact.log)"
		(cd examples/maskrcnn/model && STHENO_MASKRCNN_BENCH=tf32=0 "$root/bin/examples_maskrcnn_model.test" -test.run '^$' -test.bench 'GPUR50FPNStep' \
			-test.benchtime 20x -test.v >"$OUT/maskrcnn-exact.log" 2>&1)
		grep -E "^(Benchmark|FAIL|panic)" "$OUT/maskrcnn-exact.log"
		if [ -f "$MRCNN_DIR/maskrcnn_step.py" ]; then
			python3 "$MRCNN_DIR/maskrcnn_step.py" --size 512 --batch 8 --amp off --optimizer adamw --steps 20 2>&1 | tee "$OUT/maskrcnn-anchor.log"
		else
			echo "== no $MRCNN_DIR: torchvision's training step not measured"
		fi
		python3 kernels/bench/anchors_maskrcnn_infer.py --size 512 --batch 8 2>&1 | tee -a "$OUT/maskrcnn-anchor.log"
		python3 kernels/bench/anchors_maskrcnn_rois.py --size 512 --batch 8 2>&1 | tee -a "$OUT/maskrcnn-anchor.log"
		;;
	detr)
		# Deformable-DETR's training step: the r50 preset
		# (examples/detr/model's BenchmarkGPUDETRStep) at the official
		# model's first configuration (512x512 x 8, 91 classes, no box
		# refinement), with box refinement, and with box refinement and
		# two stage (its third), against the official model itself
		# ($DETR_DIR/dd_step.py: its three configurations) in this run.
		# The build of $DD_DIR is waited for first, so that it does not
		# share the CPU with the timings.
		wait_dd
		echo "== Deformable-DETR R50 training step (log $OUT/detr.log)"
		: >"$OUT/detr.log"
		# graphs=0: the same step without CUDA graphs (STHENO_CUDA_GRAPHS=0).
		for run in refine=0:1 refine=0:0 refine=1:1 refine=1,two_stage=1:1 refine=1,two_stage=1:0; do
			cfg=${run%:*}
			echo "== $cfg graphs=${run#*:}" | tee -a "$OUT/detr.log"
			(cd examples/detr/model && STHENO_CUDA_GRAPHS=${run#*:} STHENO_DETR_BENCH="size=512,batch=8,$cfg" "$root/bin/examples_detr_model.test" \
				-test.run '^$' -test.bench 'GPUDETRStep' -test.benchtime 10x -test.v 2>&1) | tee -a "$OUT/detr.log" |
				grep -E "^(Benchmark|FAIL|panic)|bench_gpu_test"
		done
		if [ -f "$DETR_DIR/dd_step.py" ] && ls "$DD_DIR"/msda_ext*.so >/dev/null 2>&1; then
			echo "== the official model's step ($DETR_DIR/dd_step.py, log $OUT/detr-anchor.log)"
			python3 "$DETR_DIR/dd_step.py" 2>&1 | tee "$OUT/detr-anchor.log"
		else
			echo "== no $DETR_DIR or no built $DD_DIR: the official model's step not measured" | tee "$OUT/detr-anchor.log"
		fi
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
exit $status
