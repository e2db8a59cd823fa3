package sandbox

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// LauncherName is the launcher's executable name; --sandbox-launcher
// defaults to it beside the running executable.
const LauncherName = "iteron-sandbox"

// Flags are the sandbox flags of the manager and the survivor (and
// `kubectl iteron conformance`): one set, parsed one way.
type Flags struct {
	mode, launcher, readOnly  string
	maxMemory, maxCPU, maxTmp string
	maxTasks                  int64
}

// Register adds --sandbox, --sandbox-launcher, --sandbox-read-only-paths
// and the --sandbox-max-* ceilings to fs, with def as --sandbox's default.
func (f *Flags) Register(fs *flag.FlagSet, def Mode) {
	fs.StringVar(&f.mode, "sandbox", string(def), "how providers are sandboxed: enforce (every kernel rule their capabilities map to, and their bounds), audit (the bounds only; what enforce refuses is allowed, logged and counted) or off (docs/security.md)")
	fs.StringVar(&f.launcher, "sandbox-launcher", "", "the "+LauncherName+" executable (default: "+LauncherName+" beside this executable, else on PATH)")
	fs.StringVar(&f.readOnly, "sandbox-read-only-paths", strings.Join(DefaultReadOnlyPaths, ","), "comma-separated node paths a sandboxed provider sees, read-only (those the node lacks are skipped)")
	fs.StringVar(&f.maxMemory, "sandbox-max-memory", resource.NewQuantity(DefaultMaxMemoryBytes, resource.BinarySI).String(), "the most memory a source may ask for one provider (spec.sources[].sandbox.memory); the default is 512Mi or this, the lower")
	fs.StringVar(&f.maxCPU, "sandbox-max-cpu", resource.NewMilliQuantity(DefaultMaxCPUMillis, resource.DecimalSI).String(), "the most CPU a source may ask for one provider (spec.sources[].sandbox.cpu); the default is 1 or this, the lower")
	fs.Int64Var(&f.maxTasks, "sandbox-max-tasks", DefaultMaxTasks, "the most tasks (processes and threads) a source may ask for one provider (spec.sources[].sandbox.tasks); the default is 256 or this, the lower")
	fs.StringVar(&f.maxTmp, "sandbox-max-tmp", resource.NewQuantity(DefaultMaxTmpBytes, resource.BinarySI).String(), "the largest private /tmp a source may ask for one provider (spec.sources[].sandbox.tmp); the default is 64Mi or this, the lower")
}

// FlagError is a bad sandbox flag: the flag, the value and why.
type FlagError struct{ Flag, Value, Why string }

func (e *FlagError) Error() string { return fmt.Sprintf("--%s=%q: %s", e.Flag, e.Value, e.Why) }

// Parsed returns the policy and the launcher's path the flags say. The
// launcher is required unless the mode is off, and must be an existing
// regular file.
func (f *Flags) Parsed() (Policy, string, error) {
	mode, err := ParseMode(f.mode)
	if err != nil {
		return Policy{}, "", &FlagError{"sandbox", f.mode, "must be enforce, audit or off"}
	}
	p := Policy{Mode: mode}
	quantity := func(flag, v string, milli bool) (int64, error) {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return 0, &FlagError{flag, v, "must be a positive quantity (for example 4Gi, or 2 and 500m for CPU)"}
		}
		if milli {
			return q.MilliValue(), nil
		}
		return q.Value(), nil
	}
	if p.Ceiling.MemoryBytes, err = quantity("sandbox-max-memory", f.maxMemory, false); err != nil {
		return Policy{}, "", err
	}
	if p.Ceiling.CPUMillis, err = quantity("sandbox-max-cpu", f.maxCPU, true); err != nil {
		return Policy{}, "", err
	}
	if p.Ceiling.TmpBytes, err = quantity("sandbox-max-tmp", f.maxTmp, false); err != nil {
		return Policy{}, "", err
	}
	if f.maxTasks <= 0 {
		return Policy{}, "", &FlagError{"sandbox-max-tasks", strconv.FormatInt(f.maxTasks, 10), "must be positive"}
	}
	p.Ceiling.Tasks = f.maxTasks
	p.ReadOnlyPaths = []string{}
	for _, path := range strings.Split(f.readOnly, ",") {
		if path == "" {
			continue
		}
		if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
			return Policy{}, "", &FlagError{"sandbox-read-only-paths", f.readOnly, fmt.Sprintf("%q must be an absolute, clean path other than /", path)}
		}
		p.ReadOnlyPaths = append(p.ReadOnlyPaths, path)
	}
	if err := p.Check(); err != nil {
		return Policy{}, "", &FlagError{"sandbox", f.mode, err.Error()}
	}
	if mode == ModeOff {
		return p, "", nil
	}
	launcher := f.launcher
	if launcher == "" {
		self, err := os.Executable()
		if err != nil {
			return Policy{}, "", &FlagError{"sandbox-launcher", "", "cannot find this executable to look beside it: " + err.Error()}
		}
		launcher = filepath.Join(filepath.Dir(self), LauncherName)
		if _, err := os.Stat(launcher); err != nil {
			if onPath, err := exec.LookPath(LauncherName); err == nil {
				if abs, err := filepath.Abs(onPath); err == nil {
					launcher = abs
				}
			}
		}
	}
	if !filepath.IsAbs(launcher) {
		return Policy{}, "", &FlagError{"sandbox-launcher", launcher, "must be an absolute path"}
	}
	if fi, err := os.Stat(launcher); err != nil || !fi.Mode().IsRegular() {
		why := "is not a regular file"
		if err != nil {
			why = err.Error()
		}
		return Policy{}, "", &FlagError{"sandbox-launcher", launcher, why + " (build it with `make build`, or pass --sandbox=off to start providers unsandboxed)"}
	}
	return p, launcher, nil
}
