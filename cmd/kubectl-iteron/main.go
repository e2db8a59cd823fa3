// Command kubectl-iteron is the iteron-operator CLI, installed as a kubectl
// plugin (`kubectl iteron …`). Exit status: 0 success, 1 the input is invalid
// or a check failed, 2 a usage error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = 0
	exitInvalid = 1
	exitUsage   = 2
)

// exitError carries the exit code a subcommand wants; the message goes to stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// invalid reports that the input was read but is not valid (exit 1).
func invalid(err error) error { return &exitError{code: exitInvalid, err: err} }

// usage reports a usage error (exit 2).
func usage(err error) error { return &exitError{code: exitUsage, err: err} }

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "error:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// cobra's own errors (unknown command, bad flag, wrong argument count).
	return exitUsage
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "kubectl-iteron",
		Short:         "Verify, plan, inspect and call iteron-operator activations, and steer ActivationSet rollouts",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newDigestCmd(),
		newValidateCmd(),
		newConvertCmd(),
		newPlanCmd(),
		newLedgerCmd(),
		newConformanceCmd(),
		newInvokeCmd(),
		newDoctorCmd(),
		newReceiptsCmd(),
		newPushCmd(),
		newPullCmd(),
		newRolloutCmd(),
	)
	return root
}
