// Package spawn starts provider processes and keeps track of them for
// every kind of provider the manager runs (internal/procexec for the line
// protocol, internal/pkgruntime for package runtimes), so that a manager has
// one spawner thread, one subreaper and one set of process-group records:
//
//   - SpawnGroup forks from one goroutine locked to its OS thread for the
//     life of the process (Pdeathsig, NoNewPrivs and the emptied capability
//     bounding set are that thread's), and registers the new process group
//     with the reaper before the reaper can see it;
//   - the reaper makes the manager a child subreaper and reaps only what is
//     its business: zombie members of registered groups and the escaped
//     descendants of providers (never wait4(-1));
//   - records are the durable trace of each live group (Record, WriteRecord,
//     SweepRecords), so that a manager that died has its leftovers killed by
//     the next one, never a reused pid.
package spawn
