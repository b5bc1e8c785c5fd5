package ops

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// CheckPlacement needs no GPU: it reads the graph. A Device that was never
// opened stands for one (only its address is looked at).
func TestCheckPlacement(t *testing.T) {
	devA, devB := new(backend.Device), new(backend.Device)
	must := func(n *G.Node, err error) *G.Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// hostOnly is an op of this package without device kernels.
	hostOnly := func(x *G.Node) *G.Node {
		return must(G.ApplyOp(newOp(&opSpec{
			name: "HostOnly", config: "x",
			inputs: []argSpec{{name: "x", shape: x.Shape()}}, out: x.Shape(), dtype: x.Dtype(),
			cpu: func(in []*tensor.Dense, out *tensor.Dense) error { return nil },
		}), x))
	}
	hostValue := tensor.New(tensor.WithShape(8, 4), tensor.WithBacking(make([]float32, 32)))
	for _, c := range []struct {
		name  string
		build func(g *G.ExprGraph, x *G.Node)
		want  []string // each error line's parts; none: no error
	}{
		{"device ops, back to the host, then gorgonia and its gradient", func(g *G.ExprGraph, x *G.Node) {
			y := must(Softmax(must(ToDevice(x, devA)), -1))
			r := must(G.Reshape(y, tensor.Shape{32})) // metadata only: runs on device values
			loss := must(G.Sum(must(G.Sigmoid(must(ToHost(r))))))
			if _, err := G.Grad(loss, x); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"a node used twice: G.Grad's + sums device gradients", func(g *G.ExprGraph, x *G.Node) {
			d := must(ToDevice(x, devA))
			y := must(Softmax(d, -1))
			z := must(LogSoftmax(d, -1))
			loss := must(G.Sum(must(G.Add(must(ToHost(y)), must(ToHost(z))))))
			if _, err := G.Grad(loss, x); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"inputs bound later are trusted", func(g *G.ExprGraph, x *G.Node) {
			w := G.NewMatrix(g, tensor.Float32, G.WithShape(8, 8), G.WithName("w"))
			must(G.Sigmoid(must(MatMul(must(ToDevice(x, devA)), w))))
		}, []string{`node`, `"sigmoid"`, `takes device values from node`, `MatMul`, `gorgonia's "sigmoid" runs on the host only; use ops.Sigmoid, or move the input to the host with ops.ToHost`}},
		{"a gorgonia op on a device value", func(g *G.ExprGraph, x *G.Node) {
			must(G.SoftMax(must(ToDevice(x, devA))))
		}, []string{`takes device values from node`, `ToDevice`, `use ops.Softmax or ops.LogSoftmax`}},
		{"broadcasting + is not the engine's", func(g *G.ExprGraph, x *G.Node) {
			b := G.NewVector(g, tensor.Float32, G.WithShape(8), G.WithName("b"),
				G.WithValue(tensor.New(tensor.WithShape(8), tensor.WithBacking(make([]float32, 8)))))
			must(G.BroadcastAdd(must(ToDevice(x, devA)), b, nil, []byte{0}))
		}, []string{`use ops.Add (it broadcasts)`}},
		{"two device losses added by gorgonia", func(g *G.ExprGraph, x *G.Node) {
			d := must(ToDevice(x, devA))
			w := must(ToDevice(G.NewMatrix(g, tensor.Float32, G.WithShape(4, 8), G.WithName("w")), devA))
			a := must(L1Loss(d, w, w))
			b := must(SmoothL1(d, w, w, 1))
			must(G.Add(a, b))
		}, []string{`gorgonia's "+" runs on the host only; add losses with ops.SumLosses`}},
		{"an op of this package without device kernels", func(g *G.ExprGraph, x *G.Node) {
			hostOnly(must(ToDevice(x, devA)))
		}, []string{`but HostOnly has no GPU kernel yet; move its inputs to the host with ops.ToHost`}},
		{"host and device inputs", func(g *G.ExprGraph, x *G.Node) {
			h := G.NewMatrix(g, tensor.Float32, G.WithShape(8, 4), G.WithName("h"), G.WithValue(hostValue))
			must(MatMul(must(ToDevice(x, devA)), h))
		}, []string{`takes node`, `"h" from the host and node`, `move it with ops.ToDevice`}},
		{"two devices", func(g *G.ExprGraph, x *G.Node) {
			w := G.NewMatrix(g, tensor.Float32, G.WithShape(8, 4), G.WithName("w"))
			must(MatMul(must(ToDevice(x, devA)), must(ToDevice(w, devB))))
		}, []string{`an op runs on one device`}},
		{"every problem, one line each", func(g *G.ExprGraph, x *G.Node) {
			d := must(ToDevice(x, devA))
			must(G.Exp(d))
			hostOnly(d)
		}, []string{`use ops.Exp`, "\n", `HostOnly has no GPU kernel`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := G.NewGraph()
			x := G.NewMatrix(g, tensor.Float32, G.WithShape(4, 8), G.WithName("x"))
			c.build(g, x)
			err := CheckPlacement(g)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("CheckPlacement: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckPlacement passed the graph; want an error with %q", c.want)
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q\ndoes not say %q", msg, w)
				}
			}
			if !strings.HasPrefix(msg, "ops: node ") {
				t.Errorf("error %q does not start by naming the node", msg)
			}
			// NewTapeMachine refuses the same graph, with the same error.
			if _, err := NewTapeMachine(g); err == nil || err.Error() != msg {
				t.Errorf("NewTapeMachine: %v, want %q", err, msg)
			}
		})
	}
}

// NewTapeMachine returns a machine that runs a graph that is fine.
func TestNewTapeMachine(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))))
	y, err := Softmax(x, -1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewTapeMachine(g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	if got := y.Value().(*tensor.Dense).Float64s(); len(got) != 6 || got[2] < got[1] {
		t.Errorf("softmax of increasing rows = %v", got)
	}
	if err := CheckPlacement(nil); err == nil || !strings.Contains(err.Error(), "graph is nil") {
		t.Errorf("CheckPlacement(nil) = %v", err)
	}
}

// Every op CheckPlacement's advice names exists in this package.
func TestDeviceAdviceNamesOps(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]bool{}
	for _, f := range pkgs["ops"].Files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				funcs[fd.Name.Name] = true
			}
		}
	}
	scalarNode := G.NewScalar(G.NewGraph(), tensor.Float32)
	named := regexp.MustCompile(`ops\.(\w+)`)
	advice := []string{deviceAdvice(nil, nil, scalarNode), "move the input to the host with ops.ToHost"}
	for _, a := range deviceAdviceByOp {
		advice = append(advice, a.use)
	}
	for _, a := range advice {
		for _, m := range named.FindAllStringSubmatch(a, -1) {
			if !funcs[m[1]] {
				t.Errorf("advice %q names ops.%s, which does not exist", a, m[1])
			}
		}
	}
}

// A value of STHENO_CPU_KERNELS the CPU cannot take makes NewTapeMachine
// refuse to build a machine, naming the value; the choice is made when
// the program starts, so the check runs in a process of its own.
func TestNewTapeMachineRefusesCPUKernels(t *testing.T) {
	const childEnv = "STHENO_TEST_NEWTAPEMACHINE_CHILD"
	if os.Getenv(childEnv) == "1" {
		g := G.NewGraph()
		x := G.NewVector(g, tensor.Float32, G.WithShape(3), G.WithName("x"))
		G.Must(G.Sum(x))
		m, err := NewTapeMachine(g)
		if m != nil {
			m.Close()
		}
		fmt.Printf("error: %v\n", err)
		return
	}
	for _, c := range []struct{ value, want string }{
		{"avx", `kernels: STHENO_CPU_KERNELS="avx" names no micro-kernels`},
		{"portable", "error: <nil>"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNewTapeMachineRefusesCPUKernels$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=1", kernels.CPUKernelsEnv+"="+c.value)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s=%s: %v\n%s\nwant %q", kernels.CPUKernelsEnv, c.value, err, out, c.want)
		}
	}
}
