// Package posembed computes the sine position embedding that DETR and
// Deformable-DETR add to the image features of the transformer: their
// PositionEmbeddingSine with normalize=True, as Deformable-DETR's
// models/position_encoding.py computes it.
//
// The embedding is data, not a parameter: it depends only on the padding
// mask of the batch, so it is computed on the host and fed to the graph as
// an input (SineTensor makes the *tensor.Dense that gorgonia.Let takes).
//
// # The formula
//
// For image b of a batch padded to H x W, mask[b][i][j] is true where the
// pixel is padding (DETR pads each image on the right and at the bottom,
// see PaddingMask). With the counts of valid pixels
//
//	y[i][j] = valid pixels in column j among rows 0..i
//	x[i][j] = valid pixels in row i among columns 0..j
//
// each is normalised by the last of its column or row,
//
//	ey[i][j] = (y[i][j] - 0.5) / (y[H-1][j] + 1e-6) * scale
//	ex[i][j] = (x[i][j] - 0.5) / (x[i][W-1] + 1e-6) * scale
//
// (Deformable-DETR's variant: DETR's own does not subtract 0.5), so that
// a valid pixel's coordinate lies in (0, scale). For channel c of F, with
// d[c] = temperature^(2*floor(c/2)/F), the embedding is
//
//	out[b][c][i][j]   = sin(ey[i][j]/d[c]) for even c, cos(ey[i][j]/d[c]) for odd c
//	out[b][F+c][i][j] = the same of ex[i][j]
//
// for c in [0, F): 2F channels, y's then x's, laid out [N, 2F, H, W].
// Deformable-DETR takes F = 128 (half its hidden size of 256),
// temperature 10000 and scale 2π, the zero Config's defaults.
//
// # Precision
//
// The reference computes in float32; Sine computes every element in
// float64 and rounds it once to the type asked for. On the reference
// script's cases (testdata/gen_posembed.py) the reference's float32
// results differ from float64 ones by up to 7e-7.
//
// Where a column (or row) of an image holds no valid pixel, its last count
// is 0 and the coordinate is -0.5/1e-6*scale, about -3.1e6: there sin and
// cos are ill-conditioned (one ulp of the argument in float64 moves them by
// 5e-10; float32 keeps only a quarter of a unit of it), so the values at
// those pixels are float64's, which no float32 computation reproduces.
// They are padding: Deformable-DETR masks them out of attention, so they
// do not reach the features of any valid pixel.
package posembed
