// Package protocol holds the message types of the iteron-implementation/1 and
// /2 process protocols (docs/reference/protocol.md), their validation and
// their limits. It is public because the provider SDK (pkg/provider) shares
// these types with the host: the messages are defined in one place.
package protocol
