package procexec

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/pkg/strictjson"

	"iteron.dev/operator/internal/spawn"
)

// exeDigest hashes the bytes the kernel runs for pid (/proc/<pid>/exe).
func exeDigest(pid int) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return fileDigest(f)
}

// fileDigest hashes what f holds from its current offset.
func fileDigest(f *os.File) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

// exeCapture opens /proc/<pid>/exe of every process the executor spawns,
// from the beforeRehash hook: a start whose re-hash finds the file changed is
// killed before Launch's caller could look at it, and those are the starts
// where an executor that ran the file instead of the sealed copy would have
// run the other build.
type exeCapture struct {
	mu    sync.Mutex
	exes  map[int]*os.File
	errs  map[int]error
	taken int
}

func captureExes(t *testing.T) *exeCapture {
	c := &exeCapture{exes: map[int]*os.File{}, errs: map[int]error{}}
	beforeRehash = func(p *Process) {
		f, err := os.Open("/proc/" + strconv.Itoa(p.Pid()) + "/exe")
		if err == nil {
			// The leader is reaped only by its own teardown, which may
			// have begun (an unexpected exit): make sure the pid still
			// names the process spawned.
			if st, serr := spawn.ReadStat(p.Pid()); serr != nil || st.StartTime != p.StartTime() {
				f.Close()
				f, err = nil, errors.New("the process was gone before its executable could be opened")
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.exes[p.Pid()], c.errs[p.Pid()] = f, err
	}
	t.Cleanup(func() {
		beforeRehash = nil
		for _, f := range c.exes {
			if f != nil {
				f.Close()
			}
		}
	})
	return c
}

// digest returns the digest of what pid ran. Call it once the re-hash is
// over (Load has returned, or the process is gone).
func (c *exeCapture) digest(pid int) (string, error) {
	c.mu.Lock()
	f, err := c.exes[pid], c.errs[pid]
	_, seen := c.errs[pid]
	delete(c.exes, pid)
	delete(c.errs, pid)
	c.mu.Unlock()
	switch {
	case !seen:
		return "", errors.New("the re-hash hook never ran")
	case err != nil:
		return "", err
	}
	defer f.Close()
	return fileDigest(f)
}

// TestTheBytesThatRunAreTheBytesVerifiedWhileAWriterRaces starts the
// verified provider 200 times per mode while another goroutine swaps the
// file's bytes for a different build, and checks, for every process spawned
// (those the re-hash then killed as tampered included), that the kernel ran
// the verified bytes. A start may be refused (the copy hashed the other
// build) or killed as tampered (the file changed after the start); it may
// never run the other build.
//
// The two modes catch different mistakes; each was shown by a scratch edit
// of the executor (not committed) to make this test fail:
//   - "replaced by rename" puts another inode at the path. It catches an
//     executor that execs the path it verified: with the exec of
//     plan.Executable() instead of the memfd, 44 to 70 of 200 starts ran
//     the other build (two runs).
//   - "rewritten in place" changes the bytes of the one inode. The kernel
//     refuses such a write while the file is being executed, and refuses to
//     exec a file open for writing (ETXTBSY; measured on these kernels by
//     path, through a second hard link, through /proc/<pid>/exe and through
//     a shared writable mapping alike), so no write can change a running
//     image: what a write can change is the file before the exec, between
//     a hash and a copy. This mode catches an executor that hashes the file
//     and then copies it instead of hashing the sealed copy (6 to 13 starts
//     of 200 ran other or mixed bytes in four runs; the rename mode
//     passed), and one that execs the path (21 to 45 ran the other build,
//     and 145 to 170 writes were refused with ETXTBSY). A write refused
//     with ETXTBSY means that the file itself, not a sealed copy, was being
//     executed: it fails the test.
func TestTheBytesThatRunAreTheBytesVerifiedWhileAWriterRaces(t *testing.T) {
	const starts = 200
	// No cache of sealed copies: every start copies and hashes the file
	// while the writer races it.
	cfg := DefaultConfig(t.TempDir())
	cfg.ExecutableCacheBytes = 0
	ex, err := NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	good := implement(t, artifacts.Stateless)
	goodBytes, err := os.ReadFile(good.Executable)
	if err != nil {
		t.Fatal(err)
	}
	evilBytes, err := os.ReadFile(providertest.Variant(t, artifacts.Stateless, "-X main.build=B"))
	if err != nil {
		t.Fatal(err)
	}
	writers := map[string]func(path string, b []byte) error{
		"rewritten in place": func(path string, b []byte) error {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := f.WriteAt(b, 0); err != nil {
				return err
			}
			return f.Truncate(int64(len(b)))
		},
		"replaced by rename": func(path string, b []byte) error {
			tmp := filepath.Join(filepath.Dir(path), ".swap")
			if err := os.WriteFile(tmp, b, 0o755); err != nil {
				return err
			}
			return os.Rename(tmp, path)
		},
	}
	for _, mode := range []string{"rewritten in place", "replaced by rename"} {
		t.Run(mode, func(t *testing.T) {
			impl := implement(t, artifacts.Stateless)
			plan := providertest.Plan(t, impl)
			write := writers[mode]
			exes := captureExes(t)
			// Time one unraced start, so that the swaps can be spread over
			// its whole length whatever the speed (-race is slower).
			t0 := time.Now()
			p, err := ex.Launch(plan)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Load(ctx(t)); err != nil {
				t.Fatal(err)
			}
			span := time.Since(t0) * 3 / 2
			p.Close()
			exes.digest(p.Pid())
			var spawned, checked, unreadable, loadedOK, refused, tampered, wrong, writes, busy int
			for i := range starts {
				if err := write(impl.Executable, goodBytes); err != nil {
					t.Fatal(err)
				}
				// Each start races one swap, landing at a different point
				// of it (before, during or after the copy, the exec, the
				// re-hash or the load) as the delay walks over 1.5 starts.
				delay := span * time.Duration(i%20) / 20
				swapped := make(chan error, 1)
				go func() {
					time.Sleep(delay)
					swapped <- write(impl.Executable, evilBytes)
				}()
				p, err := ex.Launch(plan)
				werr := <-swapped
				switch {
				case errors.Is(werr, syscall.ETXTBSY):
					busy++
					t.Errorf("start %d: the write was refused (%v): the artifact file itself was being executed", i, werr)
				case werr != nil:
					t.Fatalf("writer: %v", werr)
				}
				writes++
				ranWrong := false
				if err == nil {
					spawned++
					_, err = p.Load(ctx(t))
					if err == nil {
						loadedOK++
						if v := introspect(t, p); v.Build != "A" {
							ranWrong = true
							t.Errorf("pid %d reports build %q", p.Pid(), v.Build)
						}
					}
					p.Close()
					// The re-hash is over (Load waits for it, and so does
					// the teardown): the hook has run.
					if d, derr := exes.digest(p.Pid()); derr != nil {
						unreadable++
						t.Logf("start %d: pid %d: its executable could not be read: %v", i, p.Pid(), derr)
					} else {
						checked++
						if d != impl.ArtifactSHA256 {
							ranWrong = true
							t.Errorf("start %d: pid %d ran %s, verified %s", i, p.Pid(), d, impl.ArtifactSHA256)
						}
					}
				}
				if ranWrong {
					wrong++
				}
				switch f, _ := AsFault(err); {
				case err == nil, ranWrong:
					// Bytes that were not verified may do anything, crash
					// included: that they ran is the failure.
				case f != nil && f.Kind == KindRefused:
					refused++
				case f != nil && f.Kind == KindTampered:
					tampered++
				case f != nil && f.Kind == KindSpawn && errors.Is(f.Err, syscall.ETXTBSY):
					busy++
					t.Errorf("start %d: exec refused while the file was open for writing (%v): the executor execs the artifact file itself", i, err)
				default:
					t.Fatalf("start %d: %v", i, err)
				}
			}
			t.Logf("%s (swaps spread over %v): %d starts racing %d writes: %d refused before spawn (digest mismatch), %d spawned (%d then killed as tampered by the re-hash, %d loaded and served); executables read %d, unreadable %d; %d ran the wrong bytes; %d ETXTBSY",
				mode, span, starts, writes, refused, spawned, tampered, loadedOK, checked, unreadable, wrong, busy)
			if wrong != 0 {
				t.Fatalf("%d starts ran bytes that were not verified", wrong)
			}
			if checked == 0 {
				t.Fatalf("none of the %d spawned processes' executables could be read: the test proved nothing", spawned)
			}
			// The race must have reached both sides of the spawn: writes
			// landing after the copy (caught by the re-hash, while a process
			// ran: those are the processes that prove the point), and, in
			// place, writes landing before or during the copy (the copy's
			// hash caught them). A rename writes a whole file first, so it
			// seldom lands before the open and is not required to.
			if spawned == 0 || tampered == 0 {
				t.Fatalf("%d of %d starts spawned, %d were caught by the re-hash: the race did not reach the running process", spawned, starts, tampered)
			}
			if mode == "rewritten in place" && refused == 0 {
				t.Fatalf("no start of %d copied changed bytes: the writes never reached the copy", starts)
			}
		})
	}
}
