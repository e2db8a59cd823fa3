package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	caminopb "iteron.dev/operator/api/quixos/camino"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/sandbox"
)

// packageRuntimeFlags are the flags of `conformance --kind package-runtime`.
type packageRuntimeFlags struct {
	artifactRoot string
	invoke       []string
	watch        []string
	ceiling      string
	namespace    string
}

// exportInputs parses EXPORT=JSON (or EXPORT alone, for {}) flags into
// inputs, checking each export against the manifest.
func exportInputs(flag string, values []string, m catalog.PackageRuntimeManifest) (map[string]map[string]*caminopb.Value, error) {
	out := map[string]map[string]*caminopb.Value{}
	for _, v := range values {
		export, input, found := strings.Cut(v, "=")
		if !found {
			input = "{}"
		}
		if !m.HasExport(export) {
			return nil, fmt.Errorf("--%s %s: %q is not one of the manifest's export_ids %v", flag, v, export, m.ExportIDs)
		}
		in, err := pkgruntime.MapFromJSON([]byte(input), int(m.Limits.MaxMessageBytes))
		if err != nil {
			return nil, fmt.Errorf("--%s %s: the input must be a JSON object: %v", flag, export, err)
		}
		out[export] = in
	}
	return out, nil
}

// runPackageRuntimeConformance launches the runtime a package-runtime
// manifest describes, as the manager launches one, and drives it.
func runPackageRuntimeConformance(cmd *cobra.Command, args []string, f packageRuntimeFlags, uid, gid int, interpreters []string, sf *sandbox.Flags) error {
	if len(args) != 1 {
		return usage(fmt.Errorf("--kind package-runtime takes one argument, the runtime's manifest (got %q)", args))
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return usage(err)
	}
	m, err := catalog.ParsePackageRuntimeManifest(data)
	if err != nil {
		return invalid(fmt.Errorf("%s: %w", args[0], err))
	}
	root := f.artifactRoot
	if root == "" {
		root = filepath.Dir(args[0])
	}
	if root, err = filepath.Abs(root); err != nil {
		return usage(err)
	}
	ceiling, err := catalog.ParseCeiling(f.ceiling)
	if err != nil {
		return usage(fmt.Errorf("--capability-ceiling: %v", err))
	}
	invoke := map[string]map[string]*caminopb.Value{}
	for _, e := range m.ExportIDs {
		invoke[e] = map[string]*caminopb.Value{}
	}
	given, err := exportInputs("invoke", f.invoke, m)
	if err != nil {
		return usage(err)
	}
	for e, in := range given {
		invoke[e] = in
	}
	watch, err := exportInputs("watch", f.watch, m)
	if err != nil {
		return usage(err)
	}
	if uid < 0 || gid < 0 {
		return usage(errors.New("--uid and --gid must be non-negative"))
	}
	tmp, err := os.MkdirTemp("", "iteron-conformance-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sb, err := conformanceSandbox(sf, tmp)
	if err != nil {
		return err
	}
	defer sb.Close()
	l, err := pkgruntime.NewLauncher(pkgruntime.LaunchConfig{
		ProviderUID: uint32(uid), ProviderGID: uint32(gid), RecordDir: filepath.Join(tmp, "records"), SocketDir: filepath.Join(tmp, "s"),
		Interpreters: interpreters, KillTimeout: 5 * time.Second, Sandbox: sb,
	})
	if err != nil {
		return err
	}
	admitted := catalog.Admit(m.RequestedCapabilities, ceiling)
	pin := pkgruntime.Pin{Manifest: m, Admitted: admitted, WorkspaceEpoch: "conformance",
		BindingDigest: catalog.AuthorityDigest(admitted), Owner: "conformance/" + m.Module}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "conformance of package runtime %s (module %s, sha256:%s, uid %d gid %d, capabilities %v)\n", m.PackageRevisionID, m.Module, m.ArtifactSHA256, uid, gid, admitted)
	printCapacity(out, sb)
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	rt, err := l.Launch(ctx, pin, root)
	if err != nil {
		fmt.Fprintf(out, "  FAIL  launch and handshake: %v\n", err)
		fmt.Fprintln(out, "not conformant: the runtime did not start")
		return invalid(err)
	}
	if ev, ok := rt.Sandbox(); ok {
		fmt.Fprintf(out, "  sandbox applied: %s\n", ev)
	}
	checks := pkgruntime.Conform(ctx, rt.Conn(), pkgruntime.ConformanceInput{Invoke: invoke, Watch: watch, Namespace: f.namespace})
	td := rt.Stop(time.Duration(m.Deadlines.CancelMs) * time.Millisecond)
	failed := 0
	for _, c := range checks {
		status := "ok  "
		if !c.Passed {
			status = "FAIL"
			failed++
		}
		fmt.Fprintf(out, "  %s  %-40s %s\n", status, c.Name, c.Detail)
		if c.Offending != "" {
			fmt.Fprintf(out, "    message: %s\n", strings.Join(strings.Fields(c.Offending), " "))
		}
	}
	fmt.Fprintf(out, "  runtime %v after SIGTERM\n", td.Exit)
	if len(td.Unreaped) != 0 {
		fmt.Fprintf(out, "  FAIL  processes left in its group: %v\n", td.Unreaped)
		failed++
	}
	if failed != 0 {
		fmt.Fprintf(out, "not conformant: %d violation(s)\n", failed)
		return invalid(fmt.Errorf("%d violation(s)", failed))
	}
	fmt.Fprintf(out, "conformant: %d checks passed\n", len(checks))
	return nil
}
