// Package ledger is the hash-chained durable ledger of hot-swap transactions
// (docs/reference/ledger.md): the evidence of every phase of every
// transaction, durable before the next phase starts, replayable, and
// tamper-evident.
//
// Records have exactly the layout and hash construction of the protocol
// family's iteron-hotswap-ledger/1, so a family ledger verifies here with the
// family's grammar; this operator writes iteron-operator-ledger/1, whose
// grammar adds first activations, relaunches, renewals, cold replaces,
// retirements, segments and forward recovery of an interrupted transaction.
//
// Records are written in exactly the bytes strictjson.Canonical (serde_json)
// produces; the append path writes them with a direct encoder that is
// tested against strictjson.Canonical, because Canonical's reflection cost
// sat between every two fdatasyncs (bench/README.md).
//
// Writing: Open (or OpenActivation) locks a ledger directory, replays it,
// truncates a torn tail and reports it; Begin opens a transaction of one Kind
// and the Txn's methods append its phase records one at a time, each written
// with one O_APPEND write and fdatasync before the method returns, each
// checked first against the same rules a reader applies. Any I/O error
// freezes the ledger (ErrFrozen) until it is reopened and replayed; Recover
// closes a transaction a crash left open.
//
// Reading: Verify and Replay check every rule read-only and never repair;
// a broken rule is a *RuleError naming the Rule and the sequence.
//
// The package imports only pkg/strictjson from this module: it sits below
// the effects, hot-swap and gateway layers.
package ledger
