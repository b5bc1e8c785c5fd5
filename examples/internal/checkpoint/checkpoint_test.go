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
	dst := tensor.New(tensor.WithShape(2, 3), tensor.Of(tensor.Float32))
	if err := n.CopyTo(dst); err != nil || !reflect.DeepEqual(dst.Float32s(), []float32{1, 2, 3, 4, 5, 6}) {
		t.Errorf("CopyTo: %v, %v", dst.Float32s(), err)
	}
	for _, shape := range [][]int{{3, 2}, {6}, {2, 4}} {
		other := tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32))
		if err := n.CopyTo(other); err == nil || !strings.Contains(err.Error(), "checkpoint: w has shape [2 3]") {
			t.Errorf("CopyTo a %v tensor: %v", shape, err)
		}
	}
}
