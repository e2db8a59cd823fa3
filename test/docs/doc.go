// Package docs runs the guides: the shell blocks of docs/getting-started.md,
// docs/providers.md, docs/fleet.md and the reference pages with examples, in the order
// written, each guide in one bash session of its own, against the local
// control plane the guide itself starts. A guide fails at its first command
// that exits non-zero or whose output differs from what the guide shows.
// It also compiles every Go block of the docs, resolves every relative link,
// and checks the module table of docs/providers.md against the built-in
// seam graph.
//
// How a guide is read (docs/README.md says the same for writers):
//
//   - A ```sh block is run. Where its lines start with "$ ", those lines
//     (with their continuation lines and here-document bodies) are the
//     commands and the other lines are the output the command must print;
//     otherwise every line is a command and output is not compared. A
//     command that shows no output is not compared either.
//   - An HTML comment right before a block steers it:
//     <!-- doctest: skip: <why> --> is not run;
//     <!-- doctest: your-values --> marks the lines "export NAME=value"
//     whose value the reader chooses: the test replaces each value by its
//     own (a directory under its temporary directory, or the checkout) and
//     changes nothing else;
//     <!-- doctest: file <path> --> writes the block (of any language) to
//     path, relative to the session's working directory at that point;
//     <!-- doctest: digests vary --> lets each 64-hex digest in the block's
//     output stand for any digest, consistently across the guide (the same
//     shown digest must always be the same actual one): digests of
//     executables depend on the toolchain that built them.
//   - Output is compared line by line after the test's own values are
//     replaced back by the guide's in the actual output: runs of blanks
//     compare equal to runs of blanks, trailing blanks are ignored, a
//     duration (17.22ms, 3s, 1m2s) stands for any duration, "…" within a
//     line for any text, and a line that is only "…" for any number of
//     lines.
//
// The getting-started and fleet guides run the manager, whose providers
// switch to uid 65534: they are run as root only (the test says so and
// skips otherwise).
package docs
