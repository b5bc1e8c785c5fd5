package ops

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// ParamGroup is a set of parameters that share a learning rate and a weight
// decay, as an entry of torch's param_groups: DETR trains its backbone at
// LR 1e-5 and the rest at 1e-4, and keeps norms and biases out of the
// weight decay with a group of WeightDecay 0.
type ParamGroup struct {
	// Params are the group's parameters, as Step will be handed them: the
	// learnable nodes (*gorgonia.Node), usually. Each must already hold
	// its value, a float32 or float64 *tensor.Dense that is not a view.
	Params []G.ValueGrad
	// LR is the learning rate, >= 0; SetLR changes it between steps.
	LR float64
	// WeightDecay is the decoupled weight decay, >= 0: each step first
	// multiplies the parameters by 1 - LR*WeightDecay.
	WeightDecay float64
}

// AdamWConfig is what AdamW's parameter groups share. Start from
// DefaultAdamWConfig: a zero field is not a default.
type AdamWConfig struct {
	// Beta1 and Beta2 are the moments' decay rates, in [0, 1).
	Beta1, Beta2 float64
	// Eps is added to sqrt(v_hat), > 0.
	Eps float64
	// MaxGradNorm, when > 0, clips the gradients as
	// torch.nn.utils.clip_grad_norm_(params, MaxGradNorm) before each
	// step: all of the step's gradients are scaled by min(MaxGradNorm /
	// (norm + 1e-6), 1), norm their 2-norm taken together. 0 turns
	// clipping off. A NaN or infinite norm is not refused (torch's
	// error_if_nonfinite=False): the coefficient is then NaN or 0 and the
	// step goes on with it, so a NaN gradient makes every parameter NaN.
	// GradNorm reads the norm for logging or for catching that.
	MaxGradNorm float64
	// KeepGrads leaves the gradients as they came. By default a step
	// zeroes them once read, as gorgonia's solvers do: gradients bound
	// with BindDualValues add up across runs until a solver zeroes them.
	// The clipping scales the gradients only as the step reads them; it
	// does not write them back.
	KeepGrads bool
}

// DefaultAdamWConfig returns torch.optim.AdamW's defaults: betas (0.9,
// 0.999), eps 1e-8, and no clipping. (torch's default weight decay,
// 0.01, is each ParamGroup's to say.)
func DefaultAdamWConfig() AdamWConfig {
	return AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
}

// AdamW is torch.optim.AdamW (decoupled weight decay, bias-corrected
// moments, eps added to sqrt(v_hat); no amsgrad, no maximize) over
// parameter groups, with optional gradient clipping by global norm before
// each step (AdamWConfig.MaxGradNorm). It is a gorgonia.Solver.
//
// Its parameters live on the host or all on one GPU, in one dtype. On the
// host the CPU twins of package kernels update them; on a GPU one launch
// updates every tensor of the step (two more work out the clipping
// coefficient, which stays on the device), with no host round trip and no
// synchronisation: the scalars of the step travel in the launch.
//
// The state (the moments m and v, float32 for float32 parameters and
// float64 for float64 ones, and on a GPU a table of the tensors' addresses)
// is made by NewAdamW, which on a GPU must therefore run before a
// backend.Scope opens: a Scope frees what is made while it is open. Free
// gives the device memory back.
//
// The step count t of the bias corrections is the optimiser's: every Step
// counts, whichever parameters it is handed. torch counts per parameter;
// the two differ only for a parameter left out of some steps.
type AdamW struct {
	cfg    AdamWConfig
	lr, wd []float64 // per group
	params []*adamwParam
	index  map[G.ValueGrad]int
	dt     tensor.Dtype
	dev    *backend.Device // nil: the host
	steps  int

	// The norm of the last clipped step's gradients: on the host, norm;
	// on a GPU, in the device's state.
	normed bool
	norm   float64
	onDev  *adamwDevice
	freed  bool
}

// adamwParam is a parameter with its moments.
type adamwParam struct {
	vg    G.ValueGrad
	name  string
	group int
	shape tensor.Shape
	m, v  *tensor.Dense

	// On a device: the addresses of m and v, and of the value and the
	// gradient of the last step with the tensors they were found in.
	mPtr, vPtr        backend.DevicePtr
	seenVal, seenGrad deviceSeen
}

// deviceSeen is a device tensor as a step found it, checked, and its
// address: a later step handed the same tensor, with the same memory and
// shape, needs no lookup in the device's allocator (a freed tensor's
// memory is emptied, so it does not look the same).
type deviceSeen struct {
	t     *tensor.Dense
	raw   *byte
	n     int
	shape tensor.Shape
	ptr   backend.DevicePtr
}

func (s *deviceSeen) same(t *tensor.Dense) bool {
	return s.t == t && len(t.Raw) == s.n && s.n > 0 && unsafe.SliceData(t.Raw) == s.raw && t.Shape().Eq(s.shape)
}

// see records t, checked, at address ptr.
func (s *deviceSeen) see(t *tensor.Dense, ptr backend.DevicePtr) {
	s.t, s.raw, s.n, s.ptr = t, unsafe.SliceData(t.Raw), len(t.Raw), ptr
	s.shape = append(s.shape[:0], t.Shape()...)
}

const adamwName = "AdamW"

// NewAdamW returns an AdamW over groups, each parameter in exactly one of
// them (at most kernels.AdamWMaxGroups groups), with cfg. It checks the
// configuration and the parameters' values and makes the moments, zeros,
// where the parameters live.
func NewAdamW(groups []ParamGroup, cfg AdamWConfig) (*AdamW, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(groups) == 0 || len(groups) > kernels.AdamWMaxGroups {
		return nil, fmt.Errorf("ops: %s: %d parameter groups: want 1 to %d", adamwName, len(groups), kernels.AdamWMaxGroups)
	}
	a := &AdamW{cfg: cfg, index: map[G.ValueGrad]int{}}
	for gi, g := range groups {
		if err := checkGroupRate(gi, "LR", g.LR); err != nil {
			return nil, err
		}
		if err := checkGroupRate(gi, "WeightDecay", g.WeightDecay); err != nil {
			return nil, err
		}
		a.lr, a.wd = append(a.lr, g.LR), append(a.wd, g.WeightDecay)
		for pi, vg := range g.Params {
			if err := a.addParam(gi, pi, vg); err != nil {
				return nil, err
			}
		}
	}
	if len(a.params) == 0 {
		return nil, fmt.Errorf("ops: %s: the parameter groups hold no parameters", adamwName)
	}
	if err := a.makeState(); err != nil {
		return nil, err
	}
	return a, nil
}

func (c AdamWConfig) validate() error {
	for _, b := range []struct {
		name string
		v    float64
	}{{"Beta1", c.Beta1}, {"Beta2", c.Beta2}} {
		if !(b.v >= 0 && b.v < 1) {
			return fmt.Errorf("ops: %s: %s = %v: want a value in [0, 1)", adamwName, b.name, b.v)
		}
	}
	if !(c.Eps > 0 && c.Eps <= math.MaxFloat64) {
		return fmt.Errorf("ops: %s: Eps = %v: want a finite value > 0", adamwName, c.Eps)
	}
	if !(c.MaxGradNorm >= 0 && c.MaxGradNorm <= math.MaxFloat64) {
		return fmt.Errorf("ops: %s: MaxGradNorm = %v: want a finite value > 0, or 0 for no clipping", adamwName, c.MaxGradNorm)
	}
	return nil
}

func checkGroupRate(group int, name string, v float64) error {
	if !(v >= 0 && v <= math.MaxFloat64) {
		return fmt.Errorf("ops: %s: group %d: %s = %v: want a finite value >= 0", adamwName, group, name, v)
	}
	return nil
}

// describeParam names a value that is not one of the optimiser's
// parameters: its name, or its type.
func describeParam(vg G.ValueGrad) string {
	if n, ok := vg.(interface{ Name() string }); ok && n.Name() != "" {
		return n.Name()
	}
	return fmt.Sprintf("a %T", vg)
}

// paramName names a parameter in errors: its node's name, or where it
// sits in the groups.
func paramName(group, i int, vg G.ValueGrad) string {
	if n, ok := vg.(interface{ Name() string }); ok && n.Name() != "" {
		return fmt.Sprintf("parameter %s (group %d)", n.Name(), group)
	}
	return fmt.Sprintf("parameter %d of group %d", i, group)
}

func (a *AdamW) addParam(group, i int, vg G.ValueGrad) error {
	if vg == nil || reflect.ValueOf(vg).Kind() == reflect.Pointer && reflect.ValueOf(vg).IsNil() {
		return fmt.Errorf("ops: %s: parameter %d of group %d is nil", adamwName, i, group)
	}
	name := paramName(group, i, vg)
	if !reflect.TypeOf(vg).Comparable() {
		return fmt.Errorf("ops: %s: %s: a %T cannot identify a parameter: pass its node", adamwName, name, vg)
	}
	if j, dup := a.index[vg]; dup {
		return fmt.Errorf("ops: %s: %s is also %s: a parameter belongs to one group", adamwName, name, a.params[j].name)
	}
	val, ok := vg.Value().(*tensor.Dense)
	if !ok || val == nil {
		return fmt.Errorf("ops: %s: %s: its value must be a *tensor.Dense, got %T (bind values before making the optimiser)", adamwName, name, vg.Value())
	}
	dt := val.Dtype()
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return fmt.Errorf("ops: %s: %s has dtype %v: want float32 or float64", adamwName, name, dt)
	}
	var dev *backend.Device
	if backend.IsDevice(val) {
		d, err := backend.DeviceOf(val)
		if err != nil {
			return fmt.Errorf("ops: %s: %s: %w", adamwName, name, err)
		}
		dev = d
	} else if val.IsView() || !val.DataOrder().IsRowMajor() {
		return fmt.Errorf("ops: %s: %s is a view: the step updates a parameter in place, so it must own its memory", adamwName, name)
	}
	if len(a.params) > 0 {
		first := a.params[0]
		if dt != a.dt {
			return fmt.Errorf("ops: %s: %s has dtype %v but %s has %v: one optimiser takes one dtype", adamwName, name, dt, first.name, a.dt)
		}
		if dev != a.dev {
			return fmt.Errorf("ops: %s: %s is %s but %s is %s: the parameters must all be on the host or all on one device",
				adamwName, name, placeName(dev), first.name, placeName(a.dev))
		}
	}
	a.dt, a.dev = dt, dev
	a.index[vg] = len(a.params)
	a.params = append(a.params, &adamwParam{vg: vg, name: name, group: group, shape: val.Shape().Clone()})
	return nil
}

func placeName(dev *backend.Device) string {
	if dev == nil {
		return "in host memory"
	}
	return "on " + dev.String()
}

// makeState makes the moments, zeros, and on a device the table.
func (a *AdamW) makeState() error {
	if a.dev != nil {
		return a.makeDeviceState()
	}
	for _, p := range a.params {
		p.m = tensor.New(tensor.Of(a.dt), tensor.WithShape(p.shape.Clone()...))
		p.v = tensor.New(tensor.Of(a.dt), tensor.WithShape(p.shape.Clone()...))
	}
	return nil
}

// SetLR sets the learning rate of group from the next step on (a schedule
// calls it between steps).
func (a *AdamW) SetLR(group int, lr float64) error {
	if group < 0 || group >= len(a.lr) {
		return fmt.Errorf("ops: %s: SetLR: group %d of %d", adamwName, group, len(a.lr))
	}
	if err := checkGroupRate(group, "LR", lr); err != nil {
		return err
	}
	a.lr[group] = lr
	return nil
}

// LR returns the learning rate of group (NaN for a group it does not
// have).
func (a *AdamW) LR(group int) float64 {
	if group < 0 || group >= len(a.lr) {
		return math.NaN()
	}
	return a.lr[group]
}

// Steps returns the steps made: the step count of the next step's bias
// corrections is Steps()+1.
func (a *AdamW) Steps() int { return a.steps }

// Moments returns the first and second moments of a parameter (its value
// and gradient as Step takes them), where the parameters live. They are
// the optimiser's state: read them, do not keep them past Free.
func (a *AdamW) Moments(param G.ValueGrad) (m, v *tensor.Dense, err error) {
	i, ok := a.lookup(param)
	if !ok {
		return nil, nil, fmt.Errorf("ops: %s: Moments: the parameter is in no group", adamwName)
	}
	return a.params[i].m, a.params[i].v, nil
}

// SetState restores the optimiser as a checkpoint saved it: the step
// count (Steps) and, for each parameter in state, its moments, read from
// host tensors of the parameter's shape and the optimiser's dtype. The
// moments are copied where the parameters live, so a state saved from a
// GPU run resumes on the host and back. Parameters left out of state keep
// their moments. Nothing changes when an entry is refused.
func (a *AdamW) SetState(steps int, state map[G.ValueGrad][2]*tensor.Dense) error {
	if a.freed {
		return fmt.Errorf("ops: %s: SetState after Free", adamwName)
	}
	if steps < 0 {
		return fmt.Errorf("ops: %s: SetState: steps must be >= 0, got %d", adamwName, steps)
	}
	type load struct {
		p    *adamwParam
		m, v *tensor.Dense
	}
	loads := make([]load, 0, len(state))
	for vg, mv := range state {
		i, ok := a.lookup(vg)
		if !ok {
			return fmt.Errorf("ops: %s: SetState: %s is in no parameter group", adamwName, describeParam(vg))
		}
		p := a.params[i]
		for k, t := range mv {
			name := [2]string{"first", "second"}[k]
			switch {
			case t == nil:
				return fmt.Errorf("ops: %s: SetState: %s: the %s moment is nil", adamwName, p.name, name)
			case backend.IsDevice(t):
				return fmt.Errorf("ops: %s: SetState: %s: the %s moment must be in host memory", adamwName, p.name, name)
			case t.Dtype() != a.dt || !t.Shape().Eq(p.shape):
				return fmt.Errorf("ops: %s: SetState: %s: the %s moment is %v %v, want %v %v",
					adamwName, p.name, name, t.Dtype(), t.Shape(), a.dt, p.shape)
			}
		}
		loads = append(loads, load{p, mv[0], mv[1]})
	}
	for _, l := range loads {
		for _, c := range [2][2]*tensor.Dense{{l.p.m, l.m}, {l.p.v, l.v}} {
			dst, src := c[0], c[1]
			if src.IsView() {
				src = src.Materialize().(*tensor.Dense)
			}
			var err error
			if a.dev != nil {
				err = a.dev.Engine().Memcpy(dst, src)
			} else {
				copy(dst.Raw, src.Raw)
			}
			if err != nil {
				return fmt.Errorf("ops: %s: SetState: %s: %w", adamwName, l.p.name, err)
			}
		}
	}
	a.steps = steps
	return nil
}

func (a *AdamW) lookup(vg G.ValueGrad) (i int, ok bool) {
	if vg == nil || !reflect.TypeOf(vg).Comparable() {
		return 0, false
	}
	i, ok = a.index[vg]
	return i, ok
}

// GradNorm returns the 2-norm of the last step's gradients, taken together
// before clipping, as clip_grad_norm_ returns it (NaN or +Inf when they
// held such values). Only steps that clip work it out. On a GPU it waits
// for the step: one read of the device, which a training loop can leave to
// the steps it logs.
func (a *AdamW) GradNorm() (float64, error) {
	if !a.normed {
		return 0, fmt.Errorf("ops: %s: GradNorm: no step has clipped the gradients yet (MaxGradNorm %v)", adamwName, a.cfg.MaxGradNorm)
	}
	if a.dev != nil {
		return a.deviceNorm()
	}
	return a.norm, nil
}

// Free gives the device memory of the state back (a no-op on the host).
// The optimiser cannot step after it.
func (a *AdamW) Free() error {
	if a.freed {
		return nil
	}
	a.freed = true
	if a.dev == nil {
		return nil
	}
	return a.freeDevice()
}

// adamwStepParam is a parameter of one step, checked.
type adamwStepParam struct {
	*adamwParam
	val, grad *tensor.Dense
}

// Step makes one AdamW step on the parameters of model, each of which must
// be in one of the groups (once): clipping (if asked) over their gradients,
// then the update of their values and moments in place. Parameters of the
// groups that model leaves out are left alone. When model is refused (a
// parameter of no group or twice, a value or gradient of the wrong shape,
// dtype or place) nothing has changed.
func (a *AdamW) Step(model []G.ValueGrad) error {
	if a.freed {
		return fmt.Errorf("ops: %s: Step after Free", adamwName)
	}
	if len(model) == 0 {
		return nil
	}
	ps := make([]adamwStepParam, len(model))
	seen := make([]int, len(a.params))
	for k, vg := range model {
		i, ok := a.lookup(vg)
		if !ok {
			return fmt.Errorf("ops: %s: model[%d] (%s) is in no parameter group", adamwName, k, describeParam(vg))
		}
		if seen[i] != 0 {
			return fmt.Errorf("ops: %s: model[%d] and model[%d] are both %s", adamwName, seen[i]-1, k, a.params[i].name)
		}
		seen[i] = k + 1
		sp, err := a.checkStepParam(a.params[i])
		if err != nil {
			return err
		}
		ps[k] = sp
	}
	if a.dev != nil {
		if err := a.checkDeviceState(); err != nil {
			return err
		}
	}
	a.steps++
	if a.dev != nil {
		return a.stepDevice(ps)
	}
	a.stepHost(ps)
	return nil
}

// checkStepParam checks a parameter's value and gradient as Step finds
// them: tensors of its shape and the optimiser's dtype and place.
func (a *AdamW) checkStepParam(p *adamwParam) (adamwStepParam, error) {
	val, ok := p.vg.Value().(*tensor.Dense)
	if !ok || val == nil {
		return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its value must be a *tensor.Dense, got %T", adamwName, p.name, p.vg.Value())
	}
	gv, err := p.vg.Grad()
	if err != nil {
		return adamwStepParam{}, fmt.Errorf("ops: %s: %s has no gradient: %w", adamwName, p.name, err)
	}
	grad, ok := gv.(*tensor.Dense)
	if !ok || grad == nil {
		return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its gradient must be a *tensor.Dense, got %T", adamwName, p.name, gv)
	}
	for _, t := range []struct {
		what string
		d    *tensor.Dense
	}{{"value", val}, {"gradient", grad}} {
		if t.d.Dtype() != a.dt {
			return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s has dtype %v, want %v", adamwName, p.name, t.what, t.d.Dtype(), a.dt)
		}
		if !t.d.Shape().Eq(p.shape) {
			return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s has shape %v, want %v", adamwName, p.name, t.what, t.d.Shape(), p.shape)
		}
		if a.dev != nil {
			seen := &p.seenVal
			if t.what == "gradient" {
				seen = &p.seenGrad
			}
			if seen.same(t.d) {
				continue
			}
			// A gradient is a new tensor every step: one lookup (Ptr
			// takes only memory live on its Device) finds it on the
			// optimiser's device; the checks below only explain a
			// refusal.
			if ptr, err := a.dev.Ptr(t.d); err == nil {
				seen.see(t.d, ptr)
				continue
			}
			if !backend.IsDevice(t.d) {
				return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s is in host memory, the optimiser's state on %v", adamwName, p.name, t.what, a.dev)
			}
			d, err := backend.DeviceOf(t.d)
			if err != nil || d != a.dev {
				return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s is not on %v, where the optimiser's state is", adamwName, p.name, t.what, a.dev)
			}
			ptr, err := a.dev.Ptr(t.d)
			if err != nil {
				return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s: %w", adamwName, p.name, t.what, err)
			}
			seen.see(t.d, ptr)
			continue
		}
		if backend.IsDevice(t.d) {
			return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s is on a device, the optimiser's state in host memory", adamwName, p.name, t.what)
		}
		if t.d.IsView() || !t.d.DataOrder().IsRowMajor() {
			return adamwStepParam{}, fmt.Errorf("ops: %s: %s: its %s is a view: the step updates it in place", adamwName, p.name, t.what)
		}
	}
	return adamwStepParam{adamwParam: p, val: val, grad: grad}, nil
}

// stepScalars returns the scalars of the current step for each group.
func (a *AdamW) stepScalars() []kernels.AdamWScalars {
	s := make([]kernels.AdamWScalars, len(a.lr))
	for g := range s {
		s[g] = kernels.NewAdamWScalars(a.cfg.Beta1, a.cfg.Beta2, a.cfg.Eps, a.lr[g], a.wd[g], a.steps)
	}
	return s
}

// stepHost is Step on the host: the CPU twins.
func (a *AdamW) stepHost(ps []adamwStepParam) {
	switch a.dt {
	case tensor.Float32:
		stepHostOf[float32](a, ps)
	default:
		stepHostOf[float64](a, ps)
	}
}

func stepHostOf[T kernels.Float](a *AdamW, ps []adamwStepParam) {
	grads := make([][]T, len(ps))
	for i, p := range ps {
		grads[i] = floatsOf[T]([]*tensor.Dense{p.grad})[0]
	}
	clip := a.cfg.MaxGradNorm > 0
	coef := 1.0
	if clip {
		a.norm = kernels.AdamWNorm(grads)
		a.normed = true
		coef = kernels.AdamWClipCoef(a.norm, a.cfg.MaxGradNorm)
	}
	scalars := a.stepScalars()
	for i, p := range ps {
		s := floatsOf[T]([]*tensor.Dense{p.val, p.m, p.v})
		kernels.AdamWUpdate(scalars[p.group], coef, clip, !a.cfg.KeepGrads, s[0], grads[i], s[1], s[2])
	}
}

// errAdamWFreed is the error of a device state a Scope has freed.
var errAdamWFreed = errors.New("its device state was freed by a backend.Scope's End: make the optimiser before BeginScope")

// ParamsWithGrads pairs each parameter node with its gradient node, in the
// order G.Grad(loss, params...) returns them, as the gorgonia.ValueGrad
// values AdamW's groups and Step take. It is how a graph whose parameters
// live on a device meets its optimiser: gorgonia's BindDualValues keeps
// gradients in host memory and refuses device parameters, so there the
// gradient a step reads is the gradient node's value after the run. Every
// run computes those gradients afresh, so AdamWConfig.KeepGrads spares the
// step zeroing them.
//
//	grads, _ := G.Grad(loss, params...)
//	pg, _ := ops.ParamsWithGrads(params, grads)
//	cfg := ops.DefaultAdamWConfig()
//	cfg.KeepGrads = true
//	opt, _ := ops.NewAdamW([]ops.ParamGroup{{Params: pg, LR: 1e-4}}, cfg)
//	// per step: m.RunAll(); opt.Step(pg); m.Reset()
func ParamsWithGrads(params, grads G.Nodes) ([]G.ValueGrad, error) {
	const op = "ParamsWithGrads"
	if len(params) != len(grads) {
		return nil, fmt.Errorf("ops: %s: %d parameters and %d gradients: pass G.Grad's result for these parameters", op, len(params), len(grads))
	}
	out := make([]G.ValueGrad, len(params))
	for i, p := range params {
		g := grads[i]
		switch {
		case p == nil || g == nil:
			return nil, fmt.Errorf("ops: %s: parameter %d or its gradient is nil", op, i)
		case !p.IsVar():
			return nil, fmt.Errorf("ops: %s: %s is not an input node (a parameter is made with G.NewTensor or G.NodeFromAny)", op, nodeName(p))
		case !p.Shape().Eq(g.Shape()) || !p.Dtype().Eq(g.Dtype()):
			return nil, fmt.Errorf("ops: %s: %s is %v %v but its gradient %s is %v %v: is it G.Grad's gradient of this parameter?",
				op, nodeName(p), p.Dtype(), p.Shape(), nodeName(g), g.Dtype(), g.Shape())
		}
		out[i] = paramWithGrad{p, g}
	}
	return out, nil
}

// paramWithGrad is a parameter node and its gradient node. It is
// comparable, so that AdamW can tell parameters apart by it.
type paramWithGrad struct{ param, grad *G.Node }

// Name is the parameter's name, which AdamW's errors use.
func (p paramWithGrad) Name() string { return p.param.Name() }

// Value is the parameter's value.
func (p paramWithGrad) Value() G.Value { return p.param.Value() }

// Grad is the gradient node's value from the last run.
func (p paramWithGrad) Grad() (G.Value, error) {
	v := p.grad.Value()
	if v == nil {
		return nil, fmt.Errorf("ops: the gradient of %s has no value: run the machine before the step", p.param.Name())
	}
	return v, nil
}
