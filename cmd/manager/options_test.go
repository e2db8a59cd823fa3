package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"iteron.dev/operator/internal/sandbox"
)

func TestParseOptionsRefusesBadValuesNamingTheFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"an allowed root that contains the state dir", []string{"--state-dir=/var/lib/iteron/state", "--allowed-roots=/var/lib/iteron"}, "--allowed-roots"},
		{"an allowed root inside the state dir", []string{"--state-dir=/srv/state", "--allowed-roots=/srv/state/providers"}, "overlaps --state-dir"},
		{"an allowed root equal to the state dir", []string{"--state-dir=/srv/x", "--allowed-roots=/opt/p,/srv/x"}, "overlaps"},
		{"a relative allowed root", []string{"--allowed-roots=providers"}, "--allowed-roots"},
		{"a state dir with a dot segment", []string{"--state-dir=/var/lib/../state"}, "--state-dir"},
		{"the root as state dir", []string{"--state-dir=/"}, "--state-dir"},
		{"a relative interpreter", []string{"--interpreters=sh"}, "--interpreters"},
		{"a provider uid of 0", []string{"--provider-uid=0"}, "providers never run as root"},
		{"a negative provider gid", []string{"--provider-gid=-1"}, "--provider-gid"},
		{"a gateway socket path over 107 bytes", []string{"--gateway-socket=/" + strings.Repeat("s", 107)}, "at most 107"},
		{"a gateway allow rule without a kind", []string{"--gateway-allow=1000=default"}, "--gateway-allow"},
		{"a gateway allow rule with a bad namespace", []string{"--gateway-allow=uid:1000=Default"}, "not a namespace name"},
		{"an unknown capability", []string{"--capability-ceiling=read_only,root"}, `unknown capability "root"`},
		{"an empty node name", []string{"--node-name="}, "--node-name"},
		{"a relative graph file", []string{"--graph=graph.json"}, "--graph"},
		{"a graph file that does not exist", []string{"--graph=/nonexistent/graph.json"}, "no such file"},
		{"a stray argument", []string{"extra"}, "unexpected arguments"},
		{"no parallel activation at all", []string{"--max-parallel-activations=0"}, "--max-parallel-activations=\"0\": must be at least 1"},
		{"a negative API rate", []string{"--kube-api-qps=-5"}, "--kube-api-qps"},
		{"an API rate that is not a number", []string{"--kube-api-qps=NaN"}, "--kube-api-qps=\"NaN\": must be a positive number"},
		{"an API burst of zero", []string{"--kube-api-burst=0"}, "--kube-api-burst"},
		{"an unknown sandbox mode", []string{"--sandbox=strict"}, `--sandbox="strict": must be enforce, audit or off`},
		{"a sandbox memory ceiling that is not a quantity", []string{"--sandbox=off", "--sandbox-max-memory=lots"}, "--sandbox-max-memory"},
		{"a sandbox CPU ceiling of zero", []string{"--sandbox=off", "--sandbox-max-cpu=0"}, "--sandbox-max-cpu"},
		{"a relative read-only path", []string{"--sandbox=off", "--sandbox-read-only-paths=/usr,etc"}, "--sandbox-read-only-paths"},
		{"a sandbox launcher that does not exist", []string{"--sandbox-launcher=/nonexistent/iteron-sandbox"}, "--sandbox=off to start providers unsandboxed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseOptions(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseOptions(%q) error = %v; want it to contain %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestParseOptionsDefaults(t *testing.T) {
	launcher := filepath.Join(t.TempDir(), "iteron-sandbox")
	os.WriteFile(launcher, []byte("x"), 0o755)
	o, err := parseOptions([]string{"--sandbox-launcher=" + launcher}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if sb := o.sandbox; sb == nil || sb.Policy.Mode != sandbox.ModeEnforce || sb.Launcher != launcher ||
		sb.Policy.Ceiling != (sandbox.Limits{MemoryBytes: 4 << 30, CPUMillis: 4000, Tasks: 4096, TmpBytes: 1 << 30}) {
		t.Fatalf("sandbox defaults: %+v", o.sandbox)
	}
	if o.stateDir != "/var/lib/iteron/state" || strings.Join(o.allowedRoots, ",") != "/var/lib/iteron/providers" ||
		strings.Join(o.interpreters, ",") != "/bin/sh" || o.providerUID != 65534 || o.providerGID != 65534 ||
		strings.Join(o.capabilityCeiling, ",") != "read_only,reversible_local" || o.nodeName == "" ||
		o.maxParallel != runtime.NumCPU() || o.kubeAPIQPS != 100 || o.kubeAPIBurst != 200 {
		t.Fatalf("defaults: %+v", o)
	}
}

func TestParseOptionsGatewayAllow(t *testing.T) {
	o, err := parseOptions([]string{"--sandbox=off", "--gateway-allow=uid:1000=team-a,team-b", "--gateway-allow=gid:2000=*", "--gateway-allow=uid:1000=team-c"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.gatewayAllow.UIDs[1000], ","); got != "team-a,team-b,team-c" {
		t.Fatalf("uid 1000 → %q", got)
	}
	if got := strings.Join(o.gatewayAllow.GIDs[2000], ","); got != "*" {
		t.Fatalf("gid 2000 → %q", got)
	}
}

func TestStateDirLockFencesASecondManager(t *testing.T) {
	dir := t.TempDir()
	first, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockStateDir(dir); !errors.Is(err, errLocked) {
		t.Fatalf("second lock: %v; want errLocked", err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	_ = again.Release()
}

func TestAnOTELVariableTheManagerCannotUseStopsItAtStartNamingTheVariable(t *testing.T) {
	launcher := filepath.Join(t.TempDir(), "iteron-sandbox")
	os.WriteFile(launcher, []byte("x"), 0o755)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	for _, tc := range []struct{ name, key, value string }{
		{"an unknown protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"},
		{"an unknown sampler", "OTEL_TRACES_SAMPLER", "sometimes"},
		{"a ratio above 1", "OTEL_TRACES_SAMPLER_ARG", "1.5"},
		{"an exporter other than otlp", "OTEL_TRACES_EXPORTER", "zipkin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.key, tc.value)
			if tc.key == "OTEL_TRACES_SAMPLER_ARG" {
				t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
			}
			var stderr strings.Builder
			for _, role := range [][]string{{"--sandbox-launcher=" + launcher, "--state-dir=" + t.TempDir()}, {"--role=fleet"}} {
				stderr.Reset()
				if code := run(role, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tc.key+`="`+tc.value+`"`) {
					t.Fatalf("%v: exit %d, stderr %q; want a usage error naming %s=%q", role, code, stderr.String(), tc.key, tc.value)
				}
			}
		})
	}
}
