package procexec

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
)

func TestASecondLaunchRunsTheSealedCopyOfItsDigestAndTamperingIsStillCaught(t *testing.T) {
	impl := implement(t, artifacts.Stateless)
	plan := providertest.Plan(t, impl)
	other, err := os.ReadFile(providertest.Variant(t, artifacts.Stateless, "-X main.build=B"))
	if err != nil {
		t.Fatal(err)
	}
	cached := newExecutor(t)
	uncachedCfg := DefaultConfig(t.TempDir())
	uncachedCfg.ExecutableCacheBytes = 0
	uncached, err := NewExecutor(uncachedCfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cached.Launch(plan)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if cached.cache.len() != 1 {
		t.Fatalf("%d executables cached after a launch", cached.cache.len())
	}
	// The file now holds other bytes.
	if err := os.WriteFile(impl.Executable, other, 0o755); err != nil {
		t.Fatal(err)
	}
	// Without a cache the copy hashes the other bytes: refused, nothing runs.
	if _, err := uncached.Launch(plan); faultKind(err) != KindRefused {
		t.Fatalf("an uncached launch of the rewritten file: %v, want a refusal", err)
	}
	// With the cache the verified copy runs, and the re-hash after the start
	// still finds the file changed.
	p, err = cached.Launch(plan)
	if err != nil {
		t.Fatalf("a cached launch: %v", err)
	}
	defer p.Close()
	if d, err := exeDigest(p.Pid()); err != nil || d != impl.ArtifactSHA256 {
		t.Fatalf("the cached launch runs %s (%v), verified %s", d, err, impl.ArtifactSHA256)
	}
	if _, err := p.Load(ctx(t)); faultKind(err) != KindTampered {
		t.Fatalf("Load after a cached launch of a rewritten file: %v, want tampering", err)
	}
}

func TestTheExecutableCacheEvictsTheLeastRecentlyUsedWithinItsBound(t *testing.T) {
	memfd := func(content string) *os.File {
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "test")
		f.WriteString(content)
		t.Cleanup(func() { f.Close() })
		return f
	}
	c := newExeCache(10)
	c.put("a", memfd("aaaaaa"), 6, []byte("aa"))
	c.put("b", memfd("bbbb"), 4, []byte("bb"))
	if f, head, ok := c.get("a"); !ok || string(head) != "aa" {
		t.Fatal("a is not cached")
	} else {
		f.Close()
	}
	c.put("c", memfd("cccc"), 4, nil) // 6+4+4 > 10: b, the least recently used, goes
	if _, _, ok := c.get("b"); ok {
		t.Fatal("b was not evicted")
	}
	for _, d := range []string{"a", "c"} {
		f, _, ok := c.get(d)
		if !ok {
			t.Fatalf("%s was evicted", d)
		}
		f.Close()
	}
	c.put("huge", memfd("x"), 11, nil)
	if _, _, ok := c.get("huge"); ok || c.len() != 2 {
		t.Fatalf("an executable over the bound was cached (%d entries)", c.len())
	}
	var off *exeCache = newExeCache(0)
	off.put("a", memfd("a"), 1, nil)
	if _, _, ok := off.get("a"); ok {
		t.Fatal("a cache of 0 bytes cached something")
	}
}
