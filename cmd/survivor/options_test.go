package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/internal/sandbox"
)

func TestBadFlagsAreRefusedNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--state-dir=relative"}, `--state-dir="relative": must be an absolute, clean path`},
		{[]string{"--state-dir=/" + strings.Repeat("d", 100)}, "--state-dir=" + `"/` + strings.Repeat("d", 100) + `": leaves the control socket`},
		{[]string{"--gateway-socket=/run/../x.sock"}, `--gateway-socket="/run/../x.sock": must be an absolute, clean path`},
		{[]string{"--gateway-socket=/" + strings.Repeat("s", 110)}, "is 111 bytes; a unix socket path is at most 107"},
		{[]string{"--gateway-group=-1"}, `--gateway-group="-1": must be a gid`},
		{[]string{"--provider-uid=0"}, `--provider-uid="0": must not be 0: providers never run as root`},
		{[]string{"--manager-uid=x"}, `--manager-uid="x": must be a number`},
		{[]string{"--interpreters=/bin/sh,sh"}, `--interpreters="/bin/sh,sh": "sh" must be an absolute, clean path`},
		{[]string{"--checkpoint-timeout=0s"}, `--checkpoint-timeout="0s": must be in (0, 5m]`},
		{[]string{"extra"}, `unexpected arguments: ["extra"]`},
		{[]string{"--sandbox=permissive"}, `--sandbox="permissive": must be enforce, audit or off`},
		{[]string{"--sandbox-launcher=/nonexistent"}, `--sandbox-launcher="/nonexistent"`},
	} {
		_, err := parseOptions(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v; want an error containing %q", tc.args, err, tc.want)
			continue
		}
		t.Logf("%v: %v", tc.args, err)
	}
	launcher := filepath.Join(t.TempDir(), "iteron-sandbox")
	os.WriteFile(launcher, []byte("x"), 0o755)
	o, err := parseOptions([]string{"--sandbox-launcher=" + launcher}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.stateDir != "/var/lib/iteron/state" || o.gatewaySocket != "/run/iteron/gateway.sock" || o.providerUID != 65534 || o.managerUID != 0 ||
		o.sandbox.Mode != sandbox.ModeEnforce || o.launcher != launcher {
		t.Fatalf("defaults: %+v", o)
	}
}
