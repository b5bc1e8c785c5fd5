package model

import (
	"strings"
	"testing"
)

func TestBuildRejects(t *testing.T) {
	ok := DefaultConfig(3, 32)
	bad := ok
	bad.ImageSize = 40
	for _, c := range []struct {
		cfg   Config
		mode  Mode
		batch int
		want  string
	}{
		{bad, Infer, 1, "ImageSize must be a multiple of 16"},
		{ok, Train, 1, "batch must be at least 2"},
		{ok, Infer, 0, "batch must be at least 1"},
	} {
		_, err := Build(c.cfg, NewParams(1, nil), c.mode, c.batch)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got error %v, want one containing %q", err, c.want)
		}
	}
}

// Training and inference graphs built from one Params share its tensors:
// the inference graph asks for exactly the tensors training made.
func TestGraphsShareParams(t *testing.T) {
	cfg := DefaultConfig(3, 32)
	p := NewParams(1, nil)
	tr, err := Build(cfg, p, Train, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	n := len(p.Names())
	inf, err := Build(cfg, p, Infer, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer inf.Close()
	if len(p.Names()) != n || len(inf.ParamNames()) != n || len(tr.ParamNames()) != n {
		t.Errorf("training made %d tensors and uses %d, inference uses %d and added %d",
			n, len(tr.ParamNames()), len(inf.ParamNames()), len(p.Names())-n)
	}
}
