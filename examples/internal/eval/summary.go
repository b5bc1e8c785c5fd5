package eval

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// APs are COCO's headline precisions of one evaluation, as a run prints
// them and writes them to its history.
type APs struct {
	AP   Precision `json:"ap"`   // mean over IoU 0.50:0.05:0.95
	AP50 Precision `json:"ap50"` // at IoU 0.50
	AP75 Precision `json:"ap75"` // at IoU 0.75
}

// APs converts m's headline numbers, which mark an undefined precision with
// pycocotools' sentinel -1, to APs, where it is NaN.
func (m Metrics) APs() APs {
	conv := func(v float64) Precision {
		if v < 0 {
			return Precision(math.NaN())
		}
		return Precision(v)
	}
	return APs{AP: conv(m.AP), AP50: conv(m.AP50), AP75: conv(m.AP75)}
}

// String formats the three as "AP 0.669 AP50 0.930 AP75 0.752".
func (a APs) String() string {
	return fmt.Sprintf("AP %v AP50 %v AP75 %v", a.AP, a.AP50, a.AP75)
}

// Precision is an average precision in [0, 1], or undefined (NaN) where no
// class of the validation images has ground truth: printed as "n/a",
// written to JSON as null.
type Precision float64

// Defined reports whether p is a number, not NaN.
func (p Precision) Defined() bool { return !math.IsNaN(float64(p)) }

func (p Precision) String() string {
	if !p.Defined() {
		return "n/a"
	}
	return strconv.FormatFloat(float64(p), 'f', 3, 64)
}

// MarshalJSON writes null for an undefined precision (JSON has no NaN).
func (p Precision) MarshalJSON() ([]byte, error) {
	if !p.Defined() {
		return []byte("null"), nil
	}
	return json.Marshal(float64(p))
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *Precision) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*p = Precision(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = Precision(v)
	return nil
}
