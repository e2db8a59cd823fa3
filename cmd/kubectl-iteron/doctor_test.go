package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The doctor's findings on real objects, and this command run on them, are
// tested in test/doctor against a real API server; these are the failures
// that need none.
func TestDoctorUsageAndUnreachable(t *testing.T) {
	dir := t.TempDir()
	unreachable := filepath.Join(dir, "unreachable")
	// Port 1 on loopback: nothing listens, the connection is refused at once.
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "t"}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: team}
current-context: x
`
	if err := os.WriteFile(unreachable, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no activation named is a usage error", []string{"doctor"}, "accepts 1 arg(s), received 0"},
		{"two activations named is a usage error", []string{"doctor", "a", "b"}, "accepts 1 arg(s), received 2"},
		{"an output other than text or json is a usage error", []string{"doctor", "a", "-o", "yaml"}, `--output must be text or json, not "yaml"`},
		{"a kubeconfig that does not exist is a usage error", []string{"doctor", "a", "--kubeconfig", filepath.Join(dir, "absent")}, "kubeconfig: stat"},
		{"a request timeout that is not positive is a usage error", []string{"doctor", "a", "--kubeconfig", unreachable, "--request-timeout", "0s"}, "--request-timeout must be positive"},
		{"an API server that does not answer is exit 2 with the address", []string{"doctor", "a", "--kubeconfig", unreachable, "--request-timeout", "5s"}, "127.0.0.1:1"},
		{"the context's namespace is the default namespace", []string{"doctor", "a", "--kubeconfig", unreachable, "--request-timeout", "5s"}, "ImplementationActivation team/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tt.args...)
			if code != exitUsage || out != "" || !strings.Contains(errOut, tt.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and a stderr saying %q", code, out, errOut, tt.stderr)
			}
		})
	}
}
