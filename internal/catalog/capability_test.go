package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

func TestAdmitIsTheSortedIntersection(t *testing.T) {
	tests := []struct {
		name               string
		requested, ceiling []string
		want               []string
	}{
		{"a request inside the ceiling is admitted whole", []string{"read_only"}, []string{"read_only", "reversible_local"}, []string{"read_only"}},
		{"what the ceiling lacks is dropped", []string{"code_executing", "read_only"}, []string{"read_only", "reversible_local"}, []string{"read_only"}},
		{"nothing requested admits nothing", nil, []string{"read_only"}, []string{}},
		{"an empty ceiling admits nothing", []string{"read_only"}, nil, []string{}},
		{"the result is sorted whatever the input order", []string{"trust_mutating", "code_executing"}, []string{"trust_mutating", "code_executing"}, []string{"code_executing", "trust_mutating"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Admit(tc.requested, tc.ceiling)
			if got == nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Admit = %#v, want %#v", got, tc.want)
			}
		})
	}
	if got := NotAdmitted([]string{"code_executing", "read_only"}, []string{"read_only"}); !slices.Equal(got, []string{"code_executing"}) {
		t.Fatalf("NotAdmitted = %v", got)
	}
}

func TestAuthorityDigestIsOverTheCompactArray(t *testing.T) {
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(h[:])
	}
	if got, want := AuthorityDigest([]string{"read_only", "reversible_local"}), sum(`["read_only","reversible_local"]`); got != want {
		t.Fatalf("AuthorityDigest = %s, want %s", got, want)
	}
	if got, want := AuthorityDigest(nil), sum(`[]`); got != want {
		t.Fatalf("AuthorityDigest(nil) = %s, want %s", got, want)
	}
	if AuthorityDigest([]string{"reversible_local", "read_only"}) != AuthorityDigest([]string{"read_only", "reversible_local"}) {
		t.Fatal("the digest depends on input order; it is over the sorted set")
	}
}

func TestNarrowCeilingNeverWidens(t *testing.T) {
	node := []string{"read_only", "reversible_local"}
	if got := NarrowCeiling(node, nil); !slices.Equal(got, node) {
		t.Fatalf("no activation ceiling: %v", got)
	}
	if got := NarrowCeiling(node, []string{"read_only"}); !slices.Equal(got, []string{"read_only"}) {
		t.Fatalf("narrowed: %v", got)
	}
	if got := NarrowCeiling(node, []string{"code_executing", "read_only"}); !slices.Equal(got, []string{"read_only"}) {
		t.Fatalf("an activation widened the node's ceiling: %v", got)
	}
}

func TestParseCeilingReadsTheManagerFlag(t *testing.T) {
	got, err := ParseCeiling(DefaultCeiling)
	if err != nil || !slices.Equal(got, []string{"read_only", "reversible_local"}) {
		t.Fatalf("default ceiling = %v, %v", got, err)
	}
	got, err = ParseCeiling(" reversible_local , read_only,read_only")
	if err != nil || !slices.Equal(got, []string{"read_only", "reversible_local"}) {
		t.Fatalf("spaced, repeated = %v, %v", got, err)
	}
	if got, err := ParseCeiling(""); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("empty = %#v, %v", got, err)
	}
	_, err = ParseCeiling("read_only,sudo")
	expectError(t, err, "capability ceiling[1]", "verification_failed", ErrInvalidValue, "sudo")
}

func TestCheckCapabilitySetAcceptsTheCanonicalForm(t *testing.T) {
	if err := CheckCapabilitySet("caps", Capabilities()); err != nil {
		t.Fatal(err)
	}
	if err := CheckCapabilitySet("caps", nil); err != nil {
		t.Fatal(err)
	}
}
