package ledger

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxTransactionIDBytes bounds a transaction_id (and every other ID).
const MaxTransactionIDBytes = 128

// TransactionID is a SchemaOperator transaction_id:
// "<activation uid, first 8 hex>/<module>/g<lineage>/a<attempt>", with
// "/r<n>" appended for the n-th renewal or relaunch of that generation.
// Build one with NewTransactionID; the zero value is not valid.
type TransactionID struct {
	activation string
	module     string
	lineage    uint64
	attempt    uint64
	renewal    uint64
}

// NewTransactionID builds the ID of a transaction of the activation whose
// UID is activationUID, on module, for generation lineage (the generation
// being activated, or the one retired), attempt at that lineage, and
// renewal: n for the n-th renewal or relaunch of the generation, 0 for a
// first activation, hot swap or cold replace. A retirement is one more
// transaction on a generation whose activation used the bare ID, so it takes
// the generation's next n (the ledger refuses a transaction_id it already
// holds). The activation UID must start with 8 lowercase hex digits, as a
// Kubernetes UID does.
func NewTransactionID(activationUID, module string, lineage, attempt, renewal uint64) (TransactionID, error) {
	if len(activationUID) < 8 || !isLowerHex(activationUID[:8]) {
		return TransactionID{}, fmt.Errorf("transaction id: activation uid %q does not start with 8 lowercase hex digits", activationUID)
	}
	id := TransactionID{activation: activationUID[:8], module: module, lineage: lineage, attempt: attempt, renewal: renewal}
	if err := id.validate(); err != nil {
		return TransactionID{}, err
	}
	return id, nil
}

func (id TransactionID) validate() error {
	switch {
	case len(id.activation) != 8 || !isLowerHex(id.activation):
		return fmt.Errorf("transaction id: activation prefix %q is not 8 lowercase hex digits", id.activation)
	case !validModule(id.module):
		return fmt.Errorf("transaction id: module %q does not match ^[a-z][a-z0-9_]{0,47}$", id.module)
	case id.lineage == 0:
		return fmt.Errorf("transaction id: lineage must be ≥ 1")
	case id.attempt == 0:
		return fmt.Errorf("transaction id: attempt must be ≥ 1")
	}
	return nil
}

// ParseTransactionID parses a SchemaOperator transaction_id.
func ParseTransactionID(s string) (TransactionID, error) {
	if len(s) > MaxTransactionIDBytes {
		return TransactionID{}, fmt.Errorf("transaction id %q: %d bytes, at most %d", s, len(s), MaxTransactionIDBytes)
	}
	parts := strings.Split(s, "/")
	if len(parts) != 4 && len(parts) != 5 {
		return TransactionID{}, fmt.Errorf("transaction id %q: want <uid8>/<module>/g<lineage>/a<attempt>[/r<n>]", s)
	}
	id := TransactionID{activation: parts[0], module: parts[1]}
	var err error
	if id.lineage, err = numberAfter(parts[2], 'g'); err != nil {
		return TransactionID{}, fmt.Errorf("transaction id %q: lineage: %w", s, err)
	}
	if id.attempt, err = numberAfter(parts[3], 'a'); err != nil {
		return TransactionID{}, fmt.Errorf("transaction id %q: attempt: %w", s, err)
	}
	if len(parts) == 5 {
		if id.renewal, err = numberAfter(parts[4], 'r'); err != nil {
			return TransactionID{}, fmt.Errorf("transaction id %q: renewal: %w", s, err)
		}
		if id.renewal == 0 {
			return TransactionID{}, fmt.Errorf("transaction id %q: renewal must be ≥ 1", s)
		}
	}
	if err := id.validate(); err != nil {
		return TransactionID{}, fmt.Errorf("%q: %w", s, err)
	}
	return id, nil
}

// numberAfter parses "<prefix><decimal>" with no sign and no leading zero.
func numberAfter(s string, prefix byte) (uint64, error) {
	if len(s) < 2 || s[0] != prefix {
		return 0, fmt.Errorf("%q is not %c<number>", s, prefix)
	}
	digits := s[1:]
	if digits[0] == '0' && len(digits) > 1 || digits[0] < '0' || digits[0] > '9' {
		return 0, fmt.Errorf("%q is not %c<number>", s, prefix)
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not %c<number>", s, prefix)
	}
	return n, nil
}

// String returns the wire form.
func (id TransactionID) String() string {
	s := id.activation + "/" + id.module + "/g" + strconv.FormatUint(id.lineage, 10) + "/a" + strconv.FormatUint(id.attempt, 10)
	if id.renewal > 0 {
		s += "/r" + strconv.FormatUint(id.renewal, 10)
	}
	return s
}

// Module is the module the transaction acts on.
func (id TransactionID) Module() string { return id.module }

// Lineage is the generation the transaction activates (or retires).
func (id TransactionID) Lineage() uint64 { return id.lineage }

// Attempt is the attempt at that lineage.
func (id TransactionID) Attempt() uint64 { return id.attempt }

// Renewal is n for the n-th renewal or relaunch, 0 otherwise.
func (id TransactionID) Renewal() uint64 { return id.renewal }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !lowerHexDigit[s[i]] {
			return false
		}
	}
	return true
}

// validModule matches ^[a-z][a-z0-9_]{0,47}$.
func validModule(s string) bool {
	if len(s) == 0 || len(s) > 48 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// validID matches an ID (docs/reference/encoding.md): 1–128 bytes of
// [A-Za-z0-9._\-/:@+].
func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxTransactionIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-', c == '/', c == ':', c == '@', c == '+':
		default:
			return false
		}
	}
	return true
}

// validDigest matches "sha256:" + 64 lowercase hex.
func validDigest(s string) bool {
	return len(s) == 71 && strings.HasPrefix(s, "sha256:") && isLowerHex(s[7:])
}
