package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
)

// options are the survivor's validated flags.
type options struct {
	stateDir          string
	gatewaySocket     string
	gatewayGroup      int
	managerUID        uint32
	providerUID       uint32
	providerGID       uint32
	interpreters      []string
	checkpointTimeout time.Duration
	sandbox           sandbox.Policy
	launcher          string // "" with --sandbox=off
}

// flagError is a bad flag value: it names the flag, the value and why.
type flagError struct{ flag, value, why string }

func (e *flagError) Error() string { return fmt.Sprintf("--%s=%q: %s", e.flag, e.value, e.why) }

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("survivor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                  options
		interpreters, managerUID, uid, gid string
	)
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/iteron/state", "the manager's state directory: the survivor's lock, control socket (survivor.sock) and provider records live there, and the manager's lock is checked there")
	fs.StringVar(&o.gatewaySocket, "gateway-socket", "/run/iteron/gateway.sock", "the gateway's unix socket, which the survivor holds and hands to each manager (at most 107 bytes); empty: none")
	fs.IntVar(&o.gatewayGroup, "gateway-group", 0, "group owning the gateway socket (mode 0660): the callers' group")
	fs.StringVar(&managerUID, "manager-uid", "0", "uid the manager connects as (SO_PEERCRED)")
	fs.StringVar(&uid, "provider-uid", "65534", "uid providers run as")
	fs.StringVar(&gid, "provider-gid", "65534", "gid providers run as")
	fs.StringVar(&interpreters, "interpreters", "/bin/sh", "comma-separated absolute interpreter paths a '#!' provider script may name")
	fs.DurationVar(&o.checkpointTimeout, "checkpoint-timeout", 30*time.Second, "on SIGTERM, how long to wait for the manager to checkpoint before the providers are stopped")
	var sandboxFlags sandbox.Flags
	sandboxFlags.Register(fs, sandbox.ModeEnforce)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := absClean("state-dir", o.stateDir); err != nil {
		return nil, err
	}
	if o.gatewaySocket != "" {
		if err := absClean("gateway-socket", o.gatewaySocket); err != nil {
			return nil, err
		}
		if len(o.gatewaySocket) > survivor.MaxSocketPath {
			return nil, &flagError{"gateway-socket", o.gatewaySocket, fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(o.gatewaySocket), survivor.MaxSocketPath)}
		}
	}
	if sock := statedir.Dir(o.stateDir).SurvivorSocket(); len(sock) > survivor.MaxSocketPath {
		return nil, &flagError{"state-dir", o.stateDir, fmt.Sprintf("leaves the control socket %s %d bytes; a unix socket path is at most %d", sock, len(sock), survivor.MaxSocketPath)}
	}
	if o.gatewayGroup < 0 {
		return nil, &flagError{"gateway-group", strconv.Itoa(o.gatewayGroup), "must be a gid (≥ 0)"}
	}
	var err error
	if o.managerUID, err = parseID("manager-uid", managerUID, true); err != nil {
		return nil, err
	}
	if o.providerUID, err = parseID("provider-uid", uid, false); err != nil {
		return nil, err
	}
	if o.providerGID, err = parseID("provider-gid", gid, true); err != nil {
		return nil, err
	}
	for _, p := range strings.Split(interpreters, ",") {
		if err := absClean("interpreters", p); err != nil {
			return nil, &flagError{"interpreters", interpreters, fmt.Sprintf("%q must be an absolute, clean path other than /", p)}
		}
		if !slices.Contains(o.interpreters, p) {
			o.interpreters = append(o.interpreters, p)
		}
	}
	if o.checkpointTimeout <= 0 || o.checkpointTimeout > 5*time.Minute {
		return nil, &flagError{"checkpoint-timeout", o.checkpointTimeout.String(), "must be in (0, 5m]"}
	}
	if o.sandbox, o.launcher, err = sandboxFlags.Parsed(); err != nil {
		return nil, err
	}
	return &o, nil
}

func absClean(name, p string) error {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return &flagError{name, p, "must be an absolute, clean path other than /"}
	}
	return nil
}

func parseID(name, value string, zeroOK bool) (uint32, error) {
	n, err := strconv.ParseUint(value, 10, 32)
	switch {
	case err != nil:
		return 0, &flagError{name, value, "must be a number from 0 to 4294967295"}
	case n == 0 && !zeroOK:
		return 0, &flagError{name, value, "must not be 0: providers never run as root"}
	}
	return uint32(n), nil
}
