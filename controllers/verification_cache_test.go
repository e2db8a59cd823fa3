package controllers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
)

// cacheFixture is an activation of one module whose executable is a small
// file of the test's own (the cache never runs it), and the resolver the
// manager uses.
type cacheFixture struct {
	act     *iteronv1.ImplementationActivation
	exe     string
	resolve func(context.Context, *iteronv1.ImplementationActivationSpec) Resolution
}

func newCacheFixture(t *testing.T) cacheFixture {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "provider")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho provider\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	impl, err := artifacts.Layout(filepath.Join(t.TempDir(), "root"), artifacts.Spec{
		Binary: bin, Module: "prompt_system", ImplementationID: "counter", Version: catalog.Version{1, 0, 0}, Protocol: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	src := providertest.Catalog(t, impl)[0]
	v, err := verifier.NewVerifier(verifier.Config{})
	if err != nil {
		t.Fatal(err)
	}
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "stack", UID: "uid-1", Generation: 1},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: "n", CandidateSHA256: providertest.CandidateSHA256, Sources: []iteronv1.ActivationSource{{
			Module: "prompt_system", ImplementationID: "counter", CatalogPath: src.CatalogPath, ArtifactRoot: src.ArtifactRoot,
			ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256,
		}}},
	}
	return cacheFixture{act: act, exe: src.Executable, resolve: NewResolver(v)}
}

// verifyAndKeep resolves the fixture's spec and keeps the result, as
// reconcileResolve does on a miss.
func (f cacheFixture) verifyAndKeep(t *testing.T, c *verificationCache) Resolution {
	t.Helper()
	res := f.resolve(context.Background(), &f.act.Spec)
	c.put(types.NamespacedName{Namespace: f.act.Namespace, Name: f.act.Name}, verificationKeyOf(f.act), res)
	return res
}

func (f cacheFixture) kept(c *verificationCache, act *iteronv1.ImplementationActivation) bool {
	_, ok := c.get(types.NamespacedName{Namespace: act.Namespace, Name: act.Name}, verificationKeyOf(act))
	return ok
}

// waitUnracy waits until paths were last changed more than
// verifier.RacyWindow ago, when their stamps start to vouch for them.
func waitUnracy(t *testing.T, paths ...string) {
	t.Helper()
	var newest time.Time
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		// A file's ctime is at least its mtime; the write that made it
		// set both.
		if fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	time.Sleep(time.Until(newest.Add(verifier.RacyWindow + 100*time.Millisecond)))
}

func TestAVerificationIsKeptForItsKeyWhileItsFilesAreUnchanged(t *testing.T) {
	f := newCacheFixture(t)
	var c verificationCache
	res := f.verifyAndKeep(t, &c)
	if !res.Reusable || len(res.Files) != 2 {
		t.Fatalf("the resolution of a verified spec: reusable %v, files %+v; want reusable with the catalog and the executable", res.Reusable, res.Files)
	}
	if f.kept(&c, f.act) {
		t.Fatal("files changed a moment ago were vouched for: a second change in the same timestamp tick would go unseen")
	}

	waitUnracy(t, f.act.Spec.Sources[0].CatalogPath, f.exe)
	f.verifyAndKeep(t, &c)
	if !f.kept(&c, f.act) {
		t.Fatal("a verification of unchanged files was not kept")
	}
	for what, edit := range map[string]func(*iteronv1.ImplementationActivation){
		"another spec generation":  func(a *iteronv1.ImplementationActivation) { a.Generation++ },
		"another activation (UID)": func(a *iteronv1.ImplementationActivation) { a.UID = "uid-2" },
		"another pinned digest": func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[0].ArtifactSHA256 = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
		},
	} {
		other := f.act.DeepCopy()
		edit(other)
		if f.kept(&c, other) {
			t.Errorf("the verification answered for %s", what)
		}
	}

	// The executable rewritten in place, same size, other bytes: its
	// inode stays, its mtime and ctime move.
	data, err := os.ReadFile(f.exe)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-2] = 'X'
	if err := os.WriteFile(f.exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if f.kept(&c, f.act) {
		t.Fatal("a verification answered for an executable rewritten since")
	}
	// Verified again, it fails, and nothing is kept: an older success
	// must not answer once the same spec failed.
	if res := f.verifyAndKeep(t, &c); res.Reusable || len(res.Modules) != 1 || res.Modules[0].Plan != nil {
		t.Fatalf("the rewritten executable verified: %+v", res)
	}
	if _, ok := c.entries[types.NamespacedName{Namespace: f.act.Namespace, Name: f.act.Name}]; ok {
		t.Fatal("a failed verification left the previous entry in place")
	}
}

func TestAVerificationIsNotKeptForAFileReachedThroughASymlinkOrGone(t *testing.T) {
	f := newCacheFixture(t)
	var c verificationCache
	waitUnracy(t, f.act.Spec.Sources[0].CatalogPath, f.exe)
	f.verifyAndKeep(t, &c)
	if !f.kept(&c, f.act) {
		t.Fatal("a verification of unchanged files was not kept")
	}
	// The catalog's directory moved away and a symlink to it put in its
	// place: the catalog file is the same inode, but the verifier refuses
	// a path through a symlink, so the stamp must not vouch for it.
	catalogDir := filepath.Dir(f.act.Spec.Sources[0].CatalogPath)
	moved := catalogDir + ".moved"
	if err := os.Rename(catalogDir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, catalogDir); err != nil {
		t.Fatal(err)
	}
	if f.kept(&c, f.act) {
		t.Fatal("a verification answered for a catalog now reached through a symlink")
	}
	if err := os.Remove(catalogDir); err != nil {
		t.Fatal(err)
	}
	if f.kept(&c, f.act) {
		t.Fatal("a verification answered for a catalog that is gone")
	}
	if err := os.Rename(moved, catalogDir); err != nil {
		t.Fatal(err)
	}
	if !f.kept(&c, f.act) {
		t.Fatal("the catalog back where it was verified, unchanged, was not vouched for")
	}
	c.forget(types.NamespacedName{Namespace: f.act.Namespace, Name: f.act.Name})
	if f.kept(&c, f.act) {
		t.Fatal("a forgotten activation's verification still answered")
	}
}
