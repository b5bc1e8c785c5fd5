package history

import (
	"encoding/json"
	"fmt"
	"os"
)

// WriteJSON writes v, a run's history, to path as indented JSON: the
// numbers behind curves.png, for a reader or a script.
func WriteJSON(path string, v any) error {
	js, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}
