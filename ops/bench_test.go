package ops

// The benchmark suite of the ops, on the CPU and the GPU.
//
//	make bench                                   # CPU
//	./bin/ops.test -test.run '^$' -test.bench 'Suite' -test.benchtime 30x   # GPU machine (see BENCHMARKS.md)
//
// Cases are TARGETS.md's presets; more can be given by environment:
//
//	STHENO_BENCH_ROIALIGN='mine:n=1,c=64,h=50,w=84,k=128,pooled=7,scale=0.25,sampling=2,img=200x336'
//	STHENO_BENCH_MSDEFORM='mine:n=1,lq=1000,m=8,d=32,p=4,levels=64x64+32x32,encoder=0'
//	STHENO_BENCH_CONV='mine:n=8,cin=128,h=56,w=56,cout=128,k=3,stride=1,pad=1,dilation=1'
//	STHENO_BENCH_ONLY='box_head_P2,detr_encoder'   # run only these cases
//	STHENO_BENCH_DUMP=dir                          # write each case's inputs for kernels/bench/anchors.py
//
// impl=cuda times each iteration with CUDA events and reports the median
// (ms), the compulsory bytes over that time (GB/s: every input read once,
// every output written once) and its share of the GPU's device-to-device
// copy bandwidth measured in the same run (%copy); for the convolutions
// (conv_gpu_bench_test.go), TFLOP/s and their share of the tensor cores'
// dense TF32 peak (%peak). impl=cpu reports wall time per op. Inputs are
// drawn as TARGETS.md describes.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

type roiBenchCase struct {
	name             string
	n, c, h, w, k    int
	pooled, sampling int
	scale            float64
	imgH, imgW       float64
}

type msDeformBenchCase struct {
	name        string
	n, lq, m, d int
	p           int
	levels      []Level
	encoder     bool
}

var (
	roiPresets = []roiBenchCase{
		{"box_head_P2", 2, 256, 200, 336, 1024, 7, 2, 0.25, 800, 1344},
		{"mask_head_P2", 2, 256, 200, 336, 256, 14, 2, 0.25, 800, 1344},
		{"box_head_P2_adaptive", 2, 256, 200, 336, 1024, 7, 0, 0.25, 800, 1344},
		{"infer_1000_P3", 1, 256, 100, 168, 1000, 7, 2, 0.125, 800, 1344},
	}
	detrLevels      = []Level{{100, 167}, {50, 84}, {25, 42}, {13, 21}}
	seedLevels      = []Level{{92, 160}, {46, 80}, {23, 40}, {12, 20}}
	msDeformPresets = []msDeformBenchCase{
		{"detr_encoder", 2, 22223, 8, 32, 4, detrLevels, true},
		{"detr_decoder", 2, 300, 8, 32, 4, detrLevels, false},
		{"seed_full", 6, 15422, 8, 32, 4, seedLevels, false},
	}
)

// benchKV parses "name:k=v,k=v;name2:..." into named key-value maps.
func benchKV(b *testing.B, env string) (names []string, kvs []map[string]string) {
	for _, item := range strings.Split(os.Getenv(env), ";") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, rest, ok := strings.Cut(item, ":")
		if !ok {
			b.Fatalf("%s: %q: want name:key=value,...", env, item)
		}
		kv := map[string]string{}
		for _, f := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				b.Fatalf("%s: %q: want key=value", env, f)
			}
			kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		names, kvs = append(names, name), append(kvs, kv)
	}
	return names, kvs
}

func kvInt(b *testing.B, kv map[string]string, key string, def int) int {
	v, ok := kv[key]
	if !ok {
		return def
	}
	i, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", key, v, err)
	}
	return i
}

func kvFloat(b *testing.B, kv map[string]string, key string, def float64) float64 {
	v, ok := kv[key]
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		b.Fatalf("%s=%q: %v", key, v, err)
	}
	return f
}

// kvLevels parses "64x64+32x32" (H x W per level).
func kvLevels(b *testing.B, s string) []Level {
	var levels []Level
	for _, part := range strings.Split(s, "+") {
		hs, ws, ok := strings.Cut(part, "x")
		h, err1 := strconv.Atoi(hs)
		w, err2 := strconv.Atoi(ws)
		if !ok || err1 != nil || err2 != nil {
			b.Fatalf("levels %q: want HxW+HxW...", s)
		}
		levels = append(levels, Level{h, w})
	}
	return levels
}

func suiteRoIAlignCases(b *testing.B) []roiBenchCase {
	cases := slices.Clone(roiPresets)
	names, kvs := benchKV(b, "STHENO_BENCH_ROIALIGN")
	for i, kv := range kvs {
		img := strings.Split(kv["img"], "x")
		c := roiBenchCase{name: names[i],
			n: kvInt(b, kv, "n", 1), c: kvInt(b, kv, "c", 256), h: kvInt(b, kv, "h", 200), w: kvInt(b, kv, "w", 336),
			k: kvInt(b, kv, "k", 512), pooled: kvInt(b, kv, "pooled", 7), sampling: kvInt(b, kv, "sampling", 2),
			scale: kvFloat(b, kv, "scale", 0.25)}
		c.imgH, c.imgW = float64(c.h)/c.scale, float64(c.w)/c.scale
		if len(img) == 2 {
			c.imgH, _ = strconv.ParseFloat(img[0], 64)
			c.imgW, _ = strconv.ParseFloat(img[1], 64)
		}
		cases = append(cases, c)
	}
	return cases
}

func suiteMSDeformCases(b *testing.B) []msDeformBenchCase {
	cases := slices.Clone(msDeformPresets)
	names, kvs := benchKV(b, "STHENO_BENCH_MSDEFORM")
	for i, kv := range kvs {
		c := msDeformBenchCase{name: names[i], n: kvInt(b, kv, "n", 1), lq: kvInt(b, kv, "lq", 300),
			m: kvInt(b, kv, "m", 8), d: kvInt(b, kv, "d", 32), p: kvInt(b, kv, "p", 4),
			levels: detrLevels, encoder: kv["encoder"] == "1"}
		if v, ok := kv["levels"]; ok {
			c.levels = kvLevels(b, v)
		}
		cases = append(cases, c)
	}
	return cases
}

// selected reports whether STHENO_BENCH_ONLY (if set) names the case.
func selected(name string) bool {
	only := os.Getenv("STHENO_BENCH_ONLY")
	return only == "" || slices.Contains(strings.Split(only, ","), name)
}

var copyBandwidth struct {
	once sync.Once
	gbs  float64
	err  error
}

// measuredCopyGBs is the device-to-device copy bandwidth of the GPU, bytes
// read plus written per second, over 1 GiB copies timed with events.
func measuredCopyGBs(b *testing.B, dev *backend.Device) float64 {
	copyBandwidth.once.Do(func() {
		const n = 1 << 28 // float32 elements: 1 GiB
		src, err := dev.NewDense(tensor.Float32, n)
		if err != nil {
			copyBandwidth.err = err
			return
		}
		defer dev.FreeDense(src)
		dst, err := dev.NewDense(tensor.Float32, n)
		if err != nil {
			copyBandwidth.err = err
			return
		}
		defer dev.FreeDense(dst)
		var times []time.Duration
		for i := range 13 {
			t, err := timeGPU(dev, func() error { return dev.Engine().Memcpy(dst, src) })
			if err != nil {
				copyBandwidth.err = err
				return
			}
			if i >= 3 {
				times = append(times, t)
			}
		}
		copyBandwidth.gbs = 2 * 4 * n / median(times).Seconds() / 1e9
	})
	if copyBandwidth.err != nil {
		b.Fatal(copyBandwidth.err)
	}
	return copyBandwidth.gbs
}

// timeGPU returns the GPU time of the work f queues, by CUDA events.
func timeGPU(dev *backend.Device, f func() error) (time.Duration, error) {
	start, err := dev.Record()
	if err != nil {
		return 0, err
	}
	defer start.Release()
	if err := f(); err != nil {
		return 0, err
	}
	end, err := dev.Record()
	if err != nil {
		return 0, err
	}
	defer end.Release()
	return dev.Elapsed(start, end)
}

func median(ts []time.Duration) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}

// runCase times op on inputs: on the CPU with the benchmark's own timer,
// on the GPU with events around each of b.N iterations after 5 untimed ones.
// bytes is what the op must move at the least.
func runCase(b *testing.B, impl string, op G.Op, inputs []*tensor.Dense, bytes float64) {
	pd := op.(G.UsePreallocDoer)
	if impl == "cpu" {
		vals := make([]G.Value, len(inputs))
		for i, d := range inputs {
			vals[i] = d
		}
		out, err := op.Do(vals...)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if out, err = pd.UsePreallocDo(out, vals...); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		return
	}
	dev := gpu(b)
	vals := make([]G.Value, len(inputs))
	for i, d := range inputs {
		vals[i] = toDev(b, dev, d)
	}
	defer func() {
		for _, v := range vals {
			dev.FreeDense(v.(*tensor.Dense))
		}
	}()
	var out G.Value
	var err error
	med := timeSteps(b, dev, func() error {
		out, err = pd.UsePreallocDo(out, vals...)
		return err
	})
	if d, ok := out.(*tensor.Dense); ok {
		dev.FreeDense(d)
	}
	reportBandwidth(b, dev, med, bytes)
}

// timeSteps returns the median GPU time of step, by CUDA events around each
// of b.N calls after 5 untimed ones (the benchmark's timer runs over the
// timed calls only), once the device is idle again.
func timeSteps(b *testing.B, dev *backend.Device, step func() error) time.Duration {
	for range 5 {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	measuredCopyGBs(b, dev) // measured once per process, never inside the timer
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t, err := timeGPU(dev, step)
		if err != nil {
			b.Fatal(err)
		}
		times = append(times, t)
	}
	b.StopTimer()
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	return median(times)
}

// reportBandwidth reports a median time med of an op that must move bytes
// at the least: ms, GB/s and its share of the copy bandwidth (%copy).
func reportBandwidth(b *testing.B, dev *backend.Device, med time.Duration, bytes float64) {
	gbs := bytes / med.Seconds() / 1e9
	b.ReportMetric(float64(med.Nanoseconds())/1e6, "ms")
	b.ReportMetric(gbs, "GB/s")
	b.ReportMetric(100*gbs/measuredCopyGBs(b, dev), "%copy")
}

// dumpInputs writes tensors as raw little-endian float32 files with a JSON
// description, for kernels/bench/anchors.py to time the anchors on the very
// same inputs.
func dumpInputs(b *testing.B, op, name string, meta map[string]any, tensors map[string]*tensor.Dense) {
	dir := os.Getenv("STHENO_BENCH_DUMP")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, op, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	shapes := map[string][]int{}
	for k, t := range tensors {
		shapes[k] = t.Shape()
		buf := make([]byte, 4*t.Shape().TotalSize())
		for i, v := range t.Float32s() {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		if err := os.WriteFile(filepath.Join(dir, k+".f32"), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	meta["shapes"] = shapes
	js, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "case.json"), js, 0o644); err != nil {
		b.Fatal(err)
	}
}

// roiBenchInputs makes a case's inputs: float32, aligned, with RoIs drawn as
// TARGETS.md describes, the same for every run.
func roiBenchInputs(c roiBenchCase) (s roiAlignShape, x, rois, gy *tensor.Dense) {
	rng := rand.New(rand.NewPCG(1, 1))
	dt := tensor.Float32
	s = roiAlignShape{cfg: RoIAlignConfig{c.pooled, c.pooled, c.scale, c.sampling, true}, n: c.n, c: c.c, h: c.h, w: c.w, k: c.k, dt: dt}
	x = randTensor(rng, dt, -1, 1, c.n, c.c, c.h, c.w)
	rois = targetRoIs(rng, dt, c.k, c.n, c.imgH, c.imgW)
	gy = randTensor(rng, dt, -1, 1, c.k, c.c, c.pooled, c.pooled)
	return s, x, rois, gy
}

func BenchmarkSuiteRoIAlign(b *testing.B) {
	for _, c := range suiteRoIAlignCases(b) {
		if !selected(c.name) {
			continue
		}
		s, x, rois, gy := roiBenchInputs(c)
		dumpInputs(b, "roialign", c.name, map[string]any{"pooled": c.pooled, "scale": c.scale, "sampling": c.sampling, "aligned": true},
			map[string]*tensor.Dense{"rois": rois})
		xb := float64(4 * c.n * c.c * c.h * c.w)
		yb := float64(4 * c.k * c.c * c.pooled * c.pooled)
		for _, impl := range []string{"cpu", "cuda"} {
			b.Run(fmt.Sprintf("impl=%s/dtype=float32/case=%s/pass=fwd", impl, c.name), func(b *testing.B) {
				runCase(b, impl, roiAlignOp(s), []*tensor.Dense{x, rois}, xb+yb)
			})
			b.Run(fmt.Sprintf("impl=%s/dtype=float32/case=%s/pass=bwd", impl, c.name), func(b *testing.B) {
				runCase(b, impl, roiAlignGradOp(s), []*tensor.Dense{rois, gy}, xb+yb)
			})
		}
	}
}

// msDeformBenchInputs makes a case's inputs: float32, with locations as
// Deformable-DETR produces them (TARGETS.md), the same for every run.
func msDeformBenchInputs(c msDeformBenchCase) (sh msDeformShape, value, loc, weight, gy *tensor.Dense) {
	rng := rand.New(rand.NewPCG(2, 2))
	dt := tensor.Float32
	s := 0
	for _, lv := range c.levels {
		s += lv.H * lv.W
	}
	l := len(c.levels)
	sh = msDeformShape{n: c.n, s: s, m: c.m, d: c.d, lq: c.lq, l: l, p: c.p, levels: c.levels, dt: dt}
	value = randTensor(rng, dt, -1, 1, c.n, s, c.m, c.d)
	loc = deformLocations(rng, dt, c.n, c.lq, c.m, c.p, c.levels, c.encoder)
	weight = softmaxWeights(rng, dt, c.n, c.lq, c.m, l, c.p)
	gy = randTensor(rng, dt, -1, 1, c.n, c.lq, c.m*c.d)
	return sh, value, loc, weight, gy
}

func BenchmarkSuiteMSDeformAttn(b *testing.B) {
	for _, c := range suiteMSDeformCases(b) {
		if !selected(c.name) {
			continue
		}
		sh, value, loc, weight, gy := msDeformBenchInputs(c)
		l := sh.l
		levels := make([][2]int, l)
		for i, lv := range c.levels {
			levels[i] = [2]int{lv.H, lv.W}
		}
		dumpInputs(b, "msdeform", c.name, map[string]any{"levels": levels},
			map[string]*tensor.Dense{"loc": loc, "weight": weight})
		vb := float64(4 * c.n * sh.s * c.m * c.d)
		lb := float64(4 * c.n * c.lq * c.m * l * c.p * 3) // loc (x, y) and weight
		ob := float64(4 * c.n * c.lq * c.m * c.d)
		for _, impl := range []string{"cpu", "cuda"} {
			b.Run(fmt.Sprintf("impl=%s/dtype=float32/case=%s/pass=fwd", impl, c.name), func(b *testing.B) {
				runCase(b, impl, msDeformAttnOp(sh), []*tensor.Dense{value, loc, weight}, vb+lb+ob)
			})
			b.Run(fmt.Sprintf("impl=%s/dtype=float32/case=%s/pass=bwd", impl, c.name), func(b *testing.B) {
				// reads value, loc, weight, grad; writes their three gradients
				runCase(b, impl, msDeformAttnGradOp(sh), []*tensor.Dense{value, loc, weight, gy}, 2*(vb+lb)+ob)
			})
		}
	}
}
