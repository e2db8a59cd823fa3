package counter

import "os"

// The process's stdio, variables so that Main reads like the binaries' mains.
var (
	stdin  = os.Stdin
	stdout = os.Stdout
	stderr = os.Stderr
)
