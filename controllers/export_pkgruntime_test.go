package controllers

// NewGeneration exposes newGeneration to the suite, which dry-runs the
// Generation of a package runtime's plan against the real API server.
var NewGeneration = newGeneration
