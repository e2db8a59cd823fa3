package dispatch

// ServedModule is one module a node serves, as a caller's handshake lists
// it: what the gateway reads of the node runtime besides a dispatcher.
type ServedModule struct {
	// Namespace and Activation name the ImplementationActivation.
	Namespace, Activation string
	// Module is the module's name.
	Module string
	// Lineage is the active generation's lineage (0 when none serves).
	Lineage int64
	// GenerationName is the active Generation's name ("" when none).
	GenerationName string
	// Epoch and ImplementationID are the active generation's.
	Epoch, ImplementationID string
	// Phase is the module's phase (Active, Inactive, Failed, ...).
	Phase string
	// Reason explains a module that is not Active.
	Reason string
}
