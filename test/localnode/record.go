package localnode

import (
	"bufio"
	"encoding/json"
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

	"golang.org/x/sys/unix"
)

// RecordDir holds one record per node that has not been torn down yet, and
// the lock one node at a time holds.
const RecordDir = "/run/iteron-localnode"

// record is everything a node changed outside its temporary root, written
// before each change.
type record struct {
	ID string `json:"id"`
	// Owner is the pid of the process that started the node.
	Owner int `json:"owner"`
	// Root is the node's temporary root (removed last).
	Root string `json:"root"`
	// NetNS is the network namespace's name (ip netns).
	NetNS string `json:"netns,omitempty"`
	// Cgroup is the node's cgroup name in every v1 hierarchy and in the v2
	// one (the counted process).
	Cgroup string `json:"cgroup,omitempty"`
	// CgroupDirs are the cgroup directories the node created, in order.
	CgroupDirs []string `json:"cgroupDirs,omitempty"`
	// Sysctls are the values before the node started (name → value).
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Procs are the processes the node started, in order.
	Procs []proc `json:"procs,omitempty"`
	// CreatedDirs are host directories that did not exist before the node.
	CreatedDirs []string `json:"createdDirs,omitempty"`
	// NFTTable is the counting table in the root namespace ("inet NAME").
	NFTTable string `json:"nftTable,omitempty"`
	// CountedPid is the process moved into the counting cgroup, and the
	// cgroup v2 it came from.
	CountedPid    int    `json:"countedPid,omitempty"`
	CountedOrigin string `json:"countedOrigin,omitempty"`
}

// proc is one process of the node, identified by pid and start time.
type proc struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func (r *record) path() string { return filepath.Join(RecordDir, r.ID+".json") }

// save writes the record atomically.
func (r *record) save() error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.path() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, r.path()); err != nil {
		return err
	}
	// The sysctls again, as "name value" lines a shell can restore from
	// without any of this (.ci/run's exit trap).
	var b strings.Builder
	names := make([]string, 0, len(r.Sysctls))
	for k := range r.Sysctls {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "%s %s\n", k, r.Sysctls[k])
	}
	return os.WriteFile(r.sysctlPath(), []byte(b.String()), 0o600)
}

func (r *record) sysctlPath() string { return filepath.Join(RecordDir, r.ID+".sysctls") }

// lock is the exclusive lock one node holds for its lifetime.
type lock struct{ f *os.File }

// acquireLock takes the lock, waiting up to wait (0: not at all) and saying
// so once when another node holds it.
func acquireLock(log io.Writer, wait time.Duration) (*lock, error) {
	if err := os.MkdirAll(RecordDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(RecordDir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			_ = f.Truncate(0)
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			return &lock{f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		holder, _ := os.ReadFile(f.Name())
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another local node holds %s (pid %s)", f.Name(), strings.TrimSpace(string(holder)))
		}
		if !said {
			fmt.Fprintf(log, "localnode: waiting for another local node to finish (pid %s holds %s)\n", strings.TrimSpace(string(holder)), f.Name())
			said = true
		}
		time.Sleep(time.Second)
	}
}

func (l *lock) release() {
	if l != nil && l.f != nil {
		_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
		l.f.Close()
	}
}

// Cleanup tears down every node whose record is left in RecordDir, without
// waiting for a node that is running (it then returns an error). It is what
// `hack/localnode -cleanup` and .ci/run's exit trap run.
func Cleanup(log io.Writer) error {
	l, err := acquireLock(log, 0)
	if err != nil {
		return err
	}
	defer l.release()
	return cleanupStale(log)
}

// cleanupStale tears down every record (the caller holds the lock, so their
// nodes are dead).
func cleanupStale(log io.Writer) error {
	files, _ := filepath.Glob(filepath.Join(RecordDir, "*.json"))
	var errs []error
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r record
		if err := json.Unmarshal(data, &r); err != nil || r.ID == "" {
			errs = append(errs, fmt.Errorf("%s: unreadable record (%v): remove it by hand after checking", file, err))
			continue
		}
		fmt.Fprintf(log, "localnode: cleaning up node %s left by pid %d (root %s)\n", r.ID, r.Owner, r.Root)
		if err := teardown(log, &r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// teardown undoes everything the record names, in order, and removes the
// record when all of it went. Each step runs even when an earlier one failed.
func teardown(log io.Writer, r *record) error {
	var errs []error
	step := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			fmt.Fprintf(log, "localnode: teardown: %s: %v\n", what, err)
		}
	}
	// 1. The recorded processes, newest first (kube-proxy and the kubelet
	// before containerd, the API server before etcd): SIGTERM, then SIGKILL
	// after a short grace (a test node needs no orderly shutdown, and the
	// API server's can take a minute).
	for i := len(r.Procs) - 1; i >= 0; i-- {
		p := r.Procs[i]
		if !sameProcess(p) {
			continue
		}
		_ = syscall.Kill(p.Pid, syscall.SIGTERM)
		deadline := time.Now().Add(5 * time.Second)
		for sameProcess(p) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if sameProcess(p) {
			fmt.Fprintf(log, "localnode: teardown: %s (pid %d) still runs 5s after SIGTERM: SIGKILL\n", p.Name, p.Pid)
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
			for try := 0; sameProcess(p) && try < 100; try++ {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	// 2. Every process left in the node's pids cgroup: its descendants
	// (shims, runc, containers), which re-parented away from it.
	if r.Cgroup != "" {
		step("kill the processes left in the node's cgroup", killCgroup(log, filepath.Join(cgroupV1Root, "pids", r.Cgroup)))
	}
	// The counted process goes back to where it came from.
	if r.CountedPid != 0 && r.CountedOrigin != "" {
		_ = os.WriteFile(filepath.Join(cgroupV2Root, r.CountedOrigin, "cgroup.procs"), []byte(strconv.Itoa(r.CountedPid)), 0o644)
	}
	// 3. Mounts below the root (the kubelet's bind mount of its root dir,
	// volumes, containerd's snapshots, shm and netns mounts), deepest first.
	if r.Root != "" {
		step("unmount below "+r.Root, unmountBelow(r.Root))
	}
	// 4. Cgroups, deepest first, in every hierarchy.
	if r.Cgroup != "" {
		step("remove the node's cgroups", removeCgroups(r.Cgroup))
	}
	// 5. The namespace: its bridges and nft tables go with it.
	if r.NetNS != "" {
		if _, err := os.Stat(filepath.Join("/run/netns", r.NetNS)); err == nil {
			if out, err := exec.Command("ip", "netns", "delete", r.NetNS).CombinedOutput(); err != nil {
				step("ip netns delete "+r.NetNS, fmt.Errorf("%v: %s", err, out))
			}
		}
	}
	// 6. Sysctls.
	if len(r.Sysctls) > 0 {
		step("restore sysctls", restoreSysctls(r.Sysctls))
	}
	// 7. The root namespace's counting table.
	if r.NFTTable != "" {
		if out, err := exec.Command("nft", "list", "table", "inet", r.NFTTable).CombinedOutput(); err == nil {
			if out, err := exec.Command("nft", "delete", "table", "inet", r.NFTTable).CombinedOutput(); err != nil {
				step("nft delete table "+r.NFTTable, fmt.Errorf("%v: %s", err, out))
			}
		} else if !strings.Contains(string(out), "No such file") {
			step("nft list table "+r.NFTTable, fmt.Errorf("%v: %s", err, out))
		}
	}
	// 8. Files the kubelet and CNI leave on the host, pointing into the root.
	if r.Root != "" {
		step("remove host files of the node", removeHostFiles(r))
	}
	// 9. The root.
	if r.Root != "" && len(errs) == 0 {
		step("remove "+r.Root, os.RemoveAll(r.Root))
	}
	if len(errs) > 0 {
		return fmt.Errorf("localnode %s: teardown incomplete (record kept in %s): %w", r.ID, r.path(), errors.Join(errs...))
	}
	if err := os.Remove(r.sysctlPath()); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Remove(r.path()); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// startTime is field 22 of /proc/<pid>/stat (clock ticks since boot).
func startTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// sameProcess reports whether p still runs (and is not a zombie).
func sameProcess(p proc) bool {
	st, err := startTime(p.Pid)
	if err != nil || st != p.Start {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] != 'Z'
}

// unmountBelow detaches every mount at or below dir, deepest first. It reads
// /proc/self/mountinfo until nothing below dir is left (a mount can hide
// another at the same point).
func unmountBelow(dir string) error {
	dir = filepath.Clean(dir)
	for round := 0; round < 20; round++ {
		points, err := mountsBelow(dir)
		if err != nil {
			return err
		}
		if len(points) == 0 {
			return nil
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	points, _ := mountsBelow(dir)
	return fmt.Errorf("mounts left below %s: %v", dir, points)
}

// mountsBelow lists the mount points at or below dir.
func mountsBelow(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	return points, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeHostFiles removes what the kubelet and the CNI plugins write outside
// the root: the kubelet's container log symlinks in /var/log/containers that
// point into the root, libcni's cached results for the node's network, and
// the directories the node created.
func removeHostFiles(r *record) error {
	var errs []error
	links, _ := filepath.Glob("/var/log/containers/*")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, r.Root+"/") {
			if err := os.Remove(l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, f := range cniResults(r.Root) {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	for i := len(r.CreatedDirs) - 1; i >= 0; i-- {
		// Only when empty: something else may have started using it.
		if err := os.Remove(r.CreatedDirs[i]); err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cniResults lists libcni's cached results (/var/lib/cni/results/<network>-
// <sandbox id>-<interface>) of the node: those of its bridge network, and
// those of containerd's loopback network for the sandboxes in its state.
func cniResults(root string) []string {
	files, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", cniNetwork+"-*"))
	sandboxes, _ := filepath.Glob(filepath.Join(root, "containerd", "*", "io.containerd.grpc.v1.cri", "sandboxes", "*"))
	for _, sb := range sandboxes {
		more, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*-"+filepath.Base(sb)+"-*"))
		files = append(files, more...)
	}
	return files
}
