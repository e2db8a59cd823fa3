package localnode

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	cgroupV1Root = "/sys/fs/cgroup"
	// cgroupV2Root is where these machines mount the unified hierarchy next
	// to the v1 ones; the counting cgroup lives there.
	cgroupV2Root = "/sys/fs/cgroup/unified"
)

// hierarchies lists the mounted cgroup v1 hierarchies (directories of
// /sys/fs/cgroup whose mount is of type cgroup), by directory name.
func hierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		fields, after := strings.Fields(line[:sep]), strings.Fields(line[sep+3:])
		if len(fields) < 5 || len(after) < 1 || after[0] != "cgroup" {
			continue
		}
		if dir := fields[4]; filepath.Dir(dir) == cgroupV1Root {
			dirs = append(dirs, filepath.Base(dir))
		}
	}
	sort.Strings(dirs)
	return dirs, sc.Err()
}

// Available says why a node cannot run here, or nil: it needs root, the
// cgroup v1 hierarchies the kubelet uses, and ip, nsenter and nft.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("the local node needs root (it creates a network namespace, cgroups and mounts)")
	}
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, h := range hs {
		have[h] = true
	}
	for _, h := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids"} {
		if !have[h] {
			return fmt.Errorf("no cgroup v1 %s hierarchy is mounted under %s (mounted: %v); the local node runs the kubelet with cgroupfs on cgroup v1", h, cgroupV1Root, hs)
		}
	}
	for _, tool := range []string{"ip", "nsenter", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (make node installs iproute2, util-linux and nftables)", tool)
		}
	}
	return nil
}

// makeCgroups creates /<name> in every v1 hierarchy (cpuset gets its parent's
// cpus and mems, or no task could join it) and <name>/daemons in the pids
// hierarchy, and records each directory before creating it.
func makeCgroups(r *record, name string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	r.Cgroup = name
	var dirs []string
	for _, h := range hs {
		dirs = append(dirs, filepath.Join(cgroupV1Root, h, name))
	}
	dirs = append(dirs, filepath.Join(cgroupV1Root, "pids", name, "daemons"))
	r.CgroupDirs = append(r.CgroupDirs, dirs...)
	if err := r.save(); err != nil {
		return err
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		if filepath.Base(filepath.Dir(d)) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// killCgroup SIGKILLs every process in dir and below until none is left.
func killCgroup(log io.Writer, dir string) error {
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := cgroupPids(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v are still in %s after SIGKILL", pids, dir)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupPids lists the processes of dir and every cgroup below it.
func cgroupPids(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// removeCgroups removes /<name> and every cgroup below it (the kubelet's
// kubepods tree) in every v1 hierarchy and in the v2 one, deepest first.
func removeCgroups(name string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	roots := []string{filepath.Join(cgroupV2Root, name)}
	for _, h := range hs {
		roots = append(roots, filepath.Join(cgroupV1Root, h, name))
	}
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ {
				// A cgroup whose last task just died is busy for a moment.
				if err = syscall.Rmdir(d); err == nil || os.IsNotExist(err) || !errors.Is(err, syscall.EBUSY) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Sysctls are the host settings the kubelet, kube-proxy and the CNI bridge
// may change (the kubelet's kernel tunables, forwarding, conntrack and the
// bridge's netfilter hooks); the node saves them before it starts and
// restores them when it stops.
var Sysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward",
	"net.ipv4.conf.all.forwarding",
	"net.ipv4.conf.all.route_localnet",
	"net.ipv6.conf.all.forwarding",
	"net.bridge.bridge-nf-call-iptables",
	"net.bridge.bridge-nf-call-ip6tables",
	"net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait",
	"net.netfilter.nf_conntrack_tcp_be_liberal",
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// ReadSysctlsAlone reads the Sysctls while no local node runs: it holds the
// lock every node holds for its lifetime, waiting up to wait for it. The
// sysctls are the host's, so a reading taken while another checkout's node
// runs would blame this node for that one's changes.
func ReadSysctlsAlone(log io.Writer, wait time.Duration) (map[string]string, error) {
	l, err := acquireLock(log, wait)
	if err != nil {
		return nil, err
	}
	defer l.release()
	return ReadSysctls(), nil
}

// ReadSysctls reads the Sysctls this machine has (in this process's network
// namespace: the root one).
func ReadSysctls() map[string]string {
	values := map[string]string{}
	for _, name := range Sysctls {
		if v, err := os.ReadFile(sysctlPath(name)); err == nil {
			values[name] = strings.TrimSpace(string(v))
		}
	}
	return values
}

// restoreSysctls writes back every saved value that differs.
func restoreSysctls(saved map[string]string) error {
	var errs []error
	for name, want := range saved {
		now, err := os.ReadFile(sysctlPath(name))
		if err != nil || strings.TrimSpace(string(now)) == want {
			continue
		}
		if err := os.WriteFile(sysctlPath(name), []byte(want), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", name, want, err))
		}
	}
	return errors.Join(errs...)
}
