package sandbox

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Evidence is what one launch applied: recorded in the ledger with the
// launch (the shadow_load record's note), shown in Generation status and by
// `kubectl iteron doctor`.
type Evidence struct {
	// Mode is the node's mode.
	Mode Mode
	// Level is the level the launch applied.
	Level Level
	// Namespaces are the namespaces the provider got of its own, sorted
	// (cgroup, ipc, mnt, net, pid, uts, user).
	Namespaces []string
	// Network is none (a private, empty namespace) or node.
	Network Network
	// Exec reports whether it may execve programs.
	Exec bool
	// Limits are the bounds applied (zero: not bounded).
	Limits Limits
	// Cgroups is the cgroup layout the bounds were applied on (v1, v2,
	// v1+v2) or "unavailable".
	Cgroups string
	// Seccomp is the digest of the filter's BPF program, or "off".
	Seccomp string
	// Landlock is the Landlock ABI applied, 0 when the kernel has none.
	Landlock int
	// Launcher is the digest of the launcher that built the sandbox.
	Launcher string
}

// Off is the evidence of a launch without the sandbox.
func Off() Evidence {
	return Evidence{Mode: ModeOff, Level: LevelNone, Network: NetworkNode, Exec: true, Cgroups: "unavailable", Seccomp: "off"}
}

// NotePrefix starts the ledger note of a sandboxed launch.
const NotePrefix = "sandbox: "

// String is the evidence as one line of space-separated key=value pairs,
// in a fixed order; ParseEvidence reads it back.
func (e Evidence) String() string {
	var b strings.Builder
	kv := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	kv("mode", string(e.Mode))
	kv("level", e.Level.String())
	ns := "none"
	if len(e.Namespaces) > 0 {
		ns = strings.Join(e.Namespaces, ",")
	}
	kv("ns", ns)
	kv("network", string(e.Network))
	kv("exec", yesNo(e.Exec))
	kv("memory", limit(e.Limits.MemoryBytes, ""))
	kv("cpu", limit(e.Limits.CPUMillis, "m"))
	kv("tasks", limit(e.Limits.Tasks, ""))
	kv("tmp", limit(e.Limits.TmpBytes, ""))
	kv("cgroups", orDefault(e.Cgroups, "unavailable"))
	kv("seccomp", orDefault(e.Seccomp, "off"))
	ll := "unavailable"
	if e.Landlock > 0 {
		ll = strconv.Itoa(e.Landlock)
	}
	kv("landlock", ll)
	if e.Launcher != "" {
		kv("launcher", e.Launcher)
	}
	return b.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func limit(v int64, unit string) string {
	if v <= 0 {
		return "unbounded"
	}
	return strconv.FormatInt(v, 10) + unit
}

// maxEvidenceBytes bounds what ParseEvidence reads (a ledger reason is at
// most 1 KiB).
const maxEvidenceBytes = 1024

// ParseEvidence reads Evidence.String's form back (a ledger note without
// its "sandbox: " prefix). Unknown keys are refused, as are repeated ones.
func ParseEvidence(s string) (Evidence, error) {
	var e Evidence
	if len(s) > maxEvidenceBytes {
		return e, fmt.Errorf("sandbox evidence is %d bytes, more than %d", len(s), maxEvidenceBytes)
	}
	seen := map[string]bool{}
	for _, field := range strings.Fields(s) {
		k, v, ok := strings.Cut(field, "=")
		if !ok || v == "" {
			return e, fmt.Errorf("sandbox evidence: %q is not key=value", field)
		}
		if seen[k] {
			return e, fmt.Errorf("sandbox evidence: %s is given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "mode":
			e.Mode, err = ParseMode(v)
		case "level":
			e.Level, err = ParseLevel(v)
		case "ns":
			if v != "none" {
				e.Namespaces = strings.Split(v, ",")
				if slices.Contains(e.Namespaces, "") {
					err = fmt.Errorf("empty namespace name")
				}
			}
		case "network":
			e.Network = Network(v)
			if e.Network != NetworkNone && e.Network != NetworkNode {
				err = fmt.Errorf("network %q", v)
			}
		case "exec":
			e.Exec, err = parseYesNo(v)
		case "memory":
			e.Limits.MemoryBytes, err = parseLimit(v, "")
		case "cpu":
			e.Limits.CPUMillis, err = parseLimit(v, "m")
		case "tasks":
			e.Limits.Tasks, err = parseLimit(v, "")
		case "tmp":
			e.Limits.TmpBytes, err = parseLimit(v, "")
		case "cgroups":
			e.Cgroups = v
		case "seccomp":
			e.Seccomp = v
		case "landlock":
			if v != "unavailable" {
				e.Landlock, err = strconv.Atoi(v)
				if err == nil && e.Landlock <= 0 {
					err = fmt.Errorf("landlock ABI %d", e.Landlock)
				}
			}
		case "launcher":
			e.Launcher = v
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return Evidence{}, fmt.Errorf("sandbox evidence: %s=%s: %v", k, v, err)
		}
	}
	for _, k := range []string{"mode", "level", "network", "seccomp"} {
		if !seen[k] {
			return Evidence{}, fmt.Errorf("sandbox evidence: %s is missing", k)
		}
	}
	return e, nil
}

func parseYesNo(v string) (bool, error) {
	switch v {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	}
	return false, fmt.Errorf("want yes or no")
}

func parseLimit(v, unit string) (int64, error) {
	if v == "unbounded" {
		return 0, nil
	}
	n, err := strconv.ParseInt(strings.TrimSuffix(v, unit), 10, 64)
	if err != nil || n <= 0 || (unit != "" && !strings.HasSuffix(v, unit)) {
		return 0, fmt.Errorf("not a positive number%s", unit)
	}
	return n, nil
}
