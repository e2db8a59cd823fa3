// Package registrytest runs the real CNCF distribution registry (bin/registry,
// built by `make registry`) on loopback for tests and the demo: filesystem
// storage in a temporary directory, TLS from a CA generated here, htpasswd
// auth when users are given, and its access log kept so that a test can
// count the requests it served. The registry can be stopped and started
// again on the same address with the same storage.
package registrytest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	"iteron.dev/operator/test/childproc"
)

// Options configure a registry.
type Options struct {
	// Dir holds its storage, configuration, certificates and log.
	Dir string
	// Binary is the registry binary (default: <repo>/bin/registry).
	Binary string
	// Users, when set, turns on htpasswd auth with these user → password.
	Users map[string]string
	// PlainHTTP serves without TLS (loopback only).
	PlainHTTP bool
}

// Registry is a running (or stopped) registry.
type Registry struct {
	// Host is its host:port on 127.0.0.1.
	Host string
	// CAFile is the PEM CA that signed its certificate ("" for plain HTTP).
	CAFile string
	// LogFile is where its output goes.
	LogFile string
	// Client trusts the CA (for raw registry calls in tests).
	Client *http.Client

	o      Options
	config string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
}

// RepoRoot finds the repository root from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(data, []byte("module iteron.dev/operator\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("registrytest: not inside the iteron-operator repository")
		}
		dir = parent
	}
}

// Start writes the configuration and starts the registry, waiting until it
// answers /v2/.
func Start(ctx context.Context, o Options) (*Registry, error) {
	if o.Binary == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		o.Binary = filepath.Join(root, "bin", "registry")
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("registrytest: %s: %w (run `make registry`)", o.Binary, err)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: fmt.Sprintf("127.0.0.1:%d", port), LogFile: filepath.Join(o.Dir, "registry.log"), o: o, config: filepath.Join(o.Dir, "config.yml")}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
  formatter: json
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  draintimeout: 1s
`, filepath.Join(o.Dir, "storage"), r.Host)
	r.Client = &http.Client{Timeout: 30 * time.Second}
	if !o.PlainHTTP {
		ca, caKey, err := newCA()
		if err != nil {
			return nil, err
		}
		r.ca, r.caKey = ca, caKey
		certPEM, keyPEM, err := leafPEM(ca, caKey)
		if err != nil {
			return nil, err
		}
		caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
		r.CAFile = filepath.Join(o.Dir, "ca.pem")
		for name, data := range map[string][]byte{"ca.pem": caPEM, "cert.pem": certPEM, "key.pem": keyPEM} {
			if err := os.WriteFile(filepath.Join(o.Dir, name), data, 0o600); err != nil {
				return nil, err
			}
		}
		if err := os.Chmod(r.CAFile, 0o644); err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", filepath.Join(o.Dir, "cert.pem"), filepath.Join(o.Dir, "key.pem"))
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		r.Client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	if len(o.Users) > 0 {
		var lines []string
		for u, p := range o.Users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				return nil, err
			}
			lines = append(lines, u+":"+string(h))
		}
		htpasswd := filepath.Join(o.Dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: iteron-test\n    path: %s\n", htpasswd)
	}
	if err := os.WriteFile(r.config, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if err := r.Restart(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// URL is the registry's base URL.
func (r *Registry) URL() string {
	if r.o.PlainHTTP {
		return "http://" + r.Host
	}
	return "https://" + r.Host
}

// Restart starts the registry again (after Stop) on the same address and
// storage, and waits until it answers.
func (r *Registry) Restart(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return errors.New("registrytest: already running")
	}
	logf, err := os.OpenFile(r.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.o.Binary, "serve", r.config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"PATH=/usr/bin:/bin", "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := childproc.Start(cmd, syscall.SIGKILL); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.Client.Get(r.URL() + "/v2/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("registrytest: the registry exited at start; its log:\n%s", r.Log())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("registrytest: the registry did not answer within 30s: %v; its log:\n%s", err, r.Log())
		}
	}
}

// Stop kills the registry (SIGKILL to the process it started: a registry
// that vanishes mid-transfer) and waits for it to exit.
func (r *Registry) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.done
	r.cmd = nil
}

// Log returns the registry's output so far.
func (r *Registry) Log() string {
	data, _ := os.ReadFile(r.LogFile)
	return string(data)
}

var accessLine = regexp.MustCompile(`"(GET|HEAD|PUT|POST|PATCH|DELETE) (/v2/[^ ]*) HTTP/[0-9.]+" ([0-9]{3}) `)

// Request is one request of the access log.
type Request struct {
	Method, Path string
	Status       int
}

// Requests parses the access log: every request the registry answered.
func (r *Registry) Requests() []Request {
	var out []Request
	sc := bufio.NewScanner(strings.NewReader(r.Log()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := accessLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var status int
		fmt.Sscan(m[3], &status)
		out = append(out, Request{Method: m[1], Path: m[2], Status: status})
	}
	return out
}

// Count counts the requests whose method is method ("" any) and whose path
// contains sub, after a Sync (a count of -1 says the Sync failed).
func (r *Registry) Count(method, sub string) int {
	qs, err := r.SyncedRequests()
	if err != nil {
		return -1
	}
	n := 0
	for _, q := range qs {
		if (method == "" || q.Method == method) && strings.Contains(q.Path, sub) {
			n++
		}
	}
	return n
}

// DockerConfig writes a docker config.json with user:password for this
// registry to path.
func (r *Registry) DockerConfig(path, user, password string) error {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	data, err := json.Marshal(map[string]any{"auths": map[string]any{r.Host: map[string]string{"auth": auth}}})
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// newCA makes a CA for the registry's certificates.
func newCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "iteron test registry CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, caKey, err
}

// leafPEM makes a server certificate for 127.0.0.1, ::1 and localhost
// signed by the CA.
func leafPEM(ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	leaf := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// ServerTLS is a TLS configuration for another loopback server (a test
// handler in front of the registry) with a certificate signed by the
// registry's CA, so that whoever trusts CAFile trusts it too.
func (r *Registry) ServerTLS() (*tls.Config, error) {
	if r.ca == nil {
		return nil, errors.New("registrytest: a plain-HTTP registry has no CA")
	}
	certPEM, keyPEM, err := leafPEM(r.ca, r.caKey)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// PushRaw pushes an artifact with plain registry API calls, as a client
// other than ours would: per blob a POST that opens an upload session and
// a PUT of the whole blob to its Location with the digest (the monolithic
// upload), then a PUT of the manifest by its digest. blobs maps a digest
// to its bytes; it returns the manifest's digest.
func (r *Registry) PushRaw(repo string, blobs map[string][]byte, manifest []byte, mediaType string) (string, error) {
	for d, b := range blobs {
		resp, err := r.Client.Post(fmt.Sprintf("%s/v2/%s/blobs/uploads/", r.URL(), repo), "", nil)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		loc, err := resp.Location()
		if resp.StatusCode != http.StatusAccepted || err != nil {
			return "", fmt.Errorf("upload session for %s: %s %v", d, resp.Status, err)
		}
		q := loc.Query()
		q.Set("digest", d)
		loc.RawQuery = q.Encode()
		req, err := http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(b))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err = r.Client.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return "", fmt.Errorf("blob upload %s: %s", d, resp.Status)
		}
	}
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/%s/manifests/%s", r.URL(), repo, digest), bytes.NewReader(manifest))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", mediaType)
	resp, err := r.Client.Do(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("manifest put %s: %s", digest, resp.Status)
	}
	return digest, nil
}

var syncSeq atomic.Int64

// Sync makes the access log complete up to now: the registry writes a
// request's line when the request ends, so a count taken right after a
// client saw its answer may miss it. Sync sends a marker request and waits
// (at most 10 s) until its line is in the log; the lines of requests that
// ended before it are then there too.
func (r *Registry) Sync() error {
	marker := fmt.Sprintf("/v2/?iteron-sync=%d-%d", os.Getpid(), syncSeq.Add(1))
	resp, err := r.Client.Get(r.URL() + marker)
	if err != nil {
		return fmt.Errorf("registrytest: sync: %w", err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.Log(), marker) {
		if time.Now().After(deadline) {
			return fmt.Errorf("registrytest: the access log never showed %s", marker)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// SyncedRequests parses the access log after a Sync, leaving out Sync's markers.
func (r *Registry) SyncedRequests() ([]Request, error) {
	if err := r.Sync(); err != nil {
		return nil, err
	}
	var out []Request
	for _, q := range r.Requests() {
		if !strings.Contains(q.Path, "iteron-sync=") {
			out = append(out, q)
		}
	}
	return out, nil
}
