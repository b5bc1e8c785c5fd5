package checkpoint

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

type run struct {
	Iter    int
	Classes []string
	Params  []NamedTensor
}

// Checkpoints are readable by everyone, leave no temporary file, and read
// back as written.
func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	c := run{Iter: 3, Classes: []string{"a"}, Params: []NamedTensor{{Name: "w", Shape: []int{2}, Data: []float32{1, 2}}}}
	path := filepath.Join(dir, "c.gob")
	for range 2 { // a new file, then one replaced
		if err := Save(path, &c); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != 0o644 {
			t.Fatalf("checkpoint mode %v (%v), want 0644", st.Mode(), err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the checkpoint alone", len(entries))
	}
	var back run
	if err := Load(path, &back); err != nil || !reflect.DeepEqual(back, c) {
		t.Errorf("Load: %+v, %v; want %+v", back, err, c)
	}
	if err := Save(filepath.Join(dir, "missing", "c.gob"), &c); err == nil || !strings.Contains(err.Error(), "checkpoint: saving") {
		t.Errorf("saving into a missing directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a failed save left %d entries, want the checkpoint alone", len(entries))
	}
	for _, bad := range []string{filepath.Join(dir, "none.gob"), dir} {
		if err := Load(bad, &back); err == nil || !strings.HasPrefix(err.Error(), "checkpoint: ") {
			t.Errorf("Load(%s): %v, want a checkpoint error", bad, err)
		}
	}
}

func TestNamedTensor(t *testing.T) {
	src := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	n := Named("w", src)
	src.Float32s()[0] = 99 // the checkpoint keeps the values it was given
	if n.Name != "w" || !reflect.DeepEqual(n.Shape, []int{2, 3}) || n.Data[0] != 1 {
		t.Fatalf("Named = %+v", n)
	}
	if v, err := n.Values(tensor.Shape{2, 3}); err != nil || !reflect.DeepEqual(v, []float32{1, 2, 3, 4, 5, 6}) {
		t.Errorf("Values: %v, %v", v, err)
	}
	for _, shape := range []tensor.Shape{{3, 2}, {6}, {2, 4}} {
		if _, err := n.Values(shape); err == nil || !strings.Contains(err.Error(), "checkpoint: w has shape [2 3]") {
			t.Errorf("Values for a %v tensor: %v", shape, err)
		}
	}
	d := n.Dense()
	if !d.Shape().Eq(tensor.Shape{2, 3}) || !reflect.DeepEqual(d.Float32s(), n.Data) {
		t.Errorf("Dense: %v %v", d.Shape(), d.Float32s())
	}
}
