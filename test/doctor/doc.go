// Package doctor holds the tests of `kubectl iteron doctor` on real objects:
// the real controllers run in-process against a real kube-apiserver with real
// providers, the doctor diagnoses what they wrote (a tampered artifact and the
// modules it gates, a failed swap, a paused spec, a finalizer held for a
// missing Node, a cluster without Nodes, an orphaned provider process, a
// ledger that does not verify), and the kubectl-iteron binary is run on the
// same objects, its printed commands included.
package doctor
