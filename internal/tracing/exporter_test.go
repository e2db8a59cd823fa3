package tracing

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestReadExporterSettings(t *testing.T) {
	cases := []struct {
		name     string
		protocol string
		env      map[string]string
		want     ExporterSettings
		err      string
	}{
		{name: "a gRPC endpoint with http:// is sent without TLS", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
			want: ExporterSettings{Endpoint: "collector:4317", Insecure: true}},
		{name: "a gRPC endpoint with https:// is sent with TLS", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317"},
			want: ExporterSettings{Endpoint: "collector:4317"}},
		{name: "a bare gRPC host:port uses TLS unless INSECURE says not", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
			want: ExporterSettings{Endpoint: "collector:4317", Insecure: true}},
		{name: "the HTTP endpoint gets the traces path", protocol: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
			want: ExporterSettings{Endpoint: "http://collector:4318/v1/traces"}},
		{name: "the traces endpoint is used as it is", protocol: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/custom"},
			want: ExporterSettings{Endpoint: "https://c/custom"}},
		{name: "headers, timeout and gzip over HTTP are read", protocol: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
			"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x, tenant=a", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
			want: ExporterSettings{Endpoint: "http://c:4318/v1/traces", Gzip: true, Timeout: 2500 * time.Millisecond, Headers: map[string]string{"authorization": "Bearer x", "tenant": "a"}}},
		{name: "gzip over gRPC is refused, saying why", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, err: "OTEL_EXPORTER_OTLP_COMPRESSION=gzip: the manager sends OTLP/gRPC uncompressed"},
		{name: "an unknown compression is refused", protocol: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, err: `OTEL_EXPORTER_OTLP_COMPRESSION="zstd"`},
		{name: "a header without a value is refused", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "tenant"}, err: "OTEL_EXPORTER_OTLP_HEADERS"},
		{name: "a timeout that is not milliseconds is refused", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, err: `OTEL_EXPORTER_OTLP_TIMEOUT="10s"`},
		{name: "a gRPC endpoint of another scheme is refused", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "unix:///run/otel.sock"}, err: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "a CA file that does not exist is refused", protocol: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, err: "OTEL_EXPORTER_OTLP_CERTIFICATE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := readExporterSettings(tc.protocol, envOf(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v; want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Timeout == 0 {
				tc.want.Timeout = 10 * time.Second
			}
			if s.Endpoint != tc.want.Endpoint || s.Insecure != tc.want.Insecure || s.Gzip != tc.want.Gzip || s.Timeout != tc.want.Timeout {
				t.Fatalf("got %+v; want %+v", s, tc.want)
			}
			for k, v := range tc.want.Headers {
				if s.Headers[k] != v {
					t.Fatalf("header %s = %q; want %q", k, s.Headers[k], v)
				}
			}
		})
	}
}

func TestTheHTTPClientPostsGzippedProtobufWithItsHeaders(t *testing.T) {
	var spans atomic.Int64
	var bad atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || r.Header.Get("Content-Encoding") != "gzip" || r.Header.Get("Tenant") != "a" {
			bad.Store(r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type") + " " + r.Header.Get("Content-Encoding"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(zr)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans.Add(int64(len(ss.Spans)))
			}
		}
	}))
	defer srv.Close()
	s, err := readExporterSettings("http/protobuf", envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_HEADERS": "tenant=a"}))
	if err != nil {
		t.Fatal(err)
	}
	exp, err := NewExporter(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	for range 3 {
		_, sp := tp.Tracer("t").Start(context.Background(), "s")
		sp.End()
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := bad.Load(); b != nil || spans.Load() != 3 {
		t.Fatalf("the collector got %d spans (a bad request: %v); want 3", spans.Load(), b)
	}
}

func TestAnExportTheCollectorRefusesIsAnErrorNamingTheEndpointAndStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "quota exceeded", http.StatusTooManyRequests)
	}))
	defer srv.Close()
	exp, err := NewExporter(context.Background(), ExporterSettings{Protocol: "http/protobuf", Endpoint: srv.URL + "/v1/traces", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(NewBatcher(exp, BatchSettings{time.Hour, 5 * time.Second, 10, 10})))
	defer tp.Shutdown(context.Background()) //nolint:errcheck // the error is the point
	_, sp := tp.Tracer("t").Start(context.Background(), "s")
	sp.End()
	err = tp.ForceFlush(context.Background())
	if err == nil || !strings.Contains(err.Error(), "429") || !strings.Contains(err.Error(), "quota exceeded") || !strings.Contains(err.Error(), srv.URL) {
		t.Fatalf("ForceFlush: %v; want the endpoint, 429 and the collector's message", err)
	}
}
