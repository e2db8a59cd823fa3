// Command iteron-sandbox is the sandbox launcher of iteron-operator's
// process executor (internal/sandbox/launcher). The manager, the survivor
// and `kubectl iteron conformance` seal it into a memfd of their own and
// start it, with the provider's sealed executable as descriptor 3; it
// builds the provider's sandbox and then executes the provider. It is never
// run by hand. Build it without cgo (CGO_ENABLED=0): it changes the
// capabilities of every one of its threads.
package main

import "iteron.dev/operator/internal/sandbox/launcher"

func main() { launcher.Main() }
