// Package gateway is the node-local gRPC gateway (api/gateway/v1): callers
// on the node run module calls through it, and it is a thin adapter over
// the hot-swap coordinator's per-module Dispatcher — the queue, the one run
// slot and the atomic switch live there, so a call that arrives during a
// swap waits and runs on the new generation instead of failing.
//
// It listens on a unix socket only (Listen: mode 0660, a documented group,
// path at most 107 bytes, a stale socket replaced only by a caller holding the
// state-dir lock) and never on TCP: the caller's kernel-reported peer
// credentials (SO_PEERCRED, read by PeerCredentials) are what authorize a
// call, against the --gateway-allow rules (Allow). What it adds to the
// dispatcher: authorization per namespace, the idempotency window of
// client-chosen invocation IDs (Invocations), invocation status and cancel,
// Watch streaming, and the mapping of reasons (docs/reference/reasons.md) to
// gRPC codes (CodeOf). docs/gateway.md is the operator's view.
package gateway
