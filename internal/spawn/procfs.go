package spawn

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Stat is what /proc/<pid>/stat says of a process.
type Stat struct {
	// PID is the process.
	PID int
	// State is R, S, D, Z, …
	State byte
	// PPID is its parent.
	PPID int
	// PGID is its process group.
	PGID int
	// StartTime is the process's start time in clock ticks since boot: with
	// the pid, it names one process for the life of the machine.
	StartTime uint64
}

// readStat parses /proc/<pid>/stat. The command name is in parentheses and
// may contain anything, parentheses and spaces included: the fields that
// follow start after the last ')'.
//
// It uses raw open/read/close into a stack buffer: a group sweep reads every
// process's stat, and os.ReadFile's extra fstat and allocation double that
// cost.
func ReadStat(pid int) (Stat, error) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Stat{}, err
	}
	var buf [1024]byte
	n, err := syscall.Read(fd, buf[:])
	syscall.Close(fd)
	if err != nil {
		return Stat{}, err
	}
	return parseStat(pid, buf[:n])
}

func parseStat(pid int, b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state(0) ppid(1) pgrp(2) session(3) … starttime(19).
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	s := Stat{PID: pid, State: f[0][0]}
	var errs [3]error
	s.PPID, errs[0] = strconv.Atoi(f[1])
	s.PGID, errs[1] = strconv.Atoi(f[2])
	s.StartTime, errs[2] = strconv.ParseUint(f[19], 10, 64)
	for _, err := range errs {
		if err != nil {
			return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return s, nil
}

// readUID returns the real uid of pid from /proc/<pid>/status (the owner of
// /proc/<pid> is not reliable: a process that changed credentials may be
// non-dumpable, and its /proc entry then belongs to root).
func readUID(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			return strconv.Atoi(f[0])
		}
	}
	return -1, fmt.Errorf("/proc/%d/status: no Uid line", pid)
}

// listPIDs returns every pid in /proc.
func listPIDs() ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(n); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// groupMembers returns the processes whose process group is pgid, zombies
// included.
func GroupMembers(pgid int) ([]Stat, error) {
	pids, err := listPIDs()
	if err != nil {
		return nil, err
	}
	var out []Stat
	for _, pid := range pids {
		s, err := ReadStat(pid)
		if err != nil {
			continue // gone since the listing
		}
		if s.PGID == pgid {
			out = append(out, s)
		}
	}
	return out, nil
}

// bootID identifies this boot of the machine: a record from another boot
// names no live process.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
