// Package otlptest is a real OTLP/gRPC trace receiver for tests: the trace
// service of the OpenTelemetry collector protocol
// (go.opentelemetry.io/proto/otlp), listening on loopback, keeping every
// span it is sent. An exporter configured as a node's would be (the
// OTEL_EXPORTER_OTLP_* endpoint) sends to it over real gRPC.
package otlptest

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Receiver is an OTLP/gRPC trace receiver on 127.0.0.1.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr string
	srv  *grpc.Server

	mu    sync.Mutex
	spans []Span
}

// Span is one received span, with its service (resource service.name).
type Span struct {
	*tracepb.Span
	Service string
}

// TraceID is the span's trace ID in hex.
func (s Span) TraceID() string { return hex.EncodeToString(s.Span.TraceId) }

// SpanID is the span's ID in hex.
func (s Span) SpanID() string { return hex.EncodeToString(s.Span.SpanId) }

// ParentID is the parent span's ID in hex ("" for a root).
func (s Span) ParentID() string { return hex.EncodeToString(s.Span.ParentSpanId) }

// Attr is the string form of the span's attribute key ("" when absent):
// a string as it is, an integer in decimal.
func (s Span) Attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key != key {
			continue
		}
		if _, ok := a.Value.Value.(*commonpb.AnyValue_IntValue); ok {
			return strconv.FormatInt(a.Value.GetIntValue(), 10)
		}
		return a.Value.GetStringValue()
	}
	return ""
}

// LinksTo reports whether the span links to the span spanID (hex).
func (s Span) LinksTo(spanID string) bool {
	for _, l := range s.Links {
		if hex.EncodeToString(l.SpanId) == spanID {
			return true
		}
	}
	return false
}

// Start starts a receiver; it stops when the test ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &Receiver{addr: lis.Addr().String(), srv: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(r.srv, r)
	go r.srv.Serve(lis) //nolint:errcheck // ends with Stop
	tb.Cleanup(r.srv.Stop)
	return r
}

// Endpoint is the receiver's host:port.
func (r *Receiver) Endpoint() string { return r.addr }

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.spans = append(r.spans, Span{Span: sp, Service: service})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns the spans received so far, in start order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	out := slices.Clone(r.spans)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Span) int {
		switch {
		case a.StartTimeUnixNano < b.StartTimeUnixNano:
			return -1
		case a.StartTimeUnixNano > b.StartTimeUnixNano:
			return 1
		}
		return 0
	})
	return out
}

// WaitFor waits up to 30 s until match holds for the spans received, and
// returns them; it fails the test when it does not.
func (r *Receiver) WaitFor(tb testing.TB, what string, match func([]Span) bool) []Span {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans := r.Spans()
		if match(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			for _, s := range spans {
				tb.Logf("received: %s trace %s span %s parent %s", s.Name, s.TraceID(), s.SpanID(), s.ParentID())
			}
			tb.Fatalf("the receiver never got %s (%d spans received)", what, len(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ChildEnv, set in a test binary's environment, makes its TestMain serve
// as a receiver process (ServeChild) instead of running tests: a benchmark
// then measures the manager's cost of exporting without the receiver's
// own work in the same process.
const ChildEnv = "ITERON_OTLPTEST_RECEIVER"

// ServeChild serves a receiver on loopback, prints its endpoint on stdout,
// and, when stdin closes, prints the number of spans received and returns.
func ServeChild() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stdout, "error:", err)
		return
	}
	r := &Receiver{addr: lis.Addr().String(), srv: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(r.srv, r)
	go r.srv.Serve(lis) //nolint:errcheck // ends with Stop
	fmt.Fprintln(os.Stdout, r.addr)
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // EOF is the signal
	r.mu.Lock()
	n := len(r.spans)
	r.mu.Unlock()
	fmt.Fprintln(os.Stdout, n)
	r.srv.Stop()
}

// Child is a receiver in a process of its own (ServeChild).
type Child struct {
	endpoint string
	stdin    io.WriteCloser
	out      *bufio.Reader
	cmd      *exec.Cmd
}

// StartChild re-executes the test binary as a receiver process; it is
// stopped when the test ends.
func StartChild(tb testing.TB) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), ChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &Child{stdin: stdin, out: bufio.NewReader(stdout), cmd: cmd}
	tb.Cleanup(func() {
		c.stdin.Close()
		cmd.Wait() //nolint:errcheck // its output was read or is not wanted
	})
	line, err := c.out.ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error:") {
		tb.Fatalf("the receiver process did not start: %q %v", line, err)
	}
	c.endpoint = strings.TrimSpace(line)
	return c
}

// Endpoint is the receiver's host:port.
func (c *Child) Endpoint() string { return c.endpoint }

// Received stops the receiver and returns how many spans it got.
func (c *Child) Received(tb testing.TB) int {
	tb.Helper()
	c.stdin.Close()
	line, err := c.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("the receiver process's count: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		tb.Fatalf("the receiver process's count %q: %v", line, err)
	}
	return n
}
