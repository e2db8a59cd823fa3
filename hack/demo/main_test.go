package main

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// captureFD2 runs fn with file descriptor 2 writing into a pipe and
// returns what was written (the logger holds os.Stderr, that is fd 2).
func captureFD2(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := unix.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup2(int(w.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	fn()
	unix.Dup2(saved, 2)
	unix.Close(saved)
	w.Close()
	out, _ := io.ReadAll(r)
	r.Close()
	return string(out)
}

// The stack trace comes 30 s after the process started, when envtest logs
// through controller-runtime without a logger set; waiting that long is no
// test. What prevents it is a logger set before main runs: here, in the
// same binary, an error logged the way envtest logs reaches stderr, and an
// info line does not. Without the init, both go nowhere (and, 30 s in, the
// stack trace would be printed).
func TestControllerRuntimeHasALoggerBeforeTheDemoRuns(t *testing.T) {
	out := captureFD2(t, func() {
		log := ctrllog.Log.WithName("test-env")
		log.V(1).Info("starting control plane")
		log.Error(errors.New("port in use"), "unable to start the controlplane", "tries", 1)
	})
	if !strings.Contains(out, "unable to start the controlplane") {
		t.Fatalf("an error logged through controller-runtime did not reach stderr (%q): no logger is set before main", out)
	}
	if strings.Contains(out, "starting control plane") || strings.Contains(out, "SetLogger") {
		t.Fatalf("stderr got more than the error: %q", out)
	}
}
