// Package lifecycle runs the real manager in-process against a real
// kube-apiserver with a custom seam graph (schema version 3, typed
// requirements) and shows what a user sees: module status and `kubectl
// iteron doctor` for each requirement case, and every phase a real hot swap
// takes a Generation through, recorded by a watch on the API. Test files
// only; its TestMain prints the requirement table after the tests.
package lifecycle
