package node

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/test/restarttable"
)

// restartTable runs the restart table on the real node, with the
// DaemonSets: a caller retrying each failed call under its invocation ID
// (key "t" of prompt_system, a run sleeping 20 ms), through a hot swap, a
// manager pod deleted (SIGTERM), the manager's process SIGKILLed (the
// kubelet restarts the container), a provider SIGKILLed, and a relaunch
// refused because the artifact's bytes changed on the node (then restored
// and a retry requested). The last three need this machine's view of the
// node's processes and files: on an existing cluster only the first two
// run. It leaves prompt_system on counter-b.
func (c *cluster) restartTable(t *testing.T, name, ctxImpl string) {
	t.Helper()
	gw, err := gateway.Dial(c.socket())
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	call := func(id string) restarttable.Answer {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		begin := time.Now()
		resp, err := gw.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: ns, Activation: name, Module: "prompt_system", InvocationId: id,
			InputJson: `{"key":"t","add":1,"sleep_ms":20}`, DeadlineMs: 20000})
		r := restarttable.Answer{Took: time.Since(begin)}
		if err != nil {
			st, _ := status.FromError(err)
			r.Code, r.Msg = st.Code(), st.Message()
			return r
		}
		var obs struct{ Count float64 }
		if err := json.Unmarshal([]byte(resp.ObservationJson), &obs); err != nil {
			r.Msg = err.Error()
			return r
		}
		r.OK, r.Count, r.Replayed = true, obs.Count, resp.Replayed
		return r
	}
	counterB := c.layoutCounterB(t)
	v2 := c.impl(t, "prompt_system", "counter-v2")
	// Checkpoints every 2 s from here on, so a crash loses little.
	c.kubectlRun(t, "apply", "--server-side", "-f", c.activationYAMLCheckpoint(t, name, v2, ctxImpl, 2))
	c.waitActivation(t, name, "Ready with counter v2, checkpoints every 2 s", readyWith("prompt_system", v2), nil)

	l := restarttable.Start(call, "table")
	defer l.Finish()
	l.WaitAnswered(t, 10, 2*time.Minute)

	type step struct {
		restarttable.Case
		act   func(t *testing.T)
		local bool // needs this machine's view of the node
	}
	var rows []restarttable.Row
	steps := []step{
		{Case: restarttable.Case{Kind: "hot swap (counter-v2 → counter-b, state migrated)"}, act: func(t *testing.T) {
			c.kubectlRun(t, "apply", "--server-side", "-f", c.activationYAMLCheckpoint(t, name, counterB, ctxImpl, 2))
			c.waitActivation(t, name, "Ready with counter-b", readyWith("prompt_system", counterB), nil)
		}},
		{Case: restarttable.Case{Kind: "manager pod deleted (SIGTERM), the DaemonSet's new pod", MayFail: []string{"recovering", "no gateway answered (Unavailable)"}},
			act: func(t *testing.T) {
				old, err := c.managerPod(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				c.kubectlRun(t, "-n", managerNS, "delete", "pod", old.Name, "--wait=false")
				c.waitDaemonSetReady(t, string(old.UID))
				c.waitActivation(t, name, "Active again", readyWith("prompt_system", counterB), nil)
			}},
		{Case: restarttable.Case{Kind: "manager process SIGKILLed, the kubelet restarts its container", MayFail: []string{"recovering", "no gateway answered (Unavailable)", "interrupted"}},
			local: true, act: func(t *testing.T) {
				pid := c.hostManagerPid(t)
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				t.Logf("SIGKILLed the manager (host pid %d)", pid)
				c.waitFor(t, "the manager's container restarted", 3*time.Minute, func() error {
					if p := c.hostManagerPidOrZero(); p == 0 || p == pid {
						return fmt.Errorf("manager host pid %d", p)
					}
					_, err := c.managerPod(context.Background())
					return err
				})
				c.waitActivation(t, name, "Active again", readyWith("prompt_system", counterB), nil)
			}},
		{Case: restarttable.Case{Kind: "provider SIGKILLed, relaunched from its checkpoint", Resumes: true, MayFail: []string{"provider_failed", "recovering"}},
			local: true, act: func(t *testing.T) {
				since := time.Now()
				c.waitFor(t, "a checkpoint under the calls", time.Minute, func() error {
					g := c.servingGeneration(t, name)
					if g.Status.LastCheckpoint == nil || g.Status.LastCheckpoint.At.Time.Before(since) {
						return fmt.Errorf("last checkpoint %v", g.Status.LastCheckpoint)
					}
					return nil
				})
				c.killProvider(t, name)
			}},
		{Case: restarttable.Case{Kind: "relaunch refused (artifact bytes changed on the node), then restored and a retry requested", Resumes: true,
			MayFail: []string{"provider_failed", "recovering", "verification_failed"}}, local: true, act: func(t *testing.T) {
			exe := c.hostExecutable(t, "prompt_system/"+counterB)
			orig, err := os.ReadFile(exe)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(exe, append(slices.Clone(orig), 0), 0o755); err != nil {
				t.Fatal(err)
			}
			c.killProvider(t, name)
			c.waitActivation(t, name, "the relaunch refused", func(a *iteronv1.ImplementationActivation) error {
				for _, m := range a.Status.Modules {
					if m.Module == "prompt_system" && m.Reason == "verification_failed" {
						return nil
					}
				}
				return fmt.Errorf("modules %+v", a.Status.Modules)
			}, nil)
			l.WaitAnswered(t, 5, time.Minute)
			if err := os.WriteFile(exe, orig, 0o755); err != nil {
				t.Fatal(err)
			}
			c.kubectlRun(t, "-n", ns, "annotate", "--overwrite", "implementationactivation", name,
				iteronv1.AnnotationRetry+"="+time.Now().UTC().Format(time.RFC3339Nano))
			c.waitActivation(t, name, "serving again after the retry", readyWith("prompt_system", counterB), nil)
		}},
	}
	for _, s := range steps {
		if s.local && c.local == nil {
			t.Logf("restart table: %q skipped: it needs this machine's view of the node's processes and files (a local node)", s.Kind)
			continue
		}
		from, startCount := l.Ended(), l.LastCount()
		before := c.servingPid(t, name)
		s.act(t)
		l.WaitAnswered(t, 10, 2*time.Minute)
		after := c.servingPid(t, name)
		rows = append(rows, restarttable.Analyse(t, s.Case, l.Window(from), startCount, call, before, after))
		if t.Failed() {
			t.Fatalf("restart table: %s failed%s", s.Kind, c.diagnostics())
		}
	}
	t.Log(restarttable.Table("restart table on the real node (the manager and survivor DaemonSets, kubelet, containerd; a caller on this machine retrying each failed call under its invocation ID; pids in the survivor's PID namespace)", rows))
}

// layoutCounterB lays out counter v2's bytes a second time under the
// node's providers root, as implementation counter-b (so a swap to it is a
// hot swap with the state migrated), and returns its implementation ID.
func (c *cluster) layoutCounterB(t *testing.T) string {
	t.Helper()
	const id = "counter-b.prompt_system"
	if _, ok := c.sources["prompt_system/"+id]; ok {
		return id
	}
	ex, ok := artifacts.ExampleByName(artifacts.CounterV2)
	if !ok {
		t.Fatal("no counter v2 example")
	}
	hostProviders := filepath.Join(c.hostRoot, "providers")
	// The same manifest as counter v2's (capabilities, argv, deadlines),
	// under another implementation ID.
	v2 := c.sources["prompt_system/"+c.impl(t, "prompt_system", "counter-v2")]
	raw, err := os.ReadFile(filepath.Join(hostProviders, strings.TrimPrefix(v2.CatalogPath, podProviders)))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.ParseCatalog(raw)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := cat.Lookup(v2.ImplementationID)
	if !ok {
		t.Fatalf("%s is not in its catalog", v2.ImplementationID)
	}
	root := filepath.Join(hostProviders, "artifacts", "prompt_system", "counter-b")
	impl, err := artifacts.Layout(root, artifacts.Spec{Binary: c.hostExecutable(t, "prompt_system/"+v2.ImplementationID),
		Module: "prompt_system", ImplementationID: id, Version: ex.Version, Protocol: ex.Protocol, Argv: m.Argv,
		Capabilities: m.RequestedCapabilities, RuntimeDeadlineMs: m.RuntimeDeadlineMs, CancellationDeadlineMs: m.CancellationDeadlineMs,
		Limits: m.EvidenceLimits, FailurePolicy: m.FailurePolicy})
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := artifacts.WriteCatalog(filepath.Join(hostProviders, "counter-b-catalog.json"), impl)
	if err != nil {
		t.Fatal(err)
	}
	if err := artifacts.MakeTraversable(hostProviders); err != nil {
		t.Fatal(err)
	}
	s := srcs[0]
	c.sources["prompt_system/"+id] = source{Module: "prompt_system", ImplementationID: id,
		CatalogPath:    podProviders + strings.TrimPrefix(s.CatalogPath, hostProviders),
		ArtifactRoot:   podProviders + strings.TrimPrefix(s.ArtifactRoot, hostProviders),
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
	return id
}

// hostExecutable is the host path of a source's executable: the file of
// its artifact root whose digest the source pins.
func (c *cluster) hostExecutable(t *testing.T, key string) string {
	t.Helper()
	s, ok := c.sources[key]
	if !ok {
		t.Fatalf("no source %s", key)
	}
	root := filepath.Join(c.hostRoot, "providers", strings.TrimPrefix(s.ArtifactRoot, podProviders))
	found := ""
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || found != "" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if fmt.Sprintf("sha256:%x", sha256.Sum256(b)) == s.ArtifactSHA256 {
			found = p
		}
		return nil
	})
	if err != nil || found == "" {
		t.Fatalf("the executable of %s under %s (digest %s): %v", key, root, s.ArtifactSHA256, err)
	}
	return found
}

// activationYAMLCheckpoint is activationYAML with a checkpoint interval.
func (c *cluster) activationYAMLCheckpoint(t *testing.T, name, system, context string, seconds int) string {
	t.Helper()
	path := c.activationYAML(t, name, system, context)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(b), "spec:\n", fmt.Sprintf("spec:\n  checkpoint:\n    intervalSeconds: %d\n", seconds), 1)
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// servingGeneration is prompt_system's serving Generation of activation
// name.
func (c *cluster) servingGeneration(t *testing.T, name string) iteronv1.Generation {
	t.Helper()
	var list iteronv1.GenerationList
	if err := c.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, g := range list.Items {
		if g.Spec.ActivationName == name && g.Spec.Module == "prompt_system" && g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 {
			return g
		}
	}
	t.Fatalf("no serving Generation of prompt_system in %s", name)
	return iteronv1.Generation{}
}

// servingPid is the serving provider's pid (survivor's PID namespace).
func (c *cluster) servingPid(t *testing.T, name string) string {
	t.Helper()
	var pid string
	c.waitFor(t, "prompt_system serving", 2*time.Minute, func() error {
		var list iteronv1.GenerationList
		if err := c.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, g := range list.Items {
			if g.Spec.ActivationName == name && g.Spec.Module == "prompt_system" && g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 {
				pid = strconv.FormatInt(g.Status.Pid, 10)
				return nil
			}
		}
		return fmt.Errorf("no serving Generation")
	})
	return pid
}

// killProvider SIGKILLs prompt_system's serving provider from this machine
// (found by its group leader's pid in the survivor's PID namespace,
// providerOnTheHost) and waits until another process serves. It returns the
// killed host pid.
func (c *cluster) killProvider(t *testing.T, name string) int {
	t.Helper()
	nsPid := c.servingPid(t, name)
	pid, _ := strconv.ParseInt(nsPid, 10, 64)
	host, _ := c.providerOnTheHost(t, pid)
	if err := syscall.Kill(host, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILLed the provider: pid %s in the survivor's PID namespace, host pid %d", nsPid, host)
	c.waitFor(t, "another provider process", 2*time.Minute, func() error {
		var list iteronv1.GenerationList
		if err := c.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, g := range list.Items {
			if g.Spec.ActivationName == name && g.Spec.Module == "prompt_system" && g.Status.Pid > 0 && strconv.FormatInt(g.Status.Pid, 10) != nsPid {
				return nil
			}
			if g.Spec.ActivationName == name && g.Spec.Module == "prompt_system" && g.Status.Reason == "verification_failed" {
				return nil // refused: no other process comes
			}
		}
		return fmt.Errorf("prompt_system still reports pid %s", nsPid)
	})
	return host
}

// hostManagerPid is the manager container's process as this machine sees it.
func (c *cluster) hostManagerPid(t *testing.T) int {
	t.Helper()
	pid := c.hostManagerPidOrZero()
	if pid == 0 {
		t.Fatal("no manager process in the node's pod cgroups")
	}
	return pid
}

func (c *cluster) hostManagerPidOrZero() int {
	procs, err := c.local.PodProcesses()
	if err != nil {
		return 0
	}
	for _, p := range procs {
		if strings.Contains(p.Cmdline, "--node-name=") && strings.Contains(p.Cmdline, "--allowed-roots=") {
			return p.Pid
		}
	}
	return 0
}
