package option

import (
	"strings"
	"testing"
)

func TestRunGroups(t *testing.T) {
	var checks Checks
	checks.Schedule(Schedule{Warmup: -1, Steps: []float64{0.5, 0.4}})
	checks.Data(Data{TrainImages: 0, ValImages: 5}, 10)
	checks.Data(Data{Path: "a.json"}, 10) // a file's sizes are not checked
	checks.Output(Output{EvalBatch: 1, EvalEvery: 1, LogEvery: 1, Out: "out", SheetScale: 0}, 8)
	var flags []string
	for _, line := range strings.Split(checks.Err().Error(), "\n") {
		flags = append(flags, strings.Fields(line)[0])
	}
	if got, want := strings.Join(flags, " "), "-warmup -steps -train-images -sheet"; got != want {
		t.Errorf("failed checks %s, want %s", got, want)
	}

	for _, tc := range []struct {
		given, saved Data
		want         string
	}{
		{Data{TrainImages: 5, Seed: 1}, Data{TrainImages: 5, Seed: 1}, ""},
		{Data{TrainImages: 5}, Data{TrainImages: 6}, "-train-images"},
		{Data{Path: "a.json", TrainImages: 5}, Data{Path: "a.json", TrainImages: 6}, ""},
		{Data{Path: "a.json"}, Data{}, "-data"},
		{Data{Seed: 2}, Data{Seed: 1}, "-seed"},
	} {
		var c Changes
		c.Data(tc.given, tc.saved)
		var flags []string
		for _, line := range c {
			flags = append(flags, strings.TrimSuffix(strings.Fields(line)[0], ":"))
		}
		if got := strings.Join(flags, " "); got != tc.want {
			t.Errorf("%+v against %+v: changes %q, want %s", tc.given, tc.saved, c, tc.want)
		}
	}
}
