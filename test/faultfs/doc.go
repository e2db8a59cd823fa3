// Package faultfs is a FUSE file system for tests that passes every
// operation through to a backing directory until a test tells it to fail a
// chosen write or fsync, so a test can make a real process (the manager
// binary, a child, or the test itself) see ENOSPC or EIO at one exact point
// of its work: the ledger append that carries "phase":"snapshot", the third
// write to a segment, the fdatasync after it. RLIMIT_FSIZE or a small tmpfs
// cannot aim at one phase; this can. Test packages only.
//
// # Use
//
//	backing := t.TempDir()
//	fsys := faultfs.ForTest(t, backing) // skips without /dev/fuse or root (fails with ITERON_REQUIRE_FUSE=1); unmounts in t.Cleanup
//	stateDir := fsys.Mountpoint()       // give this to the process under test
//	fault := fsys.FailWrites(faultfs.Rule{Contains: `"phase":"snapshot"`, Errno: syscall.ENOSPC})
//	... run the process ...
//	<-fault.Fired()                     // (with a timeout) the fault really fired
//	fsys.Failures()                     // which operations failed: path, errno, bytes
//	fsys.Heal()                         // every later operation passes again
//
// Rules can be added and removed at any time, while another process writes
// through the mount. Inspect the result on the backing directory, which is
// an ordinary directory: what is there is exactly what the process managed to
// write. Call Unmount (ForTest does) from t.Cleanup so the mount goes even
// when the test fails.
//
// # Guarantees
//
//   - Pass-through: every operation is the backing directory's (go-fuse's
//     loopback node), under the same names, with the same errors. Create,
//     open (O_APPEND and O_EXCL included), read, pread, write, ftruncate,
//     fchmod, fstat and fstatat, rename (with RENAME_NOREPLACE), unlink,
//     mkdir, rmdir, readdir with rewind, fsync and fdatasync of files and of
//     directories all reach the backing directory.
//   - No cache between the writer and the rules: every file is opened with
//     FOPEN_DIRECT_IO and the kernel's FUSE passthrough is disabled, so each
//     write(2) reaches the rules synchronously as one request and its errno
//     is what write(2) returns; entry, attribute and negative-lookup
//     timeouts are zero, so a stat sees the backing file as it is now. Each
//     fsync(2) and fdatasync(2), of a file or a directory, reaches the rules
//     too and returns their errno.
//   - A failed write writes nothing: the rules decide before the backing
//     file is touched, so the backing file keeps exactly the bytes it had
//     (no partial record, no change of size). The kernel splits one write(2)
//     larger than MaxWrite (1 MiB) into several requests; the rules see each
//     piece, and a failure of a later piece leaves the earlier pieces written
//     and write(2) returns the short count, as a real disk would. A ledger
//     record (at most 16 KiB) or a snapshot (at most 600 KiB) is one piece.
//   - A failed fsync changes nothing either; the data written before it is
//     in the backing file (it was written synchronously), as after a real
//     fsync failure on a disk that still holds the page cache.
//   - flock: the server does not ask for lock forwarding, so the kernel
//     keeps flock locks on the mount's own inodes. Two descriptors or
//     processes locking through the mount conflict as on a local file
//     system; a lock taken on the backing directory directly does not
//     conflict with one taken through the mount.
//   - Unmount always removes the mount: a plain unmount, or, when something
//     still has a file open there, a lazy one that also aborts the FUSE
//     connection, so a descriptor still open gets ENOTCONN instead of
//     waiting on a server that is gone, and nothing can hang on it. A mount
//     left by a test process that died without cleaning up (a go test
//     timeout panics past t.Cleanup) is removed by the next Mount.
//
// Rules fail writes (write, pwrite, writev, and the writes a copy_file_range
// falls back to) and fsyncs; truncate, fallocate, metadata operations and
// reads always pass through. Shared writable mmap of a file on the mount is
// refused (ENODEV), a consequence of direct I/O; the ledger and the snapshot
// store do not map files. Set FAULTFS_DEBUG=1 (DebugEnv) to log every FUSE
// request and reply.
package faultfs
