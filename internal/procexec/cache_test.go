package procexec

import (
	"os"
	"testing"

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
	if cached.cache.Len() != 1 {
		t.Fatalf("%d executables cached after a launch", cached.cache.Len())
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
