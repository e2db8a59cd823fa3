// Package hotswap is the node-local transaction coordinator: it owns every
// provider process of this node's activations, runs their transactions one at
// a time per activation — first activation, hot swap, cold replace,
// retirement — appends every phase durably to the activation's ledger before
// the next phase starts, and routes calls through one dispatch.Dispatcher per
// module. The provider adapters and their launches are internal/providers;
// the dispatcher is internal/dispatch.
//
// Only the activation controller changes it (Apply, Remove); the generation
// controller and the gateway read it (Status, Dispatcher). Reconcilers never
// block on a process: transactions run in the coordinator's goroutines and
// report progress through Config.Notify.
package hotswap
