package pkgruntime

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// LaunchKeyBytes is the length of a runtime's launch key.
const LaunchKeyBytes = 32

// Pin is what the host holds a runtime to: the verified manifest, the
// capabilities admitted for it, and the values it fills into every call's
// context.
type Pin struct {
	// Manifest is the verified package-runtime manifest.
	Manifest catalog.PackageRuntimeManifest
	// Admitted are the capabilities admitted (requested ∩ ceiling); the
	// handshake's capabilities must be a subset.
	Admitted []string
	// WorkspaceEpoch is the module's epoch.
	WorkspaceEpoch string
	// BindingDigest is the authority digest of the admitted capabilities.
	BindingDigest string
	// Owner is "<activation uid>/<module>".
	Owner string
	// Sandbox is what the source asks of the node's sandbox, and Scratch
	// names the runtime's scratch directory ("<activation uid>/<generation>"):
	// the launch's, not the handshake's.
	Sandbox verifier.SandboxRequest
	Scratch string
}

// Error is a runtime's failure as the host reports it: the reason code of
// the module or call, the field or operation at fault, and why.
type Error struct {
	// Code is a reason of internal/reasons (activation_failed for a
	// handshake, provider_failed for a protocol violation, deadline_exceeded,
	// queue_full, …).
	Code string
	// Field names what was wrong ("handshake.export_ids", "status.state").
	Field string
	// Detail says why.
	Detail string
	// Err is the underlying error, if any.
	Err error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message() }

// Message is the error without its reason code: "<field>: <detail>", or the
// detail alone.
func (e *Error) Message() string {
	if e.Field == "" {
		return e.Detail
	}
	return e.Field + ": " + e.Detail
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// ReasonCode is the reason the module or call fails with.
func (e *Error) ReasonCode() string { return e.Code }

func errorf(code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// NewNonce returns a handshake nonce: 32 random bytes as 64 lowercase hex.
func NewNonce() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// NewLaunchKey returns 32 random bytes.
func NewLaunchKey() ([]byte, error) {
	key := make([]byte, LaunchKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return key, nil
}

// hmacHex is lowercase hex of HMAC-SHA256(key, parts joined by "\n").
func hmacHex(key []byte, parts ...string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(h.Sum(nil))
}

// Grant is the InvocationContext.grant of one call: "<namespace>:" + hex
// HMAC-SHA256(key, invocationID "\n" namespace "\n" exportID).
func Grant(key []byte, invocationID, namespace, exportID string) string {
	return namespace + ":" + hmacHex(key, invocationID, namespace, exportID)
}

// CheckHandshake checks a handshake response field by field against the
// pin: revision, protocol version, exports as a set, an instance ID not seen
// before (seen reports whether one was), capabilities within the admitted
// set, and the proof over the nonce. Any mismatch is activation_failed
// naming the field.
func CheckHandshake(pin Pin, key []byte, nonce string, resp *runtimepb.HandshakeResponse, seen func(instanceID string) bool) error {
	m := pin.Manifest
	if got := resp.GetPackageRevisionId(); got != m.PackageRevisionID {
		return errorf(reasons.ActivationFailed, "handshake.package_revision_id", "%q, but the manifest pins %q", got, m.PackageRevisionID)
	}
	if got := resp.GetRuntimeProtocolVersion(); got != m.RuntimeProtocolVersion {
		return errorf(reasons.ActivationFailed, "handshake.runtime_protocol_version", "%q, but the manifest pins %q", got, m.RuntimeProtocolVersion)
	}
	exports := slices.Clone(resp.GetExportIds())
	slices.Sort(exports)
	if dup := firstDuplicate(exports); dup != "" {
		return errorf(reasons.ActivationFailed, "handshake.export_ids", "%q is listed twice", dup)
	}
	if !slices.Equal(exports, m.ExportIDs) {
		return errorf(reasons.ActivationFailed, "handshake.export_ids", "%v, but the manifest pins %v", exports, m.ExportIDs)
	}
	id := resp.GetInstanceId()
	if id == "" {
		return errorf(reasons.ActivationFailed, "handshake.instance_id", "empty")
	}
	if seen != nil && seen(id) {
		return errorf(reasons.ActivationFailed, "handshake.instance_id", "%q was answered by an earlier process: an instance ID is new per process", id)
	}
	for _, c := range resp.GetCapabilities() {
		if !slices.Contains(pin.Admitted, c) {
			return errorf(reasons.ActivationFailed, "handshake.capabilities", "%q is not among the admitted capabilities %v", c, pin.Admitted)
		}
	}
	want := hmacHex(key, nonce, id, m.PackageRevisionID)
	proof := resp.GetAuthenticationProof()
	if proof == "" {
		return errorf(reasons.ActivationFailed, "handshake.authentication_proof", "missing")
	}
	if !hmac.Equal([]byte(proof), []byte(want)) {
		return errorf(reasons.ActivationFailed, "handshake.authentication_proof", "does not prove the launch key (HMAC-SHA256 over the nonce, instance_id and package_revision_id)")
	}
	return nil
}

func firstDuplicate(sorted []string) string {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return sorted[i]
		}
	}
	return ""
}

// States are the five InvocationStatus states.
var States = []string{"unknown", "running", "cancellation-requested", "completed", "failed"}

// CheckState refuses an InvocationStatus.state outside the five, and a
// status about another invocation.
func CheckState(invocationID string, st *runtimepb.InvocationStatus) error {
	if st.GetInvocationId() != invocationID {
		return errorf(reasons.ProviderFailed, "status.invocation_id", "%q answers for %q", st.GetInvocationId(), invocationID)
	}
	if !slices.Contains(States, st.GetState()) {
		return errorf(reasons.ProviderFailed, "status.state", "%q is not one of %s", st.GetState(), strings.Join(States, ", "))
	}
	return nil
}

// ErrNotHandshaken is returned by calls on a connection whose handshake has
// not succeeded.
var ErrNotHandshaken = errors.New("pkgruntime: the runtime has not completed its handshake")
