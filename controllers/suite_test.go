package controllers_test

import (
	"os"
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
	// kubeconfig reaches the API server as an administrator (for kubectl).
	kubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(operatortest.Run(m, "controller", testNode, func(s *operatortest.Suite) {
		env, coordinator, stateDir, providersDir, cliBin, kubeconfig = s.Env, s.Manager.Coordinator, s.StateDir, s.ProvidersDir, s.CLI, s.Kubeconfig
	}))
}
