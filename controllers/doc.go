// Package controllers holds the activation and generation reconcilers. They
// are thin: load the object, ensure the finalizer, call phase functions from
// internal/, patch status once with observedGeneration.
package controllers
