package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
)

// clientEnv holds the JSON clientSpec of a client subprocess.
const clientEnv = "ITERON_GATEWAY_TEST_CLIENT"

// clientSpec is what a client subprocess does: a handshake, then each call.
type clientSpec struct {
	Socket string           `json:"socket"`
	Calls  []clientSpecCall `json:"calls"`
}

type clientSpecCall struct {
	Namespace, Activation, Module, Input string
}

// clientReport is what it prints (one JSON document).
type clientReport struct {
	UID, GID   int
	Handshake  *gatewayv1.HandshakeResponse `json:",omitempty"`
	HandshakeE string                       `json:",omitempty"`
	Results    []clientResult
}

type clientResult struct {
	Code        string
	Reason      string
	Message     string
	Observation string
}

// runClientProcess is the body of a client subprocess.
func runClientProcess(spec string) int {
	var s clientSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := Dial(s.Socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep := clientReport{UID: os.Getuid(), GID: os.Getgid()}
	if hs, err := c.Handshake(ctx, &gatewayv1.HandshakeRequest{}); err != nil {
		rep.HandshakeE = err.Error()
	} else {
		rep.Handshake = hs
	}
	for _, call := range s.Calls {
		resp, err := c.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: call.Namespace, Activation: call.Activation, Module: call.Module, InputJson: call.Input})
		r := clientResult{}
		if err != nil {
			st, _ := status.FromError(err)
			r.Code, r.Message = st.Code().String(), st.Message()
			if f, ok := ReasonOf(err); ok {
				r.Reason = f.Reason
			}
		} else {
			r.Code, r.Observation = "OK", resp.ObservationJson
		}
		rep.Results = append(rep.Results, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// runClientAs runs a client subprocess as uid:gid (the test runs as root)
// and returns its report. The test binary is copied into dir (which every
// uid can traverse) so that the other uid can execute it.
func runClientAs(t *testing.T, dir string, uid, gid uint32, spec clientSpec) clientReport {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("running a client under another uid needs root")
	}
	bin := filepath.Join(dir, "client")
	if _, err := os.Stat(bin); err != nil {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.Open(self)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(dst, src); err != nil {
			t.Fatal(err)
		}
		src.Close()
		if err := dst.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(spec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{clientEnv + "=" + string(b)}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("client subprocess as %d:%d: %v\nstderr: %s", uid, gid, err, errOut.String())
	}
	var rep clientReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("client report %q: %v", out.String(), err)
	}
	if rep.UID != int(uid) || rep.GID != int(gid) {
		t.Fatalf("the client ran as %d:%d, want %d:%d", rep.UID, rep.GID, uid, gid)
	}
	return rep
}
