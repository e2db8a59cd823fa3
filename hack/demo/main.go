// Command demo is `make demo`: it builds and starts a real local control
// plane and a real OCI registry (the CNCF distribution registry, on
// loopback, TLS from a CA made for the run), pushes the example providers
// to it as OCI artifacts, runs the manager for this machine, applies an
// activation of two modules that names them by digest (the manager pulls
// and verifies them), calls a module through the gateway, applies a new
// version (a stateful hot swap), shows the Generations, the status and the
// verified ledger, and tears everything down — on success, on failure and
// on Ctrl-C.
// Every step is narrated with the command a user would type. It exits
// non-zero if any step fails.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/registrytest"
)

const (
	activationName = "stack"
	namespace      = "default"
)

// init gives controller-runtime a logger before anything can log through
// it: envtest does, in step 4, and when that is 30 s or more after the
// process started (the builds of a first run take minutes) controller-runtime
// prints a stack trace saying that no logger was set. Its errors go to
// stderr; its other lines are not part of the narration.
func init() {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &demo{out: os.Stdout}
	err := d.run(ctx)
	d.cleanup(err != nil && ctx.Err() == nil)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "\ndemo: interrupted; everything it started was stopped and removed")
			os.Exit(130)
		}
		fmt.Fprintf(os.Stderr, "\ndemo: FAILED: %v\n", err)
		if d.keptLog != "" {
			fmt.Fprintf(os.Stderr, "the manager's log is kept in %s\n", d.keptLog)
		}
		os.Exit(1)
	}
	fmt.Println("\ndemo: done. Everything it started was stopped and removed.")
}

type demo struct {
	out        io.Writer
	root       string // repository root
	work       string // temporary directory of this run
	kubeconfig string
	kubectl    string
	plugin     string
	socket     string
	stateDir   string
	providers  string
	node       string
	sources    map[string]source
	registry   *registrytest.Registry
	store      string
	// refs are the pinned references pushed, by module.
	refs map[string]string

	env        *kubeapi.Environment
	manager    *exec.Cmd
	managerErr chan error
	managerLog string
	keptLog    string
	steps      int
}

// source is one implementation as hack/catalog prints it.
type source struct {
	Module           string `json:"module"`
	ImplementationID string `json:"implementation_id"`
	Version          string `json:"implementation_version"`
	CatalogPath      string `json:"catalog_path"`
	ArtifactRoot     string `json:"artifact_root"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
}

func (d *demo) step(title string) {
	d.steps++
	fmt.Fprintf(d.out, "\n\033[1m== %d. %s\033[0m\n", d.steps, title)
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "   "+format+"\n", args...)
}

// sh runs a command, echoing it like a user would type it, streaming its
// output indented.
func (d *demo) sh(ctx context.Context, display string, name string, args ...string) (string, error) {
	fmt.Fprintf(d.out, "   $ %s\n", display)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = d.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.kubeconfig)
	var buf bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(&buf, pw)
	cmd.Stderr = io.MultiWriter(&buf, pw)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(d.out, "     %s\n", sc.Text())
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return buf.String(), fmt.Errorf("%s: %w", display, err)
	}
	return buf.String(), nil
}

func (d *demo) run(ctx context.Context) error {
	var err error
	if d.root, err = kubeapi.RepoRoot(); err != nil {
		return err
	}
	if d.work, err = os.MkdirTemp("", "iteron-demo-"); err != nil {
		return err
	}
	// Providers run as an unprivileged uid: every directory they need must
	// be traversable.
	if err := os.Chmod(d.work, 0o755); err != nil {
		return err
	}
	d.providers, d.stateDir = filepath.Join(d.work, "providers"), filepath.Join(d.work, "state")
	d.store = filepath.Join(d.work, "artifacts")
	d.socket = filepath.Join(d.work, "gw.sock")
	d.kubeconfig = filepath.Join(d.work, "kubeconfig")
	d.kubectl = filepath.Join(d.root, "bin", "k8s", "kubectl")
	d.plugin = filepath.Join(d.root, "bin", "kubectl-iteron")
	if d.node, err = os.Hostname(); err != nil {
		return err
	}
	d.node = strings.ToLower(d.node)

	d.step("Build the local control plane: etcd and kube-apiserver v1.37.2 from the Go module proxy (the first run takes about 6 minutes; later runs reuse bin/k8s)")
	if _, err := d.sh(ctx, "make controlplane", "make", "--no-print-directory", "controlplane"); err != nil {
		return err
	}

	d.step("Build the OCI registry: the CNCF distribution registry from the Go module proxy (once; later runs reuse bin/registry)")
	if _, err := d.sh(ctx, "make registry", "make", "--no-print-directory", "registry"); err != nil {
		return err
	}

	d.step("Build the manager and the kubectl plugin")
	if _, err := d.sh(ctx, "make build", "make", "--no-print-directory", "build"); err != nil {
		return err
	}

	d.step("Lay out the example providers (counter v1 and v2, digests computed from the bytes written), one provider directory per module")
	fmt.Fprintf(d.out, "   $ go run ./hack/catalog -out %s -modules prompt_system,context_assembly -oci\n", d.providers)
	cat := exec.CommandContext(ctx, "go", "run", "./hack/catalog", "-out", d.providers, "-modules", "prompt_system,context_assembly", "-oci")
	cat.Dir = d.root
	cat.Stderr = os.Stderr
	out, err := cat.Output()
	if err != nil {
		return fmt.Errorf("hack/catalog: %w", err)
	}
	if err := d.parseSources(string(out)); err != nil {
		return err
	}
	d.say("%-20s %-30s %-8s %s", "MODULE", "IMPLEMENTATION", "VERSION", "ARTIFACT")
	for _, key := range slices.Sorted(maps.Keys(d.sources)) {
		s := d.sources[key]
		d.say("%-20s %-30s %-8s %s…", s.Module, s.ImplementationID, s.Version, s.ArtifactSHA256[:19])
	}

	d.step("Start an OCI registry on 127.0.0.1 (TLS from a CA made for this run) and push each module's providers as one OCI artifact")
	if d.registry, err = registrytest.Start(ctx, registrytest.Options{Dir: filepath.Join(d.work, "registry")}); err != nil {
		return err
	}
	d.say("registry %s (storage and CA under %s)", d.registry.Host, filepath.Join(d.work, "registry"))
	d.refs = map[string]string{}
	for _, module := range []string{"prompt_system", "context_assembly"} {
		dir := filepath.Join(d.providers, "oci", module)
		target := d.registry.Host + "/iteron/" + strings.ReplaceAll(module, "_", "-") + ":demo"
		out, err := d.sh(ctx, "kubectl iteron push "+dir+" "+target+" --registry-ca "+d.registry.CAFile,
			d.plugin, "push", dir, target, "--registry-ca", d.registry.CAFile)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if ref, ok := strings.CutPrefix(line, "pushed "); ok {
				d.refs[module] = strings.TrimSpace(ref)
			}
		}
		if d.refs[module] == "" {
			return fmt.Errorf("kubectl iteron push printed no pinned reference for %s", module)
		}
	}

	d.step("Start etcd and kube-apiserver on 127.0.0.1, install the CRDs, register this node (" + d.node + ")")
	if d.env, err = kubeapi.Start(); err != nil {
		return err
	}
	if err := kubeapi.EnsureNode(ctx, d.env.Client, d.node); err != nil {
		return err
	}
	src, err := d.env.Kubeconfig(d.work)
	if err != nil {
		return err
	}
	if src != d.kubeconfig {
		if err := os.Rename(src, d.kubeconfig); err != nil {
			return err
		}
	}
	d.say("kube-apiserver %s at %s", d.env.ServerVersion, d.env.Config.Host)
	if _, err := d.sh(ctx, "kubectl get crd,nodes", d.kubectl, "get", "crd,nodes"); err != nil {
		return err
	}

	d.step("Start the manager for node " + d.node + " (it pulls OCI sources into its own content-addressed store and verifies them)")
	if err := d.startManager(); err != nil {
		return err
	}

	d.step("Apply an activation by digest: counter v1 fills prompt_system and context_assembly (which depends on it), both pulled from the registry")
	manifest := filepath.Join(d.work, "activation.yaml")
	if err := d.writeActivation(manifest, "counter-v1", "counter-v1"); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "cat activation.yaml", "cat", manifest); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl apply -f activation.yaml", d.kubectl, "apply", "-f", manifest); err != nil {
		return err
	}
	if err := d.waitReady(ctx, "prompt_system", "counter-v1"); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get implementationactivations,generations", d.kubectl, "get", "implementationactivations,generations", "-n", namespace); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get implementationactivation "+activationName+" -o jsonpath='{.spec.sources[*].oci.ref}'", d.kubectl, "get", "implementationactivation", activationName, "-n", namespace,
		"-o", `jsonpath={range .spec.sources[*]}{.module}{"\t"}oci.ref {.oci.ref}{"\n"}{end}`); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get generations -o jsonpath='{.spec.implementation.executable}'   # what runs: files in the manager's artifact store", d.kubectl, "get", "generations", "-n", namespace,
		"-o", `jsonpath={range .items[*]}{.metadata.name}{"\t"}{.spec.implementation.executable}{"\n"}{end}`); err != nil {
		return err
	}

	d.step("Call prompt_system through the node-local gateway (a unix socket; the caller's uid is checked)")
	for _, in := range []string{`{"key":"alpha","add":2}`, `{"key":"beta","add":5}`, `{"key":"alpha","add":1}`} {
		if _, err := d.invoke(ctx, in); err != nil {
			return err
		}
	}

	d.step("Apply v2 of prompt_system: a stateful hot swap (shadow-load, quiesce, snapshot, migrate, restore, readiness, one atomic switch, drain)")
	if err := d.writeActivation(manifest, "counter-v2", "counter-v1"); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl apply -f activation.yaml   # prompt_system now selects counter-v2", d.kubectl, "apply", "-f", manifest); err != nil {
		return err
	}
	if err := d.waitReady(ctx, "prompt_system", "counter-v2"); err != nil {
		return err
	}
	answer, err := d.invoke(ctx, `{"key":"alpha","add":1}`)
	if err != nil {
		return err
	}
	if !strings.Contains(answer, `"count":4`) || !strings.Contains(answer, `"2.0.0"`) {
		return fmt.Errorf("after the swap v2 answered %q; want alpha=4 from version 2.0.0 (the migrated state)", strings.TrimSpace(answer))
	}
	d.say("v2 answered alpha=4: the state v1 built (2+1) was migrated into v2's layout")
	d.say("context_assembly, prompt_system's direct consumer, was reloaded too (its epoch covers prompt_system's identity), its state carried over")

	d.step("Generations and status")
	if _, err := d.sh(ctx, "kubectl get generations", d.kubectl, "get", "generations", "-n", namespace); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get implementationactivation "+activationName+" -o jsonpath='{.status.modules}'", d.kubectl, "get", "implementationactivation", activationName, "-n", namespace, "-o", "jsonpath={range .status.modules[*]}{.module}{\"\\t\"}{.implementationID}{\"\\t\"}{.phase}{\"\\tgeneration \"}{.generation}{\"\\n\"}{end}"); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get implementationactivation "+activationName+" -o jsonpath='{.status.conditions}'", d.kubectl, "get", "implementationactivation", activationName, "-n", namespace, "-o", "jsonpath={range .status.conditions[*]}{.type}={.status} ({.reason}){\"\\n\"}{end}"); err != nil {
		return err
	}

	d.step("Verify the hash-chained ledger on the node, and show it")
	uid, err := d.activationUID(ctx)
	if err != nil {
		return err
	}
	ledgerDir := filepath.Join(d.stateDir, "ledgers", uid)
	if _, err := d.sh(ctx, "kubectl iteron ledger verify "+ledgerDir, d.plugin, "ledger", "verify", ledgerDir); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl iteron ledger show "+ledgerDir, d.plugin, "ledger", "show", ledgerDir); err != nil {
		return err
	}

	d.step("Delete the activation: every module retired in drain order, every process reaped, the Generations deleted, the ledger archived")
	if _, err := d.sh(ctx, "kubectl delete implementationactivation "+activationName+" --wait", d.kubectl, "delete", "implementationactivation", activationName, "-n", namespace, "--wait", "--timeout=60s"); err != nil {
		return err
	}
	if _, err := d.sh(ctx, "kubectl get generations", d.kubectl, "get", "generations", "-n", namespace); err != nil {
		return err
	}
	return nil
}

func (d *demo) parseSources(out string) error {
	start := strings.Index(out, "{")
	if start < 0 {
		return fmt.Errorf("hack/catalog printed no JSON")
	}
	var doc struct {
		Sources []source `json:"sources"`
	}
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(&doc); err != nil {
		return fmt.Errorf("read hack/catalog's output: %w", err)
	}
	d.sources = map[string]source{}
	for _, s := range doc.Sources {
		d.sources[s.Module+"/"+s.ImplementationID] = s
	}
	return nil
}

func (d *demo) startManager() error {
	if err := os.MkdirAll(d.stateDir, 0o700); err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + d.kubeconfig, "--node-name=" + d.node, "--state-dir=" + d.stateDir,
		"--allowed-roots=" + d.providers, "--gateway-socket=" + d.socket,
		fmt.Sprintf("--gateway-allow=uid:%d=%s", os.Getuid(), namespace),
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--artifact-store=" + d.store, "--registry-ca=" + d.registry.CAFile,
	}
	if os.Getuid() != 0 {
		// Without root the manager cannot switch uid: providers run as you.
		args = append(args, fmt.Sprintf("--provider-uid=%d", os.Getuid()), fmt.Sprintf("--provider-gid=%d", os.Getgid()))
	}
	d.managerLog = filepath.Join(d.work, "manager.log")
	logf, err := os.Create(d.managerLog)
	if err != nil {
		return err
	}
	d.manager = exec.Command(filepath.Join(d.root, "bin", "manager"), args...)
	d.manager.Stdout, d.manager.Stderr = logf, logf
	// Its own process group: Ctrl-C reaches the demo, which stops the
	// manager in order (SIGTERM: checkpoint, stop the providers).
	d.manager.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(d.out, "   $ manager %s\n", strings.Join(args, " "))
	if err := d.manager.Start(); err != nil {
		return err
	}
	d.managerErr = make(chan error, 1)
	go func() { d.managerErr <- d.manager.Wait(); logf.Close() }()
	d.say("manager pid %d, log %s", d.manager.Process.Pid, d.managerLog)
	return nil
}

func (d *demo) writeActivation(path, systemImpl, contextImpl string) error {
	sys, ok := d.sources["prompt_system/"+systemImpl+".prompt_system"]
	if !ok {
		sys, ok = d.sources["prompt_system/"+systemImpl]
	}
	ctxSrc, ok2 := d.sources["context_assembly/"+contextImpl+".context_assembly"]
	if !ok2 {
		ctxSrc, ok2 = d.sources["context_assembly/"+contextImpl]
	}
	if !ok || !ok2 {
		return fmt.Errorf("hack/catalog did not lay out %s and %s", systemImpl, contextImpl)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  nodeName: %s\n", activationName, namespace, d.node)
	fmt.Fprintf(&b, "  candidateSHA256: sha256:%064x\n  sources:\n", 1)
	for _, s := range []source{sys, ctxSrc} {
		fmt.Fprintf(&b, "  - module: %s\n    implementationID: %s\n    oci:\n      ref: %s\n    manifestSHA256: %s\n    artifactSHA256: %s\n",
			s.Module, s.ImplementationID, d.refs[s.Module], s.ManifestSHA256, s.ArtifactSHA256)
	}
	b.WriteString("  swap:\n    deadlineSeconds: 30\n    quiesceTimeoutSeconds: 10\n    strategy: Hot\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// waitReady waits until the activation is Ready with module running impl.
func (d *demo) waitReady(ctx context.Context, module, impl string) error {
	fmt.Fprintf(d.out, "   $ kubectl wait implementationactivation/%s --for=condition=Ready\n", activationName)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.CommandContext(ctx, d.kubectl, "--kubeconfig", d.kubeconfig, "get", "implementationactivation", activationName, "-n", namespace,
			"-o", `jsonpath={.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type=="Ready")].status} {.status.modules[?(@.module=="`+module+`")].implementationID}`).Output()
		if err == nil {
			f := strings.Fields(string(out))
			if len(f) == 4 && f[0] == f[1] && f[2] == "True" && strings.HasPrefix(f[3], impl) {
				d.say("Ready: %s runs %s", module, f[3])
				return nil
			}
		}
		select {
		case err := <-d.managerErr:
			d.managerErr <- err
			d.printManagerLog()
			return fmt.Errorf("the manager exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			d.printManagerLog()
			return fmt.Errorf("the activation was not Ready with %s=%s within 2 minutes", module, impl)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *demo) invoke(ctx context.Context, input string) (string, error) {
	return d.sh(ctx, fmt.Sprintf("kubectl iteron invoke --socket %s -n %s --activation %s --module prompt_system --input '%s'", d.socket, namespace, activationName, input),
		d.plugin, "invoke", "--socket", d.socket, "--namespace", namespace, "--activation", activationName, "--module", "prompt_system", "--input", input)
}

func (d *demo) activationUID(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, d.kubectl, "--kubeconfig", d.kubeconfig, "get", "implementationactivation", activationName, "-n", namespace, "-o", "jsonpath={.metadata.uid}").Output()
	if err != nil {
		return "", fmt.Errorf("read the activation's uid: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *demo) printManagerLog() {
	data, err := os.ReadFile(d.managerLog)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	fmt.Fprintln(os.Stderr, "\nlast lines of the manager's log:")
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, "  "+l)
	}
}

// cleanup stops the manager (SIGTERM, then SIGKILL), the control plane,
// and removes the run's directory; after a failure it keeps the manager's
// log. It is safe after any failure.
func (d *demo) cleanup(keepLog bool) {
	if d.manager != nil && d.manager.Process != nil {
		_ = d.manager.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.managerErr:
		case <-time.After(50 * time.Second):
			_ = syscall.Kill(-d.manager.Process.Pid, syscall.SIGKILL)
			<-d.managerErr
		}
	}
	if d.env != nil {
		_ = d.env.Stop()
	}
	if d.registry != nil {
		d.registry.Stop()
	}
	if d.work != "" {
		if keepLog && d.managerLog != "" {
			if kept, err := os.CreateTemp("", "iteron-demo-manager-*.log"); err == nil {
				if data, err := os.ReadFile(d.managerLog); err == nil {
					_, _ = kept.Write(data)
				}
				kept.Close()
				d.keptLog = kept.Name()
			}
		}
		if err := os.RemoveAll(d.work); err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "demo: remove", d.work, err)
		}
	}
}
