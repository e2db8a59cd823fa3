package verifier

import (
	"errors"
	"fmt"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
)

// Sentinel errors wrapped by *Error. A catalog rejection wraps the catalog
// package's own sentinels instead (catalog.ErrNotDependencyClosed, …).
var (
	// ErrTooLarge: a document, catalog or executable exceeds its bound.
	ErrTooLarge = errors.New("exceeds its bound")
	// ErrInvalidValue: a member breaks a pattern or rule of
	// docs/reference/activation.md.
	ErrInvalidValue = errors.New("invalid value")
	// ErrDuplicate: a second source for one module, or a repeated implementation ID.
	ErrDuplicate = errors.New("duplicate")
	// ErrUnsupportedVersion: a document schema version other than 1.
	ErrUnsupportedVersion = errors.New("unsupported version")
	// ErrUnknownModule: the module is not in the node's seam graph.
	ErrUnknownModule = errors.New("module not in the seam graph")
	// ErrNotCanonical: a path that is not absolute and canonical.
	ErrNotCanonical = errors.New("not an absolute canonical path")
	// ErrOutsideAllowedRoots: a path outside every allowed root.
	ErrOutsideAllowedRoots = errors.New("outside the allowed roots")
	// ErrSymlink: a symlink at some component of a path.
	ErrSymlink = errors.New("symlink")
	// ErrNotFound: a path that does not exist.
	ErrNotFound = errors.New("does not exist")
	// ErrNotRegularFile: a catalog or executable that is not a regular file.
	ErrNotRegularFile = errors.New("not a regular file")
	// ErrNotDirectory: an artifact root (or a path component) that is not a directory.
	ErrNotDirectory = errors.New("not a directory")
	// ErrManifestNotFound: the catalog has no manifest with the source's ID.
	ErrManifestNotFound = errors.New("no such implementation in the catalog")
	// ErrModuleMismatch: the selected manifest fills another module.
	ErrModuleMismatch = errors.New("manifest module differs")
	// ErrDigestMismatch: a manifest or artifact digest differs from the pinned one.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrSourceKind: a source gives both oci and paths, or neither.
	ErrSourceKind = errors.New("oci and paths are alternatives")
	// ErrNoArtifactStore: an OCI source where nothing can pull it.
	ErrNoArtifactStore = errors.New("no artifact store")
)

// Phrases of Error.Detail that tools match on: the doctor gives different
// advice for a path outside the allowed roots (move the files or change
// --allowed-roots) and for a symlink (name its target). They are written
// here once so that the verifier and its readers cannot drift apart.
const (
	// PhraseOutsideAllowedRoots follows the path and precedes the roots in
	// parentheses: "/srv/x is outside the allowed roots (/var/lib/iteron/providers)".
	PhraseOutsideAllowedRoots = "is outside the allowed roots"
	// PhraseSymlinkTo joins a symlink and its target: "/srv/p is a symlink
	// to /data/p". A path that resolves elsewhere through a link higher up
	// reads "/srv/p/x resolves to /data/p/x through a symlink".
	PhraseSymlinkTo = "is a symlink to"
	// PhraseResolvesThroughSymlink ends "<path> resolves to <target>".
	PhraseResolvesThroughSymlink = "through a symlink"
)

// Error is a verification failure: the field path as the user wrote it
// (sources[2].catalog_path in a raw document, spec.sources[2].catalogPath in
// an ImplementationActivation), what is wrong, and the reason code
// (docs/reference/reasons.md).
type Error struct {
	// Field is the offending member; "" for the document as a whole.
	Field string
	// Code is the snake_case reason code (verification_failed, …).
	Code string
	// Detail says what is wrong, e.g. "/var/lib/x is a symlink".
	Detail string
	// Err is a sentinel of this package, a *catalog.Error or an OS error.
	Err error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Detail
	}
	return e.Field + ": " + e.Detail
}

// Unwrap returns the sentinel or cause.
func (e *Error) Unwrap() error { return e.Err }

// ReasonCode is the reason code (docs/reference/reasons.md): the status reason
// and the ledger reason.
func (e *Error) ReasonCode() string { return e.Code }

func failf(field string, sentinel error, format string, args ...any) *Error {
	code := reasons.VerificationFailed
	switch sentinel {
	case ErrUnsupportedVersion:
		code = reasons.UnsupportedVersion
	case ErrUnknownModule:
		code = reasons.SchemaMismatch
	}
	return &Error{Field: field, Code: code, Detail: fmt.Sprintf(format, args...), Err: sentinel}
}

// fromCatalog re-homes a catalog rejection under the field the user wrote,
// keeping its reason code and sentinel: "sources[0].catalog_path: catalog
// /x/catalog.json: implementations[3].argv[2]: …".
func fromCatalog(field, what string, err error) *Error {
	var ce *catalog.Error
	if errors.As(err, &ce) {
		return &Error{Field: field, Code: ce.ReasonCode(), Detail: what + ": " + ce.Error(), Err: ce}
	}
	return &Error{Field: field, Code: reasons.VerificationFailed, Detail: what + ": " + err.Error(), Err: err}
}
