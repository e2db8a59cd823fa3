package sandbox

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

// Mode is how a node applies the sandbox (the manager's and the survivor's
// --sandbox).
type Mode string

const (
	// ModeEnforce applies every rule: namespaces, private root, seccomp,
	// Landlock and the cgroup bounds.
	ModeEnforce Mode = "enforce"
	// ModeAudit applies the cgroup bounds and refuses nothing else: the
	// syscalls the enforced sandbox would refuse (network use without
	// irreversible_external, exec without code_executing, the syscalls
	// the profile removes) are allowed, logged and counted per provider.
	// For finding the providers an upgrade to enforce would break.
	ModeAudit Mode = "audit"
	// ModeOff launches providers as before the sandbox: uid 65534,
	// no_new_privs, an empty environment and a process group of their own.
	ModeOff Mode = "off"
)

// ParseMode parses --sandbox.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeEnforce, ModeAudit, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a sandbox mode (enforce, audit or off)", s)
}

// Level orders what a launch applies, so that a source can require a
// minimum (spec.sources[].sandbox.require) and a node that cannot give it
// refuses the launch.
type Level int

const (
	// LevelNone: the launch guarantees only (uid, no_new_privs, empty
	// environment, own process group).
	LevelNone Level = iota
	// LevelLimits: and the cgroup bounds on memory, CPU and tasks.
	LevelLimits
	// LevelIsolated: and every rule of the capability table (namespaces,
	// private root, seccomp, Landlock).
	LevelIsolated
)

var levelNames = [...]string{"none", "limits", "isolated"}

// String is the level's name.
func (l Level) String() string {
	if l < 0 || int(l) >= len(levelNames) {
		return "level(" + strconv.Itoa(int(l)) + ")"
	}
	return levelNames[l]
}

// ParseLevel parses a level name ("" is LevelNone: nothing required).
func ParseLevel(s string) (Level, error) {
	if s == "" {
		return LevelNone, nil
	}
	for i, n := range levelNames {
		if strings.EqualFold(s, n) {
			return Level(i), nil
		}
	}
	return 0, fmt.Errorf("%q is not a sandbox level (none, limits or isolated)", s)
}

// Limits bound one provider. A zero field takes the node's default.
type Limits struct {
	// MemoryBytes bounds its memory (no swap).
	MemoryBytes int64
	// CPUMillis bounds its CPU time in thousandths of a CPU.
	CPUMillis int64
	// Tasks bounds its processes and threads together.
	Tasks int64
	// TmpBytes bounds its private /tmp.
	TmpBytes int64
}

// The defaults a provider gets when its source asks for nothing: well below
// a node's size, and what real Go and JVM providers still run under.
const (
	DefaultMemoryBytes = 512 << 20
	DefaultTasks       = 256
	DefaultTmpBytes    = 64 << 20
)

// DefaultCPUMillis is the default CPU bound: one CPU, or a quarter of the
// node's CPUs on a node of fewer than four (at least 100m), so that one
// spinning provider never takes half of a small node.
var DefaultCPUMillis = int64(min(1000, max(100, runtime.NumCPU()*250)))

// The default node-wide ceilings (the most a source may ask).
const (
	DefaultMaxMemoryBytes = 4 << 30
	DefaultMaxCPUMillis   = 4000
	DefaultMaxTasks       = 4096
	DefaultMaxTmpBytes    = 1 << 30
)

// DefaultLimits are the defaults as Limits.
func DefaultLimits() Limits {
	return Limits{MemoryBytes: DefaultMemoryBytes, CPUMillis: DefaultCPUMillis, Tasks: DefaultTasks, TmpBytes: DefaultTmpBytes}
}

// DefaultCeiling is the default node-wide ceiling as Limits.
func DefaultCeiling() Limits {
	return Limits{MemoryBytes: DefaultMaxMemoryBytes, CPUMillis: DefaultMaxCPUMillis, Tasks: DefaultMaxTasks, TmpBytes: DefaultMaxTmpBytes}
}

// Policy is a node's sandbox policy (flags of the manager and the
// survivor).
type Policy struct {
	// Mode is --sandbox.
	Mode Mode
	// Defaults are what a source that asks for nothing gets (zero fields:
	// DefaultLimits').
	Defaults Limits
	// Ceiling is the most a source may ask (--sandbox-max-*; zero fields:
	// DefaultCeiling's).
	Ceiling Limits
	// ReadOnlyPaths are the node's paths a provider sees read-only
	// (default DefaultReadOnlyPaths).
	ReadOnlyPaths []string
}

// withDefaults fills the zero fields of p.
func (p Policy) withDefaults() Policy {
	fill := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	if p.Mode == "" {
		p.Mode = ModeEnforce
	}
	c, d := DefaultCeiling(), DefaultLimits()
	fill(&p.Ceiling.MemoryBytes, c.MemoryBytes)
	fill(&p.Ceiling.CPUMillis, c.CPUMillis)
	fill(&p.Ceiling.Tasks, c.Tasks)
	fill(&p.Ceiling.TmpBytes, c.TmpBytes)
	// A built-in default never exceeds the node's ceiling (a node that
	// lowers --sandbox-max-memory lowers the default with it).
	fill(&p.Defaults.MemoryBytes, min(d.MemoryBytes, p.Ceiling.MemoryBytes))
	fill(&p.Defaults.CPUMillis, min(d.CPUMillis, p.Ceiling.CPUMillis))
	fill(&p.Defaults.Tasks, min(d.Tasks, p.Ceiling.Tasks))
	fill(&p.Defaults.TmpBytes, min(d.TmpBytes, p.Ceiling.TmpBytes))
	if p.ReadOnlyPaths == nil {
		p.ReadOnlyPaths = DefaultReadOnlyPaths
	}
	return p
}

// Check refuses a policy whose defaults exceed its ceiling, or whose
// values are not positive.
func (p Policy) Check() error {
	p = p.withDefaults()
	if _, err := ParseMode(string(p.Mode)); err != nil {
		return err
	}
	for _, f := range []struct {
		name       string
		def, limit int64
	}{
		{"memory", p.Defaults.MemoryBytes, p.Ceiling.MemoryBytes},
		{"cpu", p.Defaults.CPUMillis, p.Ceiling.CPUMillis},
		{"tasks", p.Defaults.Tasks, p.Ceiling.Tasks},
		{"tmp", p.Defaults.TmpBytes, p.Ceiling.TmpBytes},
	} {
		if f.def < 0 || f.limit < 0 {
			return fmt.Errorf("sandbox %s bound must be positive (default %d, ceiling %d)", f.name, f.def, f.limit)
		}
		if f.def > f.limit {
			return fmt.Errorf("the default sandbox %s bound %d exceeds the node's ceiling %d", f.name, f.def, f.limit)
		}
	}
	for _, path := range p.ReadOnlyPaths {
		if !strings.HasPrefix(path, "/") || path == "/" {
			return fmt.Errorf("read-only path %q must be absolute and not /", path)
		}
	}
	return nil
}

// Request is what a source asks of the sandbox (spec.sources[].sandbox),
// carried by its launch plan.
type Request struct {
	// Require is the least level the launch must apply.
	Require Level
	// Limits are the bounds it asks; zero fields take the node's defaults.
	Limits Limits
}

// limitsFor resolves req's limits against the policy: defaults filled,
// and a request above the ceiling refused, naming the field.
func (p Policy) limitsFor(req Limits) (Limits, error) {
	out := req
	for _, f := range []struct {
		field, flag string
		v           *int64
		def, max    int64
	}{
		{"memory", "--sandbox-max-memory", &out.MemoryBytes, p.Defaults.MemoryBytes, p.Ceiling.MemoryBytes},
		{"cpu", "--sandbox-max-cpu", &out.CPUMillis, p.Defaults.CPUMillis, p.Ceiling.CPUMillis},
		{"tasks", "--sandbox-max-tasks", &out.Tasks, p.Defaults.Tasks, p.Ceiling.Tasks},
		{"tmp", "--sandbox-max-tmp", &out.TmpBytes, p.Defaults.TmpBytes, p.Ceiling.TmpBytes},
	} {
		switch {
		case *f.v < 0:
			return Limits{}, &Error{Field: "sandbox." + f.field, Detail: fmt.Sprintf("%d is negative", *f.v)}
		case *f.v == 0:
			*f.v = f.def
		case *f.v > f.max:
			return Limits{}, &Error{Field: "sandbox." + f.field, Detail: fmt.Sprintf("%s asks %s, more than this node's ceiling %s (%s)", f.field, formatLimit(f.field, *f.v), formatLimit(f.field, f.max), f.flag)}
		}
	}
	return out, nil
}

func formatLimit(field string, v int64) string {
	switch field {
	case "cpu":
		return strconv.FormatInt(v, 10) + "m"
	case "tasks":
		return strconv.FormatInt(v, 10)
	}
	return strconv.FormatInt(v, 10) + " bytes"
}

// Error is a launch the sandbox refuses: the node cannot give what the
// source requires. Nothing was started.
type Error struct {
	// Field names what cannot be given (sandbox.require, sandbox.memory, …).
	Field string
	// Detail says what and why.
	Detail string
}

func (e *Error) Error() string { return e.Field + ": " + e.Detail }
