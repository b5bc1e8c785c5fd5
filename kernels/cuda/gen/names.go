package main

import (
	"strings"
	"unicode"
)

// words spells the parts of C++ snake_case names that Go writes as
// initialisms or with inner capitals.
var words = map[string]string{
	"adamw":      "AdamW",
	"bc2":        "BC2",
	"bce":        "BCE",
	"bn":         "BN",
	"bx":         "BX",
	"ce":         "CE",
	"cm":         "CM",
	"cmajor":     "CMajor",
	"colsum":     "ColSum",
	"cxcywh":     "CxCyWH",
	"dx":         "DX",
	"dy":         "DY",
	"giou":       "GIoU",
	"groupnorm":  "GroupNorm",
	"hw":         "HW",
	"id":         "ID",
	"kh":         "KH",
	"kk":         "KK",
	"kw":         "KW",
	"lanetaps":   "LaneTaps",
	"layernorm":  "LayerNorm",
	"lq":         "Lq",
	"maxpool":    "MaxPool",
	"msdeform":   "MSDeform",
	"nchw":       "NCHW",
	"nhwc":       "NHWC",
	"qfast":      "QFast",
	"qw":         "QW",
	"relu":       "ReLU",
	"roi":        "RoI",
	"roialign":   "RoIAlign",
	"rois":       "RoIs",
	"sharedtaps": "SharedTaps",
	"smoothl1":   "SmoothL1",
	"splitk":     "SplitK",
	"tf32":       "TF32",
	"u64":        "U64",
	"ws":         "WS",
	"wt":         "WT",
	"xyxy":       "XYXY",
}

// goName turns a C++ snake_case name into a Go exported name:
// roialign_fwd_nchw_cols_s2_cmajor_f32 is RoIAlignFwdNCHWColsS2CMajorF32.
func goName(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w == "" {
			continue
		}
		if v, ok := words[w]; ok {
			b.WriteString(v)
			continue
		}
		// A word and its number: nchw4 is NCHW4.
		i := strings.IndexFunc(w, unicode.IsDigit)
		if i > 0 {
			if v, ok := words[w[:i]]; ok {
				b.WriteString(v + w[i:])
				continue
			}
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// fieldName is the Go name of a params struct's field; padding fields
// called unused are blank.
func fieldName(s string) string {
	if s == "unused" || strings.HasPrefix(s, "unused_") {
		return "_"
	}
	return goName(s)
}
