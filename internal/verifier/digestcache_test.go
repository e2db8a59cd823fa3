package verifier

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func cachedDigest(t *testing.T, c *digestCache, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := c.digest(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestTheDigestCacheNeverReturnsTheDigestOfAnOlderVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "provider")
	v1, v2 := []byte("version one of the provider"), []byte("version two of the provider")
	if err := os.WriteFile(path, v1, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newDigestCache()

	// A file changed just now is hashed, and not remembered: it could
	// change again within the same timestamp tick.
	if d := cachedDigest(t, c, path); d != sha(v1) {
		t.Fatalf("digest %s, want %s", d, sha(v1))
	}
	if len(c.entries) != 0 {
		t.Fatalf("a file changed %v ago was remembered", racyWindow)
	}

	// Once its last change is older than the racy window, it is.
	time.Sleep(racyWindow + 100*time.Millisecond)
	if d := cachedDigest(t, c, path); d != sha(v1) {
		t.Fatalf("digest %s, want %s", d, sha(v1))
	}
	if len(c.entries) != 1 {
		t.Fatalf("%d entries after hashing an unchanged file; want it remembered", len(c.entries))
	}
	if d := cachedDigest(t, c, path); d != sha(v1) {
		t.Fatalf("remembered digest %s, want %s", d, sha(v1))
	}

	// The same size, other bytes, written in place: hashed again.
	if err := os.WriteFile(path, v2, 0o755); err != nil {
		t.Fatal(err)
	}
	if d := cachedDigest(t, c, path); d != sha(v2) {
		t.Fatalf("after the file changed: digest %s, want %s (never the remembered one)", d, sha(v2))
	}
}
