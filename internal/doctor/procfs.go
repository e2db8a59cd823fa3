package doctor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// procRoot is where the process table is read; a variable so that a test
// can point the liveness checks at a fixture.
var procRoot = "/proc"

// clockTicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's start
// time: 100 on every Linux architecture Kubernetes runs on (the kernel's
// ABI fixes it, whatever CONFIG_HZ is).
const clockTicksPerSecond = 100

// procStat is what the doctor reads of /proc/<pid>/stat.
type procStat struct {
	pgid int
	// startTime is in clock ticks since boot: with the pid it names one
	// process for the life of the machine.
	startTime uint64
}

// maxStatBytes bounds a stat line: a 16-byte command name and 52 numeric
// fields fit in far less.
const maxStatBytes = 4096

// parseStat parses a /proc/<pid>/stat line. The command name, in
// parentheses, is chosen by the process (prctl(PR_SET_NAME)) and may hold
// spaces and parentheses: the fields are read after the LAST ')'.
func parseStat(b []byte) (procStat, error) {
	if len(b) > maxStatBytes {
		return procStat{}, fmt.Errorf("stat line of %d bytes exceeds %d", len(b), maxStatBytes)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("stat line has no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state(0) ppid(1) pgrp(2) session(3) … starttime(19).
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("stat line has %d fields after the command name, want at least 20", len(f))
	}
	pgid, err := strconv.Atoi(f[2])
	if err != nil || pgid <= 0 {
		return procStat{}, fmt.Errorf("stat line: process group %q", f[2])
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("stat line: start time %q", f[19])
	}
	return procStat{pgid: pgid, startTime: start}, nil
}

// readStat reads /proc/<pid>/stat; a missing process is os.ErrNotExist.
func readStat(pid int) (procStat, error) {
	b, err := readBounded(procRoot+"/"+strconv.Itoa(pid)+"/stat", maxStatBytes)
	if err != nil {
		return procStat{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// readUID is the real uid of pid, from /proc/<pid>/status.
func readUID(pid int) (int, error) {
	b, err := readBounded(procRoot+"/"+strconv.Itoa(pid)+"/status", 64<<10)
	if err != nil {
		return -1, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return -1, fmt.Errorf("/proc/%d/status: no Uid line", pid)
}

// groupMembers returns the pids whose process group is pgid, started no
// earlier than notBefore and running as uid: what is left of a recorded
// group whose leader is gone (the executor's sweep kills the same set).
func groupMembers(pgid int, notBefore uint64, uid int) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.pgid != pgid || st.startTime < notBefore {
			continue
		}
		if u, err := readUID(pid); err != nil || u != uid {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// bootID identifies this boot: a record from another boot names no live
// process.
func bootID() string {
	b, err := readBounded(procRoot+"/sys/kernel/random/boot_id", 128)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// uptime is the time since boot, from /proc/uptime.
func uptime() (time.Duration, error) {
	b, err := readBounded(procRoot+"/uptime", 128)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("/proc/uptime is empty")
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/uptime: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// readBounded reads at most max bytes of a file; more is an error.
func readBounded(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, max+1)
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	if n > max {
		return nil, fmt.Errorf("%s: more than %d bytes", path, max)
	}
	return buf[:n], nil
}
