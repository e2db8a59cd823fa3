// Package repotext holds one check: the repository's text points only at
// what a reader of the repository has. Comments, docs, scripts, help and
// error messages cite the page of docs/ that holds a rule, never the
// design notes and wire spec the project was built from (files that are not
// in the repository), and name a feature, never the number of the issue
// that asked for it. A Go bug is written as golang/go#NNNNN.
//
// It has no code of its own and imports nothing of the module: the test
// reads every file git tracks (and every new file not ignored) and prints
// each offending line as file:line.
package repotext
