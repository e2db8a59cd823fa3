package packageruntime

import (
	"strings"
	"testing"
)

// The worked examples of docs/reference/package-runtimes.md: a key of bytes
// 0x00…0x1f.
func TestProofAndGrantAreTheDocumentedHMACs(t *testing.T) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	if got, want := Proof(key, strings.Repeat("a", 64), "i-1", "kv-1.0.0"), "a20efefbee1a9d34c5af57ef81f530b5a4824dcc9045d3a39e0aae7c2e03d039"; got != want {
		t.Fatalf("proof %s, want %s", got, want)
	}
	if got, want := Grant(key, "inv-7", "team-a", "get"), "team-a:837825b0d97c8f68e7907a0f3ad79efe7e8d346458bf6eecccfa00aaa0c6402e"; got != want {
		t.Fatalf("grant %s, want %s", got, want)
	}
}
