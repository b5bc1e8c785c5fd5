package checkpoint

import (
	"bufio"
	"encoding/gob"
	"fmt"
	"os"
	"path/filepath"

	"gorgonia.org/tensor"
)

// Save gob-encodes v into path atomically and durably: into a temporary
// file in the same directory, synced to disk, renamed over path, and the
// directory synced, so that a crash or power loss at any moment leaves
// either the previous checkpoint or this one. The file is readable by
// everyone (0644), like a run's other outputs.
func Save(path string, v any) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("checkpoint: saving %s: %w", path, err)
	}
	w := bufio.NewWriter(tmp)
	err = gob.NewEncoder(w).Encode(v)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("checkpoint: saving %s: %w", path, err)
	}
	// The rename is durable once the directory is.
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		return fmt.Errorf("checkpoint: saving %s: syncing its directory: %w", path, err)
	}
	return nil
}

// Load decodes the checkpoint at path, written by Save, into v (a
// pointer).
func Load(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	if err := gob.NewDecoder(bufio.NewReader(f)).Decode(v); err != nil {
		return fmt.Errorf("checkpoint: reading %s: %w", path, err)
	}
	return nil
}

// NamedTensor is a float32 tensor with its name and shape.
type NamedTensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Named copies t's shape and values: the checkpoint keeps them as they
// are now, whatever training does to t afterwards.
func Named(name string, t *tensor.Dense) NamedTensor {
	return NamedTensor{Name: name, Shape: append([]int(nil), t.Shape()...), Data: append([]float32(nil), t.Float32s()...)}
}

// Values returns n's values for a tensor of the given shape, and an error
// if n has another: a model built with other sizes than the checkpoint's
// is refused, not filled in part.
func (n NamedTensor) Values(shape tensor.Shape) ([]float32, error) {
	if !shape.Eq(tensor.Shape(n.Shape)) || len(n.Data) != shape.TotalSize() {
		return nil, fmt.Errorf("checkpoint: %s has shape %v, the model's %v", n.Name, n.Shape, shape)
	}
	return n.Data, nil
}

// Dense is n as a tensor of its shape, sharing its values.
func (n NamedTensor) Dense() *tensor.Dense {
	return tensor.New(tensor.WithShape(n.Shape...), tensor.WithBacking(n.Data))
}

// InterruptedError is a training run's error when its context is
// cancelled: the iteration under way was finished and the run saved in
// Checkpoint, from which it resumes exactly.
type InterruptedError struct {
	Iter       int // iterations done, all in the checkpoint
	Checkpoint string
	Cause      error // the context's cause: the signal, for the command
}

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("train: interrupted (%v) after iteration %d; the run is saved in %s", e.Cause, e.Iter, e.Checkpoint)
}

func (e *InterruptedError) Unwrap() error { return e.Cause }
