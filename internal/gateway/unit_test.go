package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

func TestEveryReasonMapsToTheCodeOfDesignTable(t *testing.T) {
	cases := []struct {
		reason string
		code   codes.Code
		run    codes.Code // the code when the run itself failed
	}{
		{"unsupported_version", codes.FailedPrecondition, codes.FailedPrecondition},
		{"verification_failed", codes.FailedPrecondition, codes.FailedPrecondition},
		{"schema_mismatch", codes.FailedPrecondition, codes.FailedPrecondition},
		{"dependency_unsatisfied", codes.FailedPrecondition, codes.FailedPrecondition},
		{"dependency_cycle", codes.FailedPrecondition, codes.FailedPrecondition},
		{"stale_generation", codes.FailedPrecondition, codes.FailedPrecondition},
		{"authority_changed", codes.FailedPrecondition, codes.FailedPrecondition},
		{"permission_denied", codes.PermissionDenied, codes.PermissionDenied},
		{"activation_failed", codes.Unavailable, codes.Unavailable},
		{"provider_failed", codes.Unavailable, codes.Internal},
		{"deadline_exceeded", codes.DeadlineExceeded, codes.DeadlineExceeded},
		{"rollback_failed", codes.Unavailable, codes.Unavailable},
		{"ledger_corrupt", codes.Unavailable, codes.Unavailable},
		{"queue_full", codes.ResourceExhausted, codes.ResourceExhausted},
		{"cleanup_failed", codes.Unknown, codes.Unknown},
		{reasons.InvalidRequest, codes.InvalidArgument, codes.InvalidArgument},
		{reasons.NotFound, codes.NotFound, codes.NotFound},
		{reasons.Cancelled, codes.Canceled, codes.Canceled},
		{reasons.Interrupted, codes.Aborted, codes.Aborted},
		{reasons.Unauthenticated, codes.Unauthenticated, codes.Unauthenticated},
		{reasons.InvocationConflict, codes.AlreadyExists, codes.AlreadyExists},
		{"something_else", codes.Unknown, codes.Unknown},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := reasons.GRPCCode(tc.reason); got != tc.code {
				t.Fatalf("CodeOf = %s, want %s", got, tc.code)
			}
			if got := reasons.RunGRPCCode(tc.reason); got != tc.run {
				t.Fatalf("RunCodeOf = %s, want %s", got, tc.run)
			}
		})
	}
	// Every reason the ledger knows (docs/reference/reasons.md) is in the
	// table but cleanup_failed, which never reaches a caller.
	for _, r := range []ledger.ReasonCode{reasons.UnsupportedVersion, reasons.VerificationFailed, reasons.SchemaMismatch,
		reasons.DependencyUnsatisfied, reasons.DependencyCycle, reasons.StaleGeneration, reasons.AuthorityChanged,
		reasons.PermissionDenied, reasons.ActivationFailed, reasons.ProviderFailed, reasons.DeadlineExceeded,
		reasons.RollbackFailed, reasons.LedgerCorrupt, reasons.QueueFull} {
		if reasons.GRPCCode(string(r)) == codes.Unknown {
			t.Errorf("reason %s has no code", r)
		}
	}
}

func TestAFailureCarriesItsReasonInTheMessageAndADetail(t *testing.T) {
	err := failure(codes.FailedPrecondition, "stale_generation", "module m serves generation 3", 3)
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "stale_generation: module m serves generation 3" {
		t.Fatalf("status %v", st)
	}
	f, ok := ReasonOf(err)
	if !ok || f.Reason != "stale_generation" || f.Message != "module m serves generation 3" || f.Generation != 3 {
		t.Fatalf("ReasonOf = %+v, %v", f, ok)
	}
	// Without the detail, the prefix is read.
	f, ok = ReasonOf(status.Error(codes.ResourceExhausted, "queue_full: 1024 waiting"))
	if !ok || f.Reason != "queue_full" || f.Message != "1024 waiting" {
		t.Fatalf("ReasonOf(prefix) = %+v", f)
	}
	// A status the gRPC library made itself has no reason.
	f, ok = ReasonOf(status.Error(codes.Unavailable, "connection error: desc = dial unix /x: connect: no such file"))
	if !ok || f.Reason != "" {
		t.Fatalf("ReasonOf(transport) = %+v", f)
	}
	if _, ok := ReasonOf(errors.New("plain")); ok {
		t.Fatal("a plain error read as a status")
	}
}

func TestListen(t *testing.T) {
	t.Run("the socket is 0660, in the configured group, and appears only once it is", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "gw.sock")
		lis, err := Listen(path, testGroup)
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 || st.Gid != testGroup {
			t.Fatalf("socket %v gid %d; want a socket 0660 in group %d", fi.Mode(), st.Gid, testGroup)
		}
		entries, _ := os.ReadDir(filepath.Dir(path))
		if len(entries) != 1 {
			t.Fatalf("directory holds %v; want only the socket (no temporary name left)", entries)
		}
	})

	t.Run("a stale socket is replaced and the new one answers", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "gw.sock")
		stale, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close() // what a killed manager leaves behind
		lis, err := Listen(path, -1)
		if err != nil {
			t.Fatalf("over a stale socket: %v", err)
		}
		defer lis.Close()
		go func() {
			c, err := lis.Accept()
			if err == nil {
				c.Close()
			}
		}()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial the new socket: %v", err)
		}
		c.Close()
	})

	t.Run("closing removes the socket, but not one that replaced it", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "gw.sock")
		first, err := Listen(path, -1)
		if err != nil {
			t.Fatal(err)
		}
		second, err := Listen(path, -1)
		if err != nil {
			t.Fatal(err)
		}
		first.Close()
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("closing the replaced listener removed its successor's socket: %v", err)
		}
		second.Close()
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Fatalf("socket still there after Close: %v", err)
		}
	})

	refusals := []struct {
		name  string
		setup func(dir string) string
		why   string
	}{
		{"a regular file at the path is never removed", func(dir string) string {
			p := filepath.Join(dir, "gw.sock")
			os.WriteFile(p, []byte("data"), 0o644)
			return p
		}, "is not a socket"},
		{"a directory at the path is refused", func(dir string) string {
			p := filepath.Join(dir, "gw.sock")
			os.Mkdir(p, 0o755)
			return p
		}, "is not a socket"},
		{"a symlink at the path is refused", func(dir string) string {
			p := filepath.Join(dir, "gw.sock")
			os.Symlink("/etc/passwd", p)
			return p
		}, "is not a socket"},
		{"a path over 107 bytes is refused", func(dir string) string {
			return filepath.Join(dir, strings.Repeat("s", 108-len(dir)))
		}, "a unix socket path is at most 107"},
		{"a relative path is refused", func(string) string { return "gw.sock" }, "absolute"},
		{"a path with a dot segment is refused", func(dir string) string { return dir + "/../gw.sock" }, "absolute, clean"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			dir := socketDir(t)
			path := tc.setup(dir)
			before, _ := os.Lstat(path)
			_, err := Listen(path, -1)
			var se *SocketError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Listen(%s) = %v; want a SocketError saying %q", path, err, tc.why)
			}
			if before != nil {
				after, err := os.Lstat(path)
				if err != nil || after.Mode() != before.Mode() {
					t.Fatalf("the refused path changed: %v %v", after, err)
				}
			}
		})
	}
}

func TestTheInvocationTableIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	mk := func(i int) *invocation {
		inv := newInvocation()
		inv.key = fmt.Sprint("ns\x00id-", i)
		return inv
	}
	end := func(tb *invocationTable, inv *invocation, size int64) {
		inv.finished, inv.size = clock(), size
		close(inv.done)
		tb.markEnded(inv)
	}

	t.Run("an ended invocation is remembered for the TTL and then forgotten", func(t *testing.T) {
		tb := newInvocationTable(time.Minute, 10, 1<<20, clock)
		inv := mk(1)
		tb.admit(inv)
		end(tb, inv, 100)
		now = now.Add(59 * time.Second)
		if _, ok := tb.lookup(inv.key); !ok {
			t.Fatal("forgotten before the TTL")
		}
		now = now.Add(2 * time.Second)
		if _, ok := tb.lookup(inv.key); ok {
			t.Fatal("remembered after the TTL")
		}
		if entries, ended, bytes, _ := tb.stats(); entries != 0 || ended != 0 || bytes != 0 {
			t.Fatalf("after expiry: %d entries, %d ended, %d bytes", entries, ended, bytes)
		}
	})

	t.Run("at the entry bound the oldest ended invocation is forgotten first", func(t *testing.T) {
		tb := newInvocationTable(time.Hour, 3, 1<<20, clock)
		invs := []*invocation{mk(1), mk(2), mk(3)}
		for _, inv := range invs {
			tb.admit(inv)
		}
		end(tb, invs[1], 10)
		end(tb, invs[0], 10)
		if _, existing, full := tb.admit(mk(4)); existing || full != nil {
			t.Fatalf("admit at the bound: existing=%v full=%v", existing, full)
		}
		if _, ok := tb.lookup(invs[1].key); ok {
			t.Fatal("the invocation that ended first is still remembered")
		}
		if _, ok := tb.lookup(invs[0].key); !ok {
			t.Fatal("a newer ended invocation was forgotten")
		}
		_, _, _, forgot := tb.stats()
		if forgot != 1 {
			t.Fatalf("forgot %d early; want 1", forgot)
		}
	})

	t.Run("when every remembered invocation is running a new one is refused", func(t *testing.T) {
		tb := newInvocationTable(time.Hour, 2, 1<<20, clock)
		tb.admit(mk(1))
		tb.admit(mk(2))
		if _, _, full := tb.admit(mk(3)); full == nil || full.n != 2 {
			t.Fatalf("admit with 2 running of 2: %v; want refused", full)
		}
		if known, existing, full := tb.admit(mk(1)); !existing || full != nil || known == nil {
			t.Fatal("a repeat of a running invocation was not found at the bound")
		}
	})

	t.Run("the byte bound forgets the oldest ended invocations", func(t *testing.T) {
		tb := newInvocationTable(time.Hour, 100, 1000, clock)
		a, b, c := mk(1), mk(2), mk(3)
		for _, inv := range []*invocation{a, b, c} {
			tb.admit(inv)
			end(tb, inv, 400)
		}
		if _, ok := tb.lookup(a.key); ok {
			t.Fatal("1200 bytes kept under a 1000-byte bound")
		}
		if _, ok := tb.lookup(c.key); !ok {
			t.Fatal("the newest outcome was forgotten")
		}
		if _, _, bytes, _ := tb.stats(); bytes != 800 {
			t.Fatalf("%d bytes accounted; want 800", bytes)
		}
	})

	t.Run("an abandoned invocation is forgotten at once", func(t *testing.T) {
		tb := newInvocationTable(time.Hour, 10, 1<<20, clock)
		inv := mk(1)
		tb.admit(inv)
		tb.abandon(inv)
		if _, ok := tb.lookup(inv.key); ok {
			t.Fatal("still remembered")
		}
	})
}
