package data

import "errors"

// WriteCOCO writes ds in COCO format: every image as dir/images/<File> (PNG)
// and the instance annotations as dir/annotations.json, masks as compressed
// RLE strings. Category ids are class index + 1.
func WriteCOCO(ds *Dataset, dir string) error {
	return errors.New("data: WriteCOCO: not implemented yet")
}

// ReadCOCO reads COCO instance annotations and the images they name from
// imageDir (the annotations file's directory if imageDir is "").
func ReadCOCO(annotationsPath, imageDir string) (*Dataset, error) {
	return nil, errors.New("data: ReadCOCO: not implemented yet")
}
