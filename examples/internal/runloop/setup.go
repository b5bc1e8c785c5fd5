package runloop

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/option"
)

// Setup is what a run checks and loads before it builds its network.
type Setup struct {
	// Resume is the checkpoint resumed (empty: none), Diff the options in
	// which the run differs from it (its RunConfig.Diff), Classes its
	// classes.
	Resume  string
	Diff    []string
	Classes []string

	Data                   string // a COCO annotations file; empty: synthetic
	Seed                   uint64
	TrainImages, ValImages int
	ImageSize              int
	Out                    string // the output directory, made here
}

// Load refuses a resumed checkpoint of other options or classes, loads
// the data and makes the output directory. It returns the data's path made
// absolute (so that a checkpoint names it wherever the run resumes from)
// and the training and validation sets.
func (s Setup) Load() (dataPath string, train, val *data.Dataset, err error) {
	if len(s.Diff) > 0 {
		return "", nil, nil, fmt.Errorf("train: %s comes from a run with other options; resuming needs the same ones (options not given are taken from the checkpoint):\n  %s",
			s.Resume, strings.Join(s.Diff, "\n  "))
	}
	dataPath = s.Data
	if dataPath != "" {
		dataPath = option.AbsPath(dataPath)
	}
	train, val, err = data.Load(dataPath, s.Seed, s.TrainImages, s.ValImages, s.ImageSize)
	if err != nil {
		return "", nil, nil, err
	}
	if s.Resume != "" && !slices.Equal(s.Classes, train.Classes) {
		return "", nil, nil, fmt.Errorf("train: %s has the classes %q, the data %q", s.Resume, s.Classes, train.Classes)
	}
	if err := os.MkdirAll(s.Out, 0o755); err != nil {
		return "", nil, nil, fmt.Errorf("train: %w", err)
	}
	return dataPath, train, val, nil
}
