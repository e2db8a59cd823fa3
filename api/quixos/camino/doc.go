// Package caminopb is the generated Go code of camino/api.proto: the dynamic
// Value a package runtime's inputs and results are made of (JSON's values,
// plus bytes).
package caminopb
