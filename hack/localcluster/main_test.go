package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/test/kubeapi"
)

// TestKillingItStopsEtcdAndTheAPIServer: however localcluster is killed —
// the supervisor with SIGKILL, or the worker with SIGKILL — etcd and
// kube-apiserver (in process groups of their own) do not outlive it.
func TestKillingItStopsEtcdAndTheAPIServer(t *testing.T) {
	root, err := kubeapi.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "localcluster")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		kill func(t *testing.T, supervisor, worker int)
	}{
		{"SIGKILL to the pid a shell reports", func(t *testing.T, supervisor, _ int) {
			// Our own child, not yet reaped: its pid is still its own.
			if err := syscall.Kill(supervisor, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"SIGKILL to the worker that owns the servers", func(t *testing.T, _, worker int) {
			if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kubeconfig := filepath.Join(dir, "kubeconfig")
			cmd := exec.Command(bin, "-write-kubeconfig", kubeconfig, "-node", "localcluster-test")
			cmd.Dir = root
			log, err := os.Create(filepath.Join(dir, "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			cmd.Stdout, cmd.Stderr = log, log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			supervisor := cmd.Process.Pid
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			defer func() {
				// Whatever happened, stop it the documented way. Signal
				// goes through os.Process (a pidfd), never to a reused pid.
				_ = cmd.Process.Signal(syscall.SIGTERM)
				<-done
			}()
			deadline := time.Now().Add(2 * time.Minute)
			for {
				if _, err := os.Stat(kubeconfig); err == nil {
					break
				}
				if time.Now().After(deadline) {
					data, _ := os.ReadFile(log.Name())
					t.Fatalf("no kubeconfig within 2 minutes; log:\n%s", data)
				}
				select {
				case <-done:
					data, _ := os.ReadFile(log.Name())
					t.Fatalf("localcluster exited before it was ready; log:\n%s", data)
				case <-time.After(100 * time.Millisecond):
				}
			}
			workers := childrenOf(supervisor)
			if len(workers) != 1 {
				t.Fatalf("supervisor %d has children %v, want one worker", supervisor, workers)
			}
			// The worker's children: etcd, kube-apiserver and the watchdog
			// test/kubeapi starts beside them; all must end.
			children := childrenOf(workers[0])
			var servers []string
			for _, pid := range children {
				servers = append(servers, comm(pid))
			}
			slices.Sort(servers)
			if want := []string{"etcd", "kube-apiserver", "sh"}; !slices.Equal(servers, want) {
				t.Fatalf("worker %d has children %v (%v), want %v", workers[0], children, servers, want)
			}
			tc.kill(t, supervisor, workers[0])
			deadline = time.Now().Add(30 * time.Second)
			for _, pid := range append(children, workers[0]) {
				for alive(pid) {
					if time.Now().After(deadline) {
						data, _ := os.ReadFile(log.Name())
						t.Fatalf("process %d (%s) outlived localcluster by 30 s; log:\n%s", pid, comm(pid), data)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// childrenOf lists the live processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, state := stat(child); ppid == pid && state != "Z" {
			out = append(out, child)
		}
	}
	return out
}

// alive reports a process that exists and is not a zombie (a zombie whose
// parent is init is gone for our purpose: it holds nothing).
func alive(pid int) bool {
	_, state := stat(pid)
	return state != "" && state != "Z"
}

func stat(pid int) (ppid int, state string) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, ""
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, ""
	}
	ppid, _ = strconv.Atoi(fields[1])
	return ppid, fields[0]
}

func comm(pid int) string {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(data))
}
