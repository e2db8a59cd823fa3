package reasons

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

func TestTheRenderedReferenceIsTheTable(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "reference", "reasons.md")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v (run make generate)", path, err)
	}
	if want := Markdown(); !bytes.Equal(got, want) {
		t.Fatalf("%s differs from internal/reasons: run make generate and commit the result", path)
	}
}

func TestEveryReasonOfAModuleHasAConditionReasonAndEveryCallReasonHasNone(t *testing.T) {
	seen := map[Code]bool{}
	for _, r := range All() {
		if seen[r.Code] {
			t.Errorf("%s appears twice", r.Code)
		}
		seen[r.Code] = true
		if r.Caller == (r.Condition != "") {
			t.Errorf("%s: caller %v but condition reason %q", r.Code, r.Caller, r.Condition)
		}
		if r.Meaning == "" {
			t.Errorf("%s has no meaning for the reference", r.Code)
		}
		if r.Blocks && r.BlockKind == "" {
			t.Errorf("%s may block a transaction but has no block kind", r.Code)
		}
	}
}

func TestConditionReasonsAreTheAPIConstants(t *testing.T) {
	api := map[Code]string{
		UnsupportedVersion: iteronv1.ReasonUnsupportedVersion, VerificationFailed: iteronv1.ReasonVerificationFailed,
		SchemaMismatch: iteronv1.ReasonSchemaMismatch, DependencyUnsatisfied: iteronv1.ReasonDependencyUnsatisfied,
		DependencyCycle: iteronv1.ReasonDependencyCycle, DependencyConflict: iteronv1.ReasonDependencyConflict, StaleGeneration: iteronv1.ReasonStaleGeneration,
		AuthorityChanged: iteronv1.ReasonAuthorityChanged, PermissionDenied: iteronv1.ReasonPermissionDenied,
		ActivationFailed: iteronv1.ReasonActivationFailed, ProviderFailed: iteronv1.ReasonProviderFailed,
		DeadlineExceeded: iteronv1.ReasonDeadlineExceeded, CleanupFailed: iteronv1.ReasonCleanupFailed,
		RollbackFailed: iteronv1.ReasonRollbackFailed, LedgerCorrupt: iteronv1.ReasonLedgerCorrupt,
		LedgerUnwritable: iteronv1.ReasonLedgerUnwritable, QueueFull: iteronv1.ReasonQueueFull,
		Recovering: iteronv1.ReasonRecovering, ArtifactUnavailable: iteronv1.ReasonArtifactUnavailable,
		ArtifactRefused: iteronv1.ReasonArtifactRefused, ProbeFailed: iteronv1.ReasonProbeFailed,
		SandboxUnavailable: iteronv1.ReasonSandboxUnavailable,
		MemoryExceeded:     iteronv1.ReasonMemoryExceeded,
	}
	for _, r := range All() {
		if r.Caller {
			continue
		}
		want, ok := api[r.Code]
		if !ok {
			t.Errorf("%s has no condition reason constant in api/v1alpha1 (add Reason%s there and here)", r.Code, r.Condition)
			continue
		}
		if r.Condition != want {
			t.Errorf("%s: condition reason %q, api says %q", r.Code, r.Condition, want)
		}
	}
}

func TestTheDesignTableHolds(t *testing.T) {
	for _, tc := range []struct {
		code      Code
		condition string
		blockKind string
		blocks    bool
		grpc, run codes.Code
		stalls    bool
	}{
		{UnsupportedVersion, iteronv1.ReasonUnsupportedVersion, BlockValidation, true, codes.FailedPrecondition, codes.FailedPrecondition, true},
		{VerificationFailed, iteronv1.ReasonVerificationFailed, BlockValidation, true, codes.FailedPrecondition, codes.FailedPrecondition, true},
		{DependencyUnsatisfied, iteronv1.ReasonDependencyUnsatisfied, BlockDependency, true, codes.FailedPrecondition, codes.FailedPrecondition, false},
		{PermissionDenied, iteronv1.ReasonPermissionDenied, "", false, codes.PermissionDenied, codes.PermissionDenied, false},
		{ProviderFailed, iteronv1.ReasonProviderFailed, BlockProvider, true, codes.Unavailable, codes.Internal, false},
		{DeadlineExceeded, iteronv1.ReasonDeadlineExceeded, BlockDeadline, true, codes.DeadlineExceeded, codes.DeadlineExceeded, false},
		{CleanupFailed, iteronv1.ReasonCleanupFailed, "", false, codes.Unknown, codes.Unknown, false},
		{RollbackFailed, iteronv1.ReasonRollbackFailed, "", false, codes.Unavailable, codes.Unavailable, true},
		{LedgerCorrupt, iteronv1.ReasonLedgerCorrupt, BlockValidation, true, codes.Unavailable, codes.Unavailable, true},
		{LedgerUnwritable, iteronv1.ReasonLedgerUnwritable, BlockProvider, true, codes.Unavailable, codes.Unavailable, true},
		{QueueFull, iteronv1.ReasonQueueFull, "", false, codes.ResourceExhausted, codes.ResourceExhausted, false},
		{Recovering, iteronv1.ReasonRecovering, "", false, codes.Unavailable, codes.Unavailable, false},
		{ArtifactUnavailable, iteronv1.ReasonArtifactUnavailable, "", false, codes.Unavailable, codes.Unavailable, false},
		{ArtifactRefused, iteronv1.ReasonArtifactRefused, "", false, codes.FailedPrecondition, codes.FailedPrecondition, true},
		{ProbeFailed, iteronv1.ReasonProbeFailed, "", false, codes.FailedPrecondition, codes.FailedPrecondition, true},
		{SandboxUnavailable, iteronv1.ReasonSandboxUnavailable, BlockValidation, true, codes.FailedPrecondition, codes.FailedPrecondition, true},
		{MemoryExceeded, iteronv1.ReasonMemoryExceeded, BlockProvider, true, codes.Unavailable, codes.ResourceExhausted, false},
		{NotFound, "", "", false, codes.NotFound, codes.NotFound, false},
	} {
		if got := ConditionReason(string(tc.code)); got != tc.condition {
			t.Errorf("%s: condition reason %q, want %q", tc.code, got, tc.condition)
		}
		kind, blocks := BlockKindOf(tc.code)
		if kind != tc.blockKind || blocks != tc.blocks {
			t.Errorf("%s: block kind %q/%v, want %q/%v", tc.code, kind, blocks, tc.blockKind, tc.blocks)
		}
		if got := GRPCCode(string(tc.code)); got != tc.grpc {
			t.Errorf("%s: gRPC %s, want %s", tc.code, got, tc.grpc)
		}
		if got := RunGRPCCode(string(tc.code)); got != tc.run {
			t.Errorf("%s: run gRPC %s, want %s", tc.code, got, tc.run)
		}
		if got := Stalls(string(tc.code)); got != tc.stalls {
			t.Errorf("%s: stalls %v, want %v", tc.code, got, tc.stalls)
		}
	}
	if Known("no_such_reason") || GRPCCode("no_such_reason") != codes.Unknown || ConditionReason("no_such_reason") != "" {
		t.Error("an unknown reason is not in the table")
	}
}
