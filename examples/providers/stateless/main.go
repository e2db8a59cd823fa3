// Command stateless is the example protocol-1 provider: a run's input
// {"text":"abc"} gives the terminal observation {"length":3,"upper":"ABC"}.
//
// For the executor's tests it also reports its own view of the process on
// {"introspect":true}: argv, environment, credentials, NoNewPrivs, capability
// sets and working directory, as the kernel shows them to the provider.
//
// With the argument --wrong it answers every run wrongly but well formed
// ({"text":"abc"} gives {"length":3,"upper":"abc"}): a release with a bug
// that no crash or protocol check sees, for the fleet's probes to catch.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"

	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/provider"
	"iteron.dev/operator/pkg/strictjson"
)

// build names the build, set with -ldflags "-X main.build=…" to make
// binaries whose bytes differ (the executor's tests race two of them).
var build = "A"

type stateless struct {
	// wrong: --wrong, the upper case is not applied.
	wrong bool
}

type input struct {
	Text       string `json:"text"`
	Introspect bool   `json:"introspect,omitzero"`
}

func (stateless) Load(ctx context.Context, load *provider.Load) error { return nil }

func (s stateless) Start(ctx context.Context, run *provider.Run) error {
	var in input
	if err := strictjson.Decode(run.Input, &in, protocol.MaxPayloadBytes); err != nil {
		return run.EmitValue(map[string]string{"error": "input: " + err.Error()}, true)
	}
	if in.Introspect {
		return run.EmitValue(introspect(), true)
	}
	upper := strings.ToUpper(in.Text)
	if s.wrong {
		upper = in.Text
	}
	return run.EmitValue(map[string]any{"length": len(in.Text), "upper": upper}, true)
}

func (stateless) Cancel(ctx context.Context, runID, reason string) error { return nil }

// View is the process as the provider sees it.
type View struct {
	Build      string            `json:"build"`
	Argv       []string          `json:"argv"`
	Env        []string          `json:"env"`
	UID        int               `json:"uid"`
	EUID       int               `json:"euid"`
	GID        int               `json:"gid"`
	EGID       int               `json:"egid"`
	Groups     []int             `json:"groups"`
	Cwd        string            `json:"cwd"`
	NoNewPrivs string            `json:"no_new_privs"`
	Caps       map[string]string `json:"caps"`
}

func introspect() View {
	v := View{Build: build, Argv: os.Args, Env: os.Environ(), UID: os.Getuid(), EUID: os.Geteuid(), GID: os.Getgid(), EGID: os.Getegid(), Caps: map[string]string{}}
	v.Groups, _ = os.Getgroups()
	if v.Groups == nil {
		v.Groups = []int{}
	}
	v.Cwd, _ = os.Getwd()
	if f, err := os.Open("/proc/self/status"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			name, value, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			value = strings.TrimSpace(value)
			switch {
			case name == "NoNewPrivs":
				v.NoNewPrivs = value
			case strings.HasPrefix(name, "Cap"):
				v.Caps[name] = value
			}
		}
		f.Close()
	}
	return v
}

func main() {
	p := stateless{}
	for _, a := range os.Args[1:] {
		if a == "--wrong" {
			p.wrong = true
		}
	}
	if err := provider.Serve(context.Background(), os.Stdin, os.Stdout, p); err != nil {
		fmt.Fprintf(os.Stderr, "stateless: %v\n", err)
		os.Exit(1)
	}
}
