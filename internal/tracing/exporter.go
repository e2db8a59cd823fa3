package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// The manager's OTLP clients. The OpenTelemetry exporters
// (otlptracegrpc, otlptracehttp) import grpc's gzip compressor, which
// registers itself in the process: every gRPC client of the manager — the
// package runtimes' connections, the gateway's callers built into
// kubectl-iteron — would then advertise gzip on every call, one header and
// one allocation more per call at the server even with tracing off. These
// clients speak the same OTLP (the SDK's otlptrace exporter turns spans into
// its messages) without it: OTLP/gRPC sends uncompressed, and
// OTLP/HTTP compresses with the standard library's gzip.

// ExporterSettings are what the OTEL_EXPORTER_OTLP_* variables say.
type ExporterSettings struct {
	// Protocol is "grpc" or "http/protobuf".
	Protocol string
	// Endpoint is host:port for gRPC, the URL of the traces path for HTTP.
	Endpoint string
	// Insecure sends without TLS.
	Insecure bool
	// Headers are sent with every export.
	Headers map[string]string
	// Timeout bounds one export.
	Timeout time.Duration
	// Gzip compresses (http/protobuf only).
	Gzip bool
	// TLS is the client's TLS configuration (nil: the system's roots).
	TLS *tls.Config
}

// readExporterSettings reads the OTLP exporter variables for protocol; an
// unusable value is an error naming it.
func readExporterSettings(protocol string, env func(string) string) (ExporterSettings, error) {
	get := func(name string) (string, string) {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_" + name, "OTEL_EXPORTER_OTLP_" + name} {
			if v := strings.TrimSpace(env(k)); v != "" {
				return k, v
			}
		}
		return "", ""
	}
	s := ExporterSettings{Protocol: protocol, Timeout: 10 * time.Second, Headers: map[string]string{}}
	if k, v := get("TIMEOUT"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return ExporterSettings{}, fmt.Errorf("%s=%q: want a positive number of milliseconds", k, v)
		}
		s.Timeout = time.Duration(ms) * time.Millisecond
	}
	if k, v := get("HEADERS"); v != "" {
		for _, pair := range strings.Split(v, ",") {
			name, value, ok := strings.Cut(pair, "=")
			name, _ = url.PathUnescape(strings.TrimSpace(name))
			value, err := url.PathUnescape(strings.TrimSpace(value))
			if !ok || name == "" || err != nil {
				return ExporterSettings{}, fmt.Errorf("%s: %q is not name=value", k, pair)
			}
			s.Headers[strings.ToLower(name)] = value
		}
	}
	if k, v := get("COMPRESSION"); v != "" {
		switch {
		case v == "none":
		case v == "gzip" && protocol == "http/protobuf":
			s.Gzip = true
		case v == "gzip":
			return ExporterSettings{}, fmt.Errorf("%s=gzip: the manager sends OTLP/gRPC uncompressed (registering gRPC's gzip would make every gRPC client of the manager advertise it); use OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf to compress", k)
		default:
			return ExporterSettings{}, fmt.Errorf("%s=%q: want gzip or none", k, v)
		}
	}
	insecureKey, insecureValue := get("INSECURE")
	if insecureValue != "" {
		b, err := strconv.ParseBool(insecureValue)
		if err != nil {
			return ExporterSettings{}, fmt.Errorf("%s=%q: want true or false", insecureKey, insecureValue)
		}
		s.Insecure = b
	}
	tlsConfig, err := readTLS(get)
	if err != nil {
		return ExporterSettings{}, err
	}
	s.TLS = tlsConfig

	tracesEndpoint := strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	endpoint := strings.TrimSpace(env("OTEL_EXPORTER_OTLP_ENDPOINT"))
	if protocol == "grpc" {
		raw, key := tracesEndpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
		if raw == "" {
			raw, key = endpoint, "OTEL_EXPORTER_OTLP_ENDPOINT"
		}
		if raw == "" {
			raw = "http://localhost:4317"
		}
		if strings.Contains(raw, "://") {
			u, err := url.Parse(raw)
			if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
				return ExporterSettings{}, fmt.Errorf("%s=%q: want http://host:port, https://host:port or host:port", key, raw)
			}
			s.Endpoint = u.Host
			if u.Scheme == "http" {
				s.Insecure = true
			} else if insecureValue == "" {
				s.Insecure = false
			}
		} else {
			s.Endpoint = raw
		}
		return s, nil
	}
	switch {
	case tracesEndpoint != "":
		s.Endpoint = tracesEndpoint // used as it is, path included
	case endpoint != "":
		s.Endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
	default:
		s.Endpoint = "http://localhost:4318/v1/traces"
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ExporterSettings{}, fmt.Errorf("the OTLP endpoint %q: want an http:// or https:// URL", s.Endpoint)
	}
	return s, nil
}

// readTLS reads the certificate variables (nil when none is set).
func readTLS(get func(string) (string, string)) (*tls.Config, error) {
	caKey, ca := get("CERTIFICATE")
	certKey, cert := get("CLIENT_CERTIFICATE")
	keyKey, key := get("CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caKey, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s=%q: no PEM certificate in it", caKey, ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY (or their TRACES_ forms) go together: %q, %q", cert, key)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", certKey, keyKey, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// NewExporter is the SDK's OTLP span exporter over the manager's client for
// s.Protocol.
func NewExporter(ctx context.Context, s ExporterSettings) (*otlptrace.Exporter, error) {
	var c otlptrace.Client
	if s.Protocol == "grpc" {
		c = &grpcClient{s: s}
	} else {
		c = &httpClient{s: s, hc: &http.Client{Transport: &http.Transport{TLSClientConfig: s.TLS, Proxy: http.ProxyFromEnvironment}}}
	}
	return otlptrace.New(ctx, c)
}

// grpcClient sends OTLP over gRPC, uncompressed.
type grpcClient struct {
	s    ExporterSettings
	conn *grpc.ClientConn
	svc  collectortrace.TraceServiceClient
	md   metadata.MD
}

func (c *grpcClient) Start(context.Context) error {
	creds := insecure.NewCredentials()
	if !c.s.Insecure {
		creds = credentials.NewTLS(c.s.TLS)
	}
	conn, err := grpc.NewClient(c.s.Endpoint, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("the OTLP endpoint %s: %w", c.s.Endpoint, err)
	}
	c.conn, c.svc, c.md = conn, collectortrace.NewTraceServiceClient(conn), metadata.New(c.s.Headers)
	return nil
}

func (c *grpcClient) Stop(context.Context) error { return c.conn.Close() }

func (c *grpcClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, c.md), c.s.Timeout)
	defer cancel()
	_, err := c.svc.Export(ctx, &collectortrace.ExportTraceServiceRequest{ResourceSpans: spans})
	return err
}

// httpClient sends OTLP over HTTP as protobuf.
type httpClient struct {
	s  ExporterSettings
	hc *http.Client
}

func (c *httpClient) Start(context.Context) error { return nil }

func (c *httpClient) Stop(context.Context) error {
	c.hc.CloseIdleConnections()
	return nil
}

func (c *httpClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	body, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: spans})
	if err != nil {
		return err
	}
	if c.s.Gzip {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(body); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		body = buf.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, c.s.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.s.Endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if c.s.Gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	for k, v := range c.s.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("the OTLP endpoint %s answered %s: %s", c.s.Endpoint, resp.Status, bytes.TrimSpace(msg))
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}
