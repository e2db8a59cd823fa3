package controllers

// PatchStatusFrom exposes patchStatusFrom to the suite, which runs against
// the real API server.
var PatchStatusFrom = patchStatusFrom
