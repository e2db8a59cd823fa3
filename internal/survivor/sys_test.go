package survivor

import (
	"net"
	"runtime"

	"iteron.dev/operator/examples/providers/artifacts"
)

func runtimeLockOSThread() { runtime.LockOSThread() }

func dialUnix(path string) (*net.UnixConn, error) {
	return net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
}

func artifactsSpecStateless() artifacts.Spec { return artifacts.Spec{Binary: artifacts.Stateless} }
