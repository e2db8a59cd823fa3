package procexec

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/pkg/strictjson"
)

// exeDigest hashes the bytes the kernel runs for pid (/proc/<pid>/exe).
func exeDigest(pid int) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

// TestTheBytesThatRunAreTheBytesVerifiedWhileAWriterRaces starts the
// verified provider 200 times while another goroutine swaps the file's
// bytes for a different build, in place (same inode) and by rename, and
// counts the starts that ran anything but the verified bytes. A start may be
// refused (the copy hashed the other build) or killed as tampered (the file
// changed after the start); it may never run the other build.
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
			var spawned, loadedOK, refused, tampered, wrong, writes int
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
				if werr := <-swapped; werr != nil {
					t.Fatalf("writer: %v", werr)
				}
				writes++
				if err == nil {
					spawned++
					// The file now holds the other build: what runs must
					// still be the verified bytes.
					if d, derr := exeDigest(p.Pid()); derr == nil && d != impl.ArtifactSHA256 {
						wrong++
						t.Errorf("pid %d runs %s, verified %s", p.Pid(), d, impl.ArtifactSHA256)
					}
					_, err = p.Load(ctx(t))
					if err == nil {
						loadedOK++
						if v := introspect(t, p); v.Build != "A" {
							wrong++
							t.Errorf("pid %d reports build %q", p.Pid(), v.Build)
						}
					}
					p.Close()
				}
				switch f, _ := AsFault(err); {
				case err == nil:
				case f != nil && f.Kind == KindRefused:
					refused++
				case f != nil && f.Kind == KindTampered:
					tampered++
				default:
					t.Fatalf("start %d: %v", i, err)
				}
			}
			t.Logf("%s (swaps spread over %v): %d starts racing %d writes: %d refused before spawn (digest mismatch), %d spawned (%d then killed as tampered by the re-hash, %d loaded and served), %d ran the wrong bytes",
				mode, span, starts, writes, refused, spawned, tampered, loadedOK, wrong)
			if wrong != 0 {
				t.Fatalf("%d starts ran bytes that were not verified", wrong)
			}
			if spawned == 0 || tampered == 0 {
				t.Fatalf("%d of %d starts spawned, %d were caught by the re-hash: the race did not reach the running process", spawned, starts, tampered)
			}
		})
	}
}
