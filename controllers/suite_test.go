package controllers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

// The suite runs the real controllers in-process against a real
// kube-apiserver, as the manager's service account with the generated RBAC
// and the Generation admission policy installed, with real providers.
const testNode = "test-node"

var (
	env          *kubeapi.Environment
	coordinator  *hotswap.Coordinator
	stateDir     string
	providersDir string
	cliBin       string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	base, err := os.MkdirTemp("", "iteron-controllers-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	// Provider artifacts (t.TempDir, the providers built for the tests) go
	// under the allowed root; the state dir lies outside it, as the
	// manager's flags require.
	providersDir, stateDir = filepath.Join(base, "providers"), filepath.Join(base, "state")
	for _, d := range []string{providersDir, stateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	os.Setenv("TMPDIR", providersDir)

	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("controller tests run against kube-apiserver %s\n", env.ServerVersion)

	cliBin = filepath.Join(base, "kubectl-iteron")
	if out, err := exec.Command("go", "build", "-o", cliBin, "../cmd/kubectl-iteron").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kubectl-iteron: %v\n%s", err, out)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := startManager(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the manager:", err)
		return 1
	}
	code := m.Run()
	cancel()
	stop()
	return code
}

// startManager runs the controllers in-process (test/operatortest).
func startManager(ctx context.Context) (func(), error) {
	m, err := operatortest.StartManager(ctx, env, operatortest.Options{Node: testNode, StateDir: stateDir, AllowedRoots: []string{providersDir}})
	if err != nil {
		return nil, err
	}
	coordinator = m.Coordinator
	return m.Stop, nil
}
