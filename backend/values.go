package backend

// Values kept on a Device for the packages above backend: settings that
// belong to one device and must not outlive it (package ops keeps its
// kernel choices for tests and benchmarks, and what it learnt about the
// device, here instead of in package globals keyed by *Device). Keys
// follow context.Value's rule: an unexported type of the package that
// stores them, so that packages cannot collide.

// Value returns what SetValue stored under key on d, or nil.
func (d *Device) Value(key any) any {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	return d.values[key]
}

// SetValue stores v under key on d; a nil v removes key. The values go
// with the Device: Close drops them.
func (d *Device) SetValue(key, v any) {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	if v == nil {
		delete(d.values, key)
		return
	}
	if d.values == nil {
		d.values = map[any]any{}
	}
	d.values[key] = v
}
