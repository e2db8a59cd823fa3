package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
)

// DefaultStore is the manager's default --artifact-store.
const DefaultStore = "/var/lib/iteron/artifacts"

// DefaultMaxStoreBytes is the default bound of the whole store (4 GiB).
const DefaultMaxStoreBytes = 4 << 30

// Names inside a laid-out source.
const (
	// CatalogFile is the catalog's name in a source directory.
	CatalogFile = "catalog.json"
	// rootsDir holds one artifact root per implementation.
	rootsDir = "impl"
	// blobsFile lists, one per line, the digests of every blob the source
	// uses (the index, the manifest, the config and the layers).
	blobsFile = "blobs"
)

// Store is a content-addressed store of pulled artifacts on one node:
//
//	<root>/blobs/sha256/<hex>          verified blobs, read-only
//	<root>/sources/sha256/<hex>/       one laid-out source per pinned reference digest:
//	    catalog.json                   the catalog layer
//	    impl/<implementation_id>/<name> one artifact root per executable layer
//	    blobs                          the digests the source uses
//	<root>/tmp/                        downloads and layouts in progress (emptied at open)
//
// Directories are 0755 (a provider's uid must traverse its artifact root);
// files are read-only. It is safe for concurrent use.
type Store struct {
	root     string
	maxBytes int64
	used     atomic.Int64
	// gc excludes pulls (read side, for a whole pull) from a collection
	// (write side), so a collection never removes a blob a pull just wrote
	// and has not yet named in a source.
	gc sync.RWMutex
}

// OpenStore opens (creating it if needed) the store at root, an absolute
// canonical path, bounded by maxBytes (0: DefaultMaxStoreBytes). Leftovers
// of an interrupted download or layout are removed.
func OpenStore(root string, maxBytes int64) (*Store, error) {
	if !filepath.IsAbs(root) || filepath.Clean(root) != root || root == "/" {
		return nil, fmt.Errorf("artifact store %q: must be an absolute, clean path other than /", root)
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxStoreBytes
	}
	s := &Store{root: root, maxBytes: maxBytes}
	for _, d := range []string{root, s.path("blobs"), s.path("blobs", "sha256"), s.path("sources"), s.path("sources", "sha256")} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
	}
	if err := s.clearTmp(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			s.used.Add(info.Size())
		}
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

// SourcesDir is the directory under which sources are laid out: the
// allowed root of every OCI source.
func (s *Store) SourcesDir() string { return s.path("sources", "sha256") }

// Used is the bytes of the blobs in the store.
func (s *Store) Used() int64 { return s.used.Load() }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.root}, elem...)...)
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) sourcePath(digest string) string {
	return s.path("sources", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) clearTmp() error {
	if err := os.RemoveAll(s.path("tmp")); err != nil {
		return fmt.Errorf("artifact store: remove leftovers: %w", err)
	}
	if err := os.Mkdir(s.path("tmp"), 0o700); err != nil {
		return fmt.Errorf("artifact store: %w", err)
	}
	return nil
}

// HasBlob reports whether a verified blob is in the store.
func (s *Store) HasBlob(digest string) bool {
	info, err := os.Lstat(s.blobPath(digest))
	return err == nil && info.Mode().IsRegular()
}

// Blobs lists the digests of the blobs in the store, sorted.
func (s *Store) Blobs() ([]string, error) {
	entries, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, "sha256:"+e.Name())
	}
	return out, nil
}

// Sources lists the reference digests of the laid-out sources, sorted.
func (s *Store) Sources() ([]string, error) {
	entries, err := os.ReadDir(s.SourcesDir())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if catalog.IsDigest("sha256:" + e.Name()) {
			out = append(out, "sha256:"+e.Name())
		}
	}
	return out, nil
}

// TmpEntries lists what is under tmp/ (downloads in progress).
func (s *Store) TmpEntries() ([]string, error) {
	entries, err := os.ReadDir(s.path("tmp"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// staging is the blobs of one pull downloaded and verified but not yet in
// blobs/: a pull renames them all at the end (commit) or removes them all
// (discard), so that a failed pull leaves the store as it found it.
type staging struct {
	s     *Store
	files map[string]string // digest → temporary file
	bytes int64
}

func (s *Store) newStaging() *staging { return &staging{s: s, files: map[string]string{}} }

// add streams r into a temporary file as the blob d: through one hash, cut
// at d.Size+1 bytes, fsynced, kept only when its size and digest are d's.
// A blob already in the store or staged is kept (its bytes were verified)
// and r is not read.
func (st *staging) add(ref string, d Descriptor, open func() (io.ReadCloser, error)) error {
	s := st.s
	if _, ok := st.files[d.Digest]; ok || s.HasBlob(d.Digest) {
		return nil
	}
	if used := s.used.Load() + st.bytes; used+d.Size > s.maxBytes {
		return &Error{Code: reasons.ArtifactUnavailable, Ref: ref, Digest: d.Digest,
			Detail: fmt.Sprintf("the artifact store %s is full: %d bytes used, blob %s needs %d, the bound is %d (--artifact-store-max-bytes)", s.root, used, d.Digest, d.Size, s.maxBytes)}
	}
	rc, err := open()
	if err != nil {
		return classify(ref, "blob "+d.Digest, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(s.path("tmp"), "blob-*")
	if err != nil {
		return fmt.Errorf("artifact store: %w", err)
	}
	tmp := f.Name()
	kept := false
	defer func() {
		if !kept {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	buf := make([]byte, 256<<10)
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(rc, d.Size+1), buf)
	if err != nil {
		if isLocalWriteError(err) {
			return fmt.Errorf("artifact store: write %s: %w", tmp, err)
		}
		return classify(ref, fmt.Sprintf("blob %s (after %d of %d bytes)", d.Digest, n, d.Size), err)
	}
	switch {
	case n > d.Size:
		return verificationf(ref, d.Digest, "blob %s is longer than its descriptor's %d bytes: refused", d.Digest, d.Size)
	case n < d.Size:
		return unavailablef(ref, io.ErrUnexpectedEOF, "blob %s: the download ended after %d of %d bytes", d.Digest, n, d.Size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d.Digest {
		return verificationf(ref, d.Digest, "blob %s: the bytes served hash to %s: refused", d.Digest, got)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("artifact store: fsync %s: %w", tmp, err)
	}
	if err := f.Chmod(0o444); err != nil {
		return fmt.Errorf("artifact store: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("artifact store: %w", err)
	}
	kept = true
	st.files[d.Digest] = tmp
	st.bytes += d.Size
	return nil
}

// put stages bytes already in memory and verified (a manifest).
func (st *staging) put(ref, digest string, data []byte) error {
	return st.add(ref, Descriptor{Digest: digest, Size: int64(len(data))}, func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(string(data))), nil
	})
}

// commit renames every staged blob into blobs/sha256/ and fsyncs the
// directory.
func (st *staging) commit() error {
	s := st.s
	for d, tmp := range st.files {
		info, err := os.Lstat(tmp)
		if err != nil {
			return fmt.Errorf("artifact store: %w", err)
		}
		if err := os.Rename(tmp, s.blobPath(d)); err != nil {
			return fmt.Errorf("artifact store: %w", err)
		}
		delete(st.files, d)
		s.used.Add(info.Size())
	}
	return syncDir(s.path("blobs", "sha256"))
}

// discard removes whatever is still staged.
func (st *staging) discard() {
	for d, tmp := range st.files {
		os.Remove(tmp)
		delete(st.files, d)
	}
}

func isLocalWriteError(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe)
}

// syncDir is statedir.SyncDir, its error naming the store.
func syncDir(dir string) error {
	if err := statedir.SyncDir(dir); err != nil {
		return fmt.Errorf("artifact store: %w", err)
	}
	return nil
}

// Layout is a source laid out in the store from one pinned reference.
type Layout struct {
	// Digest is the reference's digest (an image manifest or an index).
	Digest string
	// Dir is the source's directory.
	Dir string
	// CatalogPath is the catalog file.
	CatalogPath string
	// Roots maps an implementation ID to its artifact root.
	Roots map[string]string
	// Blobs are the digests the source uses.
	Blobs []string
}

// Root returns the artifact root of implementation id.
func (l *Layout) Root(id string) (string, bool) {
	r, ok := l.Roots[id]
	return r, ok
}

// Lookup returns the source laid out for a reference digest, if any.
func (s *Store) Lookup(digest string) (*Layout, bool) {
	dir := s.sourcePath(digest)
	data, err := os.ReadFile(filepath.Join(dir, blobsFile))
	if err != nil {
		return nil, false
	}
	l := &Layout{Digest: digest, Dir: dir, CatalogPath: filepath.Join(dir, CatalogFile), Roots: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if catalog.IsDigest(line) {
			l.Blobs = append(l.Blobs, line)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, rootsDir))
	if err != nil {
		return nil, false
	}
	for _, e := range entries {
		l.Roots[e.Name()] = filepath.Join(dir, rootsDir, e.Name())
	}
	return l, true
}

// layOut builds the source of a verified manifest whose blobs are all in
// the store: a temporary directory of read-only hard links renamed into
// sources/sha256/<digest> complete. The catalog is parsed and every
// executable layer must match its manifest in it (module, executable name,
// artifact digest).
func (s *Store) layOut(ref, digest string, m *Manifest, blobs []string) (*Layout, error) {
	if l, ok := s.Lookup(digest); ok {
		return l, nil
	}
	data, err := os.ReadFile(s.blobPath(m.Catalog.Digest))
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	cat, err := catalog.ParseCatalog(data)
	if err != nil {
		return nil, verificationf(ref, m.Catalog.Digest, "the catalog layer %s: %v", m.Catalog.Digest, err)
	}
	for _, e := range m.Executables {
		man, ok := cat.Lookup(e.ImplementationID)
		switch {
		case !ok:
			return nil, verificationf(ref, e.Layer.Digest, "executable layer %s is annotated for implementation %q, which the catalog does not list", e.Layer.Digest, e.ImplementationID)
		case man.Module != e.Module:
			return nil, verificationf(ref, e.Layer.Digest, "executable layer %s is annotated for module %q; the catalog's %q fills %q", e.Layer.Digest, e.Module, e.ImplementationID, man.Module)
		case man.Executable != e.Name:
			return nil, verificationf(ref, e.Layer.Digest, "executable layer %s is named %q; the catalog's %q runs %q", e.Layer.Digest, e.Name, e.ImplementationID, man.Executable)
		case "sha256:"+man.ArtifactSHA256 != e.Layer.Digest:
			return nil, verificationf(ref, e.Layer.Digest, "executable layer %s differs from the catalog's artifact_sha256 of %q (sha256:%s)", e.Layer.Digest, e.ImplementationID, man.ArtifactSHA256)
		}
	}
	tmp, err := os.MkdirTemp(s.path("tmp"), "source-*")
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Link(s.blobPath(m.Catalog.Digest), filepath.Join(tmp, CatalogFile)); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	if err := os.Mkdir(filepath.Join(tmp, rootsDir), 0o755); err != nil {
		return nil, err
	}
	for _, e := range m.Executables {
		root := filepath.Join(tmp, rootsDir, e.ImplementationID)
		if err := os.Mkdir(root, 0o755); err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		target := filepath.Join(root, e.Name)
		if err := os.Link(s.blobPath(e.Layer.Digest), target); err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		// Read-only; the execute bits as annotated (a hard link shares the
		// blob's inode, so a blob two layers share gets the union).
		if info, err := os.Stat(target); err == nil {
			if err := os.Chmod(target, info.Mode().Perm()|0o444|os.FileMode(e.Mode&0o111)); err != nil {
				return nil, err
			}
		}
	}
	list := strings.Join(blobs, "\n") + "\n"
	if err := statedir.WriteFile(filepath.Join(tmp, blobsFile), []byte(list), 0o444); err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Join(tmp, rootsDir), tmp} {
		if err := syncDir(d); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	final := s.sourcePath(digest)
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, os.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			if l, ok := s.Lookup(digest); ok {
				return l, nil
			}
		}
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	if err := syncDir(s.SourcesDir()); err != nil {
		return nil, err
	}
	l, ok := s.Lookup(digest)
	if !ok {
		return nil, fmt.Errorf("artifact store: source %s vanished after its layout", digest)
	}
	return l, nil
}

// SourceOf returns the reference digest of the source a path lies in
// (a catalog path or artifact root in the store), or false.
func (s *Store) SourceOf(path string) (string, bool) {
	rel, err := filepath.Rel(s.SourcesDir(), path)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", false
	}
	hexPart, _, _ := strings.Cut(rel, string(filepath.Separator))
	d := "sha256:" + hexPart
	return d, catalog.IsDigest(d)
}

// GCReport says what a collection removed and kept.
type GCReport struct {
	// RemovedSources and RemovedBlobs are the digests removed.
	RemovedSources, RemovedBlobs []string
	// KeptSources and KeptBlobs are what remains.
	KeptSources, KeptBlobs int
	// FreedBytes is the size of the removed blobs.
	FreedBytes int64
	// Incomplete is set when the step bound stopped the collection early
	// (the next one continues).
	Incomplete bool
}

// GC removes every source whose reference digest keep does not name, then
// every blob that no remaining source uses, at most maxSteps removals (0:
// no bound). It waits for pulls in progress to finish (they may have
// written blobs no source names yet), at most until ctx ends.
func (s *Store) GC(ctx context.Context, keep map[string]bool, maxSteps int) (GCReport, error) {
	var rep GCReport
	locked := make(chan struct{})
	go func() { s.gc.Lock(); close(locked) }()
	select {
	case <-locked:
	case <-ctx.Done():
		go func() { <-locked; s.gc.Unlock() }()
		return rep, fmt.Errorf("artifact GC: pulls in progress did not finish: %w", ctx.Err())
	}
	defer s.gc.Unlock()
	step := func() bool {
		if maxSteps > 0 && len(rep.RemovedSources)+len(rep.RemovedBlobs) >= maxSteps {
			rep.Incomplete = true
			return false
		}
		return true
	}
	sources, err := s.Sources()
	if err != nil {
		return rep, err
	}
	used := map[string]bool{}
	for _, d := range sources {
		if keep[d] {
			l, ok := s.Lookup(d)
			if !ok {
				// Half a source (should not happen): keep every blob.
				return rep, fmt.Errorf("artifact GC: source %s is unreadable; nothing collected", d)
			}
			for _, b := range l.Blobs {
				used[b] = true
			}
			rep.KeptSources++
			continue
		}
		if !step() {
			// Its blobs stay until the next collection.
			if l, ok := s.Lookup(d); ok {
				for _, b := range l.Blobs {
					used[b] = true
				}
			}
			rep.KeptSources++
			continue
		}
		if err := removeSource(s.sourcePath(d)); err != nil {
			return rep, err
		}
		rep.RemovedSources = append(rep.RemovedSources, d)
	}
	if len(rep.RemovedSources) > 0 {
		if err := syncDir(s.SourcesDir()); err != nil {
			return rep, err
		}
	}
	blobs, err := s.Blobs()
	if err != nil {
		return rep, err
	}
	for _, b := range blobs {
		if used[b] || !step() {
			rep.KeptBlobs++
			continue
		}
		info, err := os.Lstat(s.blobPath(b))
		if err != nil {
			return rep, err
		}
		if err := os.Remove(s.blobPath(b)); err != nil {
			return rep, fmt.Errorf("artifact GC: %w", err)
		}
		s.used.Add(-info.Size())
		rep.FreedBytes += info.Size()
		rep.RemovedBlobs = append(rep.RemovedBlobs, b)
	}
	if len(rep.RemovedBlobs) > 0 {
		if err := syncDir(s.path("blobs", "sha256")); err != nil {
			return rep, err
		}
	}
	slices.Sort(rep.RemovedSources)
	return rep, nil
}

// removeSource removes a laid-out source (read-only directories are made
// writable first); the directory is first renamed under tmp/ so that a
// crash never leaves half a source under sources/.
func removeSource(dir string) error {
	tmp := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(dir))), "tmp", "gc-"+filepath.Base(dir)+"-"+fmt.Sprint(time.Now().UnixNano()))
	if err := os.Rename(dir, tmp); err != nil {
		return fmt.Errorf("artifact GC: %w", err)
	}
	_ = filepath.WalkDir(tmp, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(tmp)
}
