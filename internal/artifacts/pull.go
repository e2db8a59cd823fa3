package artifacts

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"iteron.dev/operator/internal/reasons"
)

// DefaultPullTimeout bounds one pull (every request of it).
const DefaultPullTimeout = 5 * time.Minute

// RegistryOptions say how to reach registries; the manager's
// --registry-config, --registry-ca and --registry-plain-http.
type RegistryOptions struct {
	// Config is a docker config.json with credentials ("auths"); "" or a
	// missing file means anonymous. It is read again whenever it changes.
	Config string
	// CAFile is a PEM bundle trusted besides the system's roots.
	CAFile string
	// PlainHTTP lets loopback registries (127.0.0.0/8, ::1, localhost) be
	// reached over plain HTTP; every other registry is always HTTPS.
	PlainHTTP bool
	// Transport, when set, replaces the HTTP transport (tests put a
	// handler in front of the registry with it). CAFile then does not apply.
	Transport http.RoundTripper
	// UserAgent is sent with every request.
	UserAgent string
}

// PullerOptions configure a Puller.
type PullerOptions struct {
	RegistryOptions
	// Store is where pulls go.
	Store *Store
	// Timeout bounds one pull (0: DefaultPullTimeout).
	Timeout time.Duration
	// Platform selects an index's manifest (zero: this process's).
	Platform Platform
}

// Puller pulls artifacts by digest into a store and lays them out. Pulls
// of one digest in progress at once share one download.
type Puller struct {
	o      PullerOptions
	client *http.Client
	flight singleflight.Group

	credMu      sync.Mutex
	credStamp   string
	credVersion string
	creds       credentials.Store
}

// NewPuller checks o (the CA bundle must parse) and returns a puller.
func NewPuller(o PullerOptions) (*Puller, error) {
	if o.Store == nil {
		return nil, errors.New("puller: no store")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultPullTimeout
	}
	if o.Platform.OS == "" {
		o.Platform = NodePlatform()
	}
	client, err := httpClient(o.RegistryOptions)
	if err != nil {
		return nil, err
	}
	return &Puller{o: o, client: client}, nil
}

// Store is the puller's store.
func (p *Puller) Store() *Store { return p.o.Store }

func httpClient(o RegistryOptions) (*http.Client, error) {
	if o.Transport != nil {
		return &http.Client{Transport: o.Transport}, nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--registry-ca: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--registry-ca %s: no PEM certificate in it", o.CAFile)
		}
		t.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Transport: t}, nil
}

// CredentialsVersion is a digest of the registry config as it is now ("" when
// there is none); a refused pull is tried again once it changes.
func (p *Puller) CredentialsVersion() string {
	_, v, _ := p.credentials()
	return v
}

// credentials reads the config again when its size or modification time
// changed.
func (p *Puller) credentials() (credentials.Store, string, error) {
	p.credMu.Lock()
	defer p.credMu.Unlock()
	if p.o.Config == "" {
		return nil, "", nil
	}
	info, err := os.Stat(p.o.Config)
	if errors.Is(err, os.ErrNotExist) {
		p.creds, p.credStamp, p.credVersion = nil, "", ""
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("--registry-config: %w", err)
	}
	stamp := fmt.Sprintf("%d/%d/%d", info.Size(), info.ModTime().UnixNano(), info.Sys())
	if stamp == p.credStamp && p.creds != nil {
		return p.creds, p.credVersion, nil
	}
	data, err := os.ReadFile(p.o.Config)
	if err != nil {
		return nil, "", fmt.Errorf("--registry-config: %w", err)
	}
	store, err := credentials.NewMemoryStoreFromDockerConfig(data)
	if err != nil {
		return nil, "", fmt.Errorf("--registry-config %s: %w", p.o.Config, err)
	}
	sum := sha256.Sum256(data)
	p.creds, p.credStamp, p.credVersion = store, stamp, "sha256:"+hex.EncodeToString(sum[:])
	return store, p.credVersion, nil
}

// IsLoopback reports whether a registry host[:port] is on loopback.
func IsLoopback(registry string) bool {
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (p *Puller) repository(ref Ref) (*remote.Repository, error) {
	repo, err := remote.NewRepository(ref.Registry + "/" + ref.Repository)
	if err != nil {
		return nil, err
	}
	repo.PlainHTTP = p.o.PlainHTTP && IsLoopback(ref.Registry)
	repo.MaxMetadataBytes = MaxManifestBytes
	creds, _, err := p.credentials()
	if err != nil {
		return nil, err
	}
	ac := &auth.Client{Client: p.client, Cache: auth.NewCache(), Header: http.Header{}}
	if p.o.UserAgent != "" {
		ac.SetUserAgent(p.o.UserAgent)
	}
	if creds != nil {
		ac.Credential = credentials.Credential(creds)
	}
	repo.Client = ac
	return repo, nil
}

// Pull pulls ref (which must pin a digest) into the store, unless its
// source is already laid out, and returns the layout. It is bounded by the
// puller's timeout; concurrent pulls of one digest share one download.
func (p *Puller) Pull(ctx context.Context, refString string) (*Layout, error) {
	ref, err := ParseRef(refString)
	if err != nil {
		return nil, &Error{Code: reasons.SchemaMismatch, Ref: refString, Detail: err.Error(), Err: err}
	}
	if l, ok := p.o.Store.Lookup(ref.Digest); ok {
		return l, nil
	}
	ch := p.flight.DoChan(ref.Digest, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.o.Timeout)
		defer cancel()
		return p.pull(ctx, ref, refString)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*Layout), nil
	case <-ctx.Done():
		return nil, unavailablef(refString, ctx.Err(), "pull of %s: %v", refString, ctx.Err())
	}
}

func (p *Puller) pull(ctx context.Context, ref Ref, refString string) (*Layout, error) {
	p.o.Store.gc.RLock()
	defer p.o.Store.gc.RUnlock()
	if l, ok := p.o.Store.Lookup(ref.Digest); ok {
		return l, nil
	}
	repo, err := p.repository(ref)
	if err != nil {
		return nil, &Error{Code: reasons.ArtifactRefused, Ref: refString, Detail: err.Error(), Err: err}
	}
	// The pinned manifest (or index): its bytes must hash to the digest.
	data, err := p.fetchManifest(ctx, repo, refString, Descriptor{Digest: ref.Digest})
	if err != nil {
		return nil, err
	}
	blobs := []string{ref.Digest}
	pending := map[string][]byte{ref.Digest: data}
	if mediaTypeOf(data) == MediaTypeImageIndex {
		d, err := ParseIndex(data, p.o.Platform)
		if err != nil {
			return nil, verificationf(refString, ref.Digest, "index %s: %v", ref.Digest, err)
		}
		data, err = p.fetchManifest(ctx, repo, refString, d)
		if err != nil {
			return nil, err
		}
		blobs = append(blobs, d.Digest)
		pending[d.Digest] = data
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, verificationf(refString, blobs[len(blobs)-1], "manifest %s is not a provider artifact: %v", blobs[len(blobs)-1], err)
	}
	// Blobs: the catalog first (small), then the executables, each verified
	// into tmp/; renamed into blobs/ together only once every one matched,
	// so that a failed pull leaves the store's blobs as they were.
	st := p.o.Store.newStaging()
	defer st.discard()
	for _, d := range append([]Descriptor{m.Config, m.Catalog}, layersOf(m)...) {
		d := d
		if err := st.add(refString, d, func() (io.ReadCloser, error) {
			return repo.Blobs().Fetch(ctx, toOCI(d))
		}); err != nil {
			return nil, err
		}
		blobs = append(blobs, d.Digest)
	}
	for _, d := range blobs[:len(pending)] {
		if err := st.put(refString, d, pending[d]); err != nil {
			return nil, err
		}
	}
	if err := st.commit(); err != nil {
		return nil, err
	}
	return p.o.Store.layOut(refString, ref.Digest, m, dedupe(blobs))
}

func layersOf(m *Manifest) []Descriptor {
	var out []Descriptor
	for _, e := range m.Executables {
		out = append(out, e.Layer)
	}
	return out
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// fetchManifest fetches a manifest or index by digest, bounded, and checks
// its bytes against the digest as they stream.
func (p *Puller) fetchManifest(ctx context.Context, repo *remote.Repository, refString string, d Descriptor) ([]byte, error) {
	what := "manifest " + d.Digest
	var rc io.ReadCloser
	var err error
	if d.MediaType != "" {
		rc, err = repo.Manifests().Fetch(ctx, toOCI(d))
	} else {
		_, rc, err = repo.Manifests().FetchReference(ctx, d.Digest)
	}
	if err != nil {
		return nil, classify(refString, what, err)
	}
	defer rc.Close()
	h := sha256.New()
	data, err := io.ReadAll(io.TeeReader(io.LimitReader(rc, MaxManifestBytes+1), h))
	if err != nil {
		return nil, classify(refString, what, err)
	}
	if len(data) > MaxManifestBytes {
		return nil, verificationf(refString, d.Digest, "%s is over the bound of %d bytes: refused", what, MaxManifestBytes)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d.Digest {
		return nil, verificationf(refString, d.Digest, "%s: the bytes served hash to %s: refused", what, got)
	}
	if d.Size > 0 && int64(len(data)) != d.Size {
		return nil, verificationf(refString, d.Digest, "%s is %d bytes, its descriptor says %d: refused", what, len(data), d.Size)
	}
	return data, nil
}
