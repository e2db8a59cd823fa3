package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"iteron.dev/operator/internal/reasons"
)

// Error is a pull that failed. Code is artifact_unavailable,
// artifact_refused or verification_failed; the message names the
// reference, the registry's answer or the digest that did not match.
type Error struct {
	// Code is the reason.
	Code string
	// Ref is the reference as written.
	Ref string
	// Digest names the blob or manifest concerned, when there is one.
	Digest string
	// Detail says what happened.
	Detail string
	// RetryAfter is when to look again: an artifact_unavailable pull is
	// tried again then; a refused one is only checked for new credentials.
	RetryAfter time.Duration
	// Pending marks a pull still in progress (artifact_unavailable).
	Pending bool
	// Err is the underlying error.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", e.Code, e.Detail)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// ReasonCode is the reason (internal/reasons).
func (e *Error) ReasonCode() string { return e.Code }

// RetryIn is when the caller should look again (0: no need): a pull in
// progress, the next attempt of an unavailable one, or the next check of
// whether the credentials of a refused one changed (which asks nothing of
// the registry). The controllers read it without importing this package.
func (e *Error) RetryIn() time.Duration { return e.RetryAfter }

// Retryable reports whether the pull is tried again without a change.
func (e *Error) Retryable() bool { return e.Code == reasons.ArtifactUnavailable }

// ErrVerification marks a digest, size or format mismatch.
var ErrVerification = errors.New("artifact verification failed")

func verificationf(ref, digest, format string, args ...any) *Error {
	return &Error{Code: reasons.VerificationFailed, Ref: ref, Digest: digest, Detail: fmt.Sprintf(format, args...), Err: ErrVerification}
}

func unavailablef(ref string, err error, format string, args ...any) *Error {
	return &Error{Code: reasons.ArtifactUnavailable, Ref: ref, Detail: fmt.Sprintf(format, args...), Err: err}
}

// classify turns a transport or registry error into an *Error: 401, 403,
// 404 (and a manifest or blob the registry does not have) are
// artifact_refused; everything else the registry or the network says
// (unreachable, reset, 5xx, 429, timeouts, a body cut short) is
// artifact_unavailable. what names the request ("manifest sha256:…").
func classify(ref, what string, err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var er *errcode.ErrorResponse
	if errors.As(err, &er) {
		detail := fmt.Sprintf("%s: the registry answered %d %s", what, er.StatusCode, http.StatusText(er.StatusCode))
		if len(er.Errors) > 0 {
			detail += " (" + er.Errors.Error() + ")"
		}
		switch er.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			return &Error{Code: reasons.ArtifactRefused, Ref: ref, Detail: detail, Err: err}
		}
		return &Error{Code: reasons.ArtifactUnavailable, Ref: ref, Detail: detail, Err: err}
	}
	if errors.Is(err, errdef.ErrNotFound) {
		return &Error{Code: reasons.ArtifactRefused, Ref: ref, Detail: fmt.Sprintf("%s: not found in the registry (404)", what), Err: err}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return unavailablef(ref, err, "%s: timed out: %v", what, err)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return unavailablef(ref, err, "%s: %v", what, err)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return unavailablef(ref, err, "%s: the registry is unreachable: %v", what, err)
	}
	return unavailablef(ref, err, "%s: %v", what, err)
}
