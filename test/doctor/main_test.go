package doctor_test

import (
	"os"
	"testing"

	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

// The suite runs the real controllers in-process against a real
// kube-apiserver, as the manager's service account with the generated RBAC
// and the Generation admission policy, with real providers, and diagnoses
// the objects they write: with the doctor package directly, and with the
// kubectl-iteron binary built from this tree.
const (
	testNode = "test-node"
)

var (
	env          *kubeapi.Environment
	stateDir     string
	providersDir string
	cliBin       string
	kubeconfig   string
)

func TestMain(m *testing.M) {
	os.Exit(operatortest.Run(m, "doctor", testNode, func(s *operatortest.Suite) {
		env, stateDir, providersDir, cliBin, kubeconfig = s.Env, s.StateDir, s.ProvidersDir, s.CLI, s.Kubeconfig
	}))
}
