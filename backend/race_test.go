//go:build race

package backend

// raceEnabled: the test binary runs under the race detector, which finds
// a racy access the first time it happens and makes every access several
// times slower, so tests that exist for their volume do less.
const raceEnabled = true
