package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"oras.land/oras-go/v2/registry/remote"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

// A provider directory, what Pack reads:
//
//	DIR/catalog.json             the catalog (docs/reference/catalog.md)
//	DIR/<implementation_id>/     the artifact root of each implementation carried
//
// Implementations of the catalog without a directory are not carried (an
// activation may not select them from this artifact).

// Package is a provider directory packed as an artifact, ready to push.
type Package struct {
	// Manifest is the artifact manifest's bytes; Digest their digest.
	Manifest []byte
	Digest   string
	// Parsed is the manifest, parsed back by ParseManifest.
	Parsed *Manifest
	// Sources are the implementations carried, in catalog order.
	Sources []PackedSource
	files   map[string]string // digest → file
	config  []byte
}

// PackedSource is what an activation source needs to select one
// implementation of the artifact.
type PackedSource struct {
	Module           string `json:"module"`
	ImplementationID string `json:"implementation_id"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
}

// Pack reads a provider directory: the catalog must parse, every carried
// implementation's executable must be a plain file name, a regular file of
// at most 256 MiB that hashes to its artifact_sha256. The manifest written
// is deterministic (no timestamps): the same directory packs to the same
// digest.
func Pack(dir string) (*Package, error) {
	catPath := filepath.Join(dir, CatalogFile)
	f, err := os.Open(catPath)
	if err != nil {
		return nil, err
	}
	data, err := strictjson.ReadBounded(f, MaxCatalogBytes)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", catPath, err)
	}
	cat, err := catalog.ParseCatalog(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", catPath, err)
	}
	pkg := &Package{files: map[string]string{}, config: []byte("{}")}
	catDigest := strictjson.Digest(data)
	pkg.files[catDigest] = catPath
	w := manifestWire{
		SchemaVersion: 2, MediaType: MediaTypeImageManifest, ArtifactType: ArtifactType,
		Config: &Descriptor{MediaType: MediaTypeEmpty, Digest: emptyConfigDigest, Size: 2, Data: []byte("{}")},
		Layers: []Descriptor{{MediaType: MediaTypeCatalog, Digest: catDigest, Size: int64(len(data)),
			Annotations: map[string]string{AnnotationTitle: CatalogFile}}},
	}
	for _, m := range cat.Implementations {
		root := filepath.Join(dir, m.ImplementationID)
		if info, err := os.Lstat(root); err != nil || !info.IsDir() {
			continue
		}
		if err := PlainName(m.Executable); err != nil {
			return nil, fmt.Errorf("implementation %q: executable %q: an artifact lays out plain file names only: %v", m.ImplementationID, m.Executable, err)
		}
		exe := filepath.Join(root, m.Executable)
		info, err := os.Lstat(exe)
		if err != nil {
			return nil, fmt.Errorf("implementation %q: %w", m.ImplementationID, err)
		}
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("implementation %q: %s is not a regular file", m.ImplementationID, exe)
		}
		if info.Size() > MaxExecutableBytes {
			return nil, fmt.Errorf("implementation %q: %s is %d bytes, over the 256 MiB bound", m.ImplementationID, exe, info.Size())
		}
		digest, err := hashFile(exe)
		if err != nil {
			return nil, err
		}
		if digest != "sha256:"+m.ArtifactSHA256 {
			return nil, fmt.Errorf("implementation %q: %s hashes to %s, the catalog pins sha256:%s", m.ImplementationID, exe, digest, m.ArtifactSHA256)
		}
		md, err := catalog.ManifestDigest(m)
		if err != nil {
			return nil, err
		}
		pkg.files[digest] = exe
		w.Layers = append(w.Layers, Descriptor{MediaType: MediaTypeExecutable, Digest: digest, Size: info.Size(), Annotations: map[string]string{
			AnnotationTitle: m.Executable, AnnotationModule: m.Module, AnnotationImplementationID: m.ImplementationID,
			AnnotationFileMode: fmt.Sprintf("%04o", info.Mode().Perm()),
		}})
		pkg.Sources = append(pkg.Sources, PackedSource{Module: m.Module, ImplementationID: m.ImplementationID, ManifestSHA256: md, ArtifactSHA256: digest})
	}
	if len(pkg.Sources) == 0 {
		return nil, fmt.Errorf("%s: no implementation of %s has its artifact root there (DIR/<implementation_id>/)", dir, catPath)
	}
	// The config travels as a blob, not inline (older registries).
	w.Config.Data = nil
	pkg.Manifest, err = strictjson.Canonical(w)
	if err != nil {
		return nil, err
	}
	pkg.Digest = strictjson.Digest(pkg.Manifest)
	if pkg.Parsed, err = ParseManifest(pkg.Manifest); err != nil {
		return nil, fmt.Errorf("the packed manifest does not parse back: %w", err)
	}
	return pkg, nil
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 64<<10)); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// PushResult is a pushed artifact.
type PushResult struct {
	// Ref is the pinned reference to write in an activation.
	Ref string
	// Digest is the manifest's digest.
	Digest string
	// Sources are the implementations it carries.
	Sources []PackedSource
}

// ParseTarget parses a push target: <registry>/<repository>[:<tag>], or
// with @sha256:… (which must then equal what is pushed).
func ParseTarget(s string) (Ref, error) {
	if strings.Contains(s, "@") {
		return ParseRef(s)
	}
	// Parse as pinned with a placeholder digest, then drop it.
	r, err := ParseRef(s + "@" + emptyConfigDigest)
	if err != nil {
		return Ref{}, errors.New(strings.ReplaceAll(err.Error(), "@"+emptyConfigDigest, ""))
	}
	r.Digest = ""
	return r, nil
}

// Push packs dir and pushes it to target: the blobs the registry lacks,
// then the manifest (by digest, and by tag when target has one). It
// returns the pinned reference.
func Push(ctx context.Context, o RegistryOptions, dir, target string) (*PushResult, error) {
	ref, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	pkg, err := Pack(dir)
	if err != nil {
		return nil, err
	}
	if ref.Digest != "" && ref.Digest != pkg.Digest {
		return nil, fmt.Errorf("%s pins %s, but %s packs to %s", target, ref.Digest, dir, pkg.Digest)
	}
	client, err := httpClient(o)
	if err != nil {
		return nil, err
	}
	p := &Puller{o: PullerOptions{RegistryOptions: o}, client: client}
	repo, err := p.repository(ref)
	if err != nil {
		return nil, err
	}
	for _, d := range append([]Descriptor{pkg.Parsed.Config, pkg.Parsed.Catalog}, layersOf(pkg.Parsed)...) {
		if err := pushBlob(ctx, repo, pkg, d); err != nil {
			return nil, err
		}
	}
	md := toOCI(Descriptor{MediaType: MediaTypeImageManifest, Digest: pkg.Digest, Size: int64(len(pkg.Manifest)), ArtifactType: ArtifactType})
	if ref.Tag != "" {
		err = repo.Manifests().PushReference(ctx, md, bytes.NewReader(pkg.Manifest), ref.Tag)
	} else {
		err = repo.Manifests().Push(ctx, md, bytes.NewReader(pkg.Manifest))
	}
	if err != nil {
		return nil, fmt.Errorf("push manifest %s: %w", pkg.Digest, err)
	}
	pinned := ref
	pinned.Digest = pkg.Digest
	return &PushResult{Ref: pinned.String(), Digest: pkg.Digest, Sources: pkg.Sources}, nil
}

func pushBlob(ctx context.Context, repo *remote.Repository, pkg *Package, d Descriptor) error {
	od := toOCI(d)
	ok, err := repo.Blobs().Exists(ctx, od)
	if err != nil {
		return fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	if ok {
		return nil
	}
	var r io.Reader
	if d.Digest == emptyConfigDigest {
		r = bytes.NewReader(pkg.config)
	} else {
		f, err := os.Open(pkg.files[d.Digest])
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	if err := repo.Blobs().Push(ctx, od, r); err != nil {
		return fmt.Errorf("push blob %s: %w", d.Digest, err)
	}
	return nil
}
