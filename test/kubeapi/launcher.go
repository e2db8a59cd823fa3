package kubeapi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildSandboxLauncher builds the sandbox launcher (cmd/iteron-sandbox,
// without cgo) into dir, where a manager or survivor binary built into dir
// finds it by default (--sandbox-launcher): the suites that run the built
// binaries run them sandboxed, as a node does.
func BuildSandboxLauncher(repoRoot, dir string) error {
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "iteron-sandbox"), filepath.Join(repoRoot, "cmd", "iteron-sandbox"))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the sandbox launcher: %v\n%s", err, out)
	}
	return nil
}
