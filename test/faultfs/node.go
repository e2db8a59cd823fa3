package faultfs

import (
	"bytes"
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with every opened file and directory
// wrapped, so writes and fsyncs pass the rules first. Everything else is the
// loopback's own pass-through.
type node struct {
	*fs.LoopbackNode
	fsys *FS
}

// The loopback calls and the bridge dispatches by these interfaces; a
// wrapper that missed one would silently turn an operation into ENOTSUP.
var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.FileReader         = (*file)(nil)
	_ fs.FileWriter         = (*file)(nil)
	_ fs.FileWritever       = (*file)(nil)
	_ fs.FileFsyncer        = (*file)(nil)
	_ fs.FileFlusher        = (*file)(nil)
	_ fs.FileReleaser       = (*file)(nil)
	_ fs.FileGetattrer      = (*file)(nil)
	_ fs.FileSetattrer      = (*file)(nil)
	_ fs.FileStatxer        = (*file)(nil)
	_ fs.FileLseeker        = (*file)(nil)
	_ fs.FileAllocater      = (*file)(nil)
	_ fs.FileReaddirenter   = (*dir)(nil)
	_ fs.FileSeekdirer      = (*dir)(nil)
	_ fs.FileReleasedirer   = (*dir)(nil)
	_ fs.FileFsyncdirer     = (*dir)(nil)
)

// WrapChild makes every node the loopback creates (lookup, create, mkdir,
// …) one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fsys: n.fsys}
}

// Open opens the backing file and wraps it. FOPEN_DIRECT_IO keeps the page
// cache out: each write(2) becomes one WRITE request, answered before
// write(2) returns.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return newFile(n.fsys, n.EmbeddedInode(), fh, flags), fuseFlags | fuse.FOPEN_DIRECT_IO, 0
}

// Create creates the backing file and wraps it, as Open.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, newFile(n.fsys, ch, fh, flags), fuseFlags | fuse.FOPEN_DIRECT_IO, 0
}

// Tmpfile opens an O_TMPFILE file and wraps it, as Open.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fuseFlags, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, newFile(n.fsys, ch, fh, flags), fuseFlags | fuse.FOPEN_DIRECT_IO, 0
}

// OpendirHandle wraps the directory handle so an fsync of the directory
// passes the rules.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dir{inner: fh, fsys: n.fsys, inode: n.EmbeddedInode()}, fuseFlags, 0
}

// CopyFileRange is refused so that a copy falls back to reads and writes,
// which the rules see (the loopback's server-side copy would bypass them,
// and needs its own file type, which ours hides).
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

// file is an open file. It forwards to go-fuse's LoopbackFile, except that
// writes and fsyncs pass the rules first, and it deliberately does not
// offer PassthroughFd: with it, go-fuse would let the kernel read and write
// the backing file directly (FUSE passthrough, which a root mount on a
// recent kernel gets), and writes would never reach the rules.
type file struct {
	inner fs.FileHandle
	inode *fs.Inode
	fsys  *FS
}

func newFile(fsys *FS, inode *fs.Inode, fh fs.FileHandle, flags uint32) *file {
	// The loopback opens the backing file without O_APPEND and writes at the
	// offset the kernel sends. Keep O_APPEND on the backing descriptor too,
	// so an append lands at the backing file's real end even if the kernel's
	// idea of the size is stale (the backing file was changed beside the
	// mount).
	if flags&syscall.O_APPEND != 0 {
		if p, ok := fh.(fs.FilePassthroughFder); ok {
			if fd, ok := p.PassthroughFd(); ok {
				if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
					_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_APPEND)
				}
			}
		}
	}
	return &file{inner: fh, inode: inode, fsys: fsys}
}

// callerPID is the thread that made the request: the kernel sends the
// calling task's id.
func callerPID(ctx context.Context) uint32 {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Pid
	}
	return 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	o := opInfo{op: OpWrite, path: f.inode.Path(nil), data: data, size: len(data), offset: off, pid: callerPID(ctx)}
	if errno := f.fsys.decide(&o); errno != 0 {
		return 0, errno
	}
	if w, ok := f.inner.(fs.FileWriter); ok {
		return w.Write(ctx, data, off)
	}
	return 0, syscall.ENOTSUP
}

func (f *file) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	// The rules look for bytes across the buffers' boundaries too.
	joined := bytes.Join(data, nil)
	o := opInfo{op: OpWrite, path: f.inode.Path(nil), data: joined, size: len(joined), offset: off, pid: callerPID(ctx)}
	if errno := f.fsys.decide(&o); errno != 0 {
		return 0, errno
	}
	if w, ok := f.inner.(fs.FileWritever); ok {
		return w.Writev(ctx, data, off)
	}
	if w, ok := f.inner.(fs.FileWriter); ok {
		return w.Write(ctx, joined, off)
	}
	return 0, syscall.ENOTSUP
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	o := opInfo{op: OpFsync, path: f.inode.Path(nil), datasync: flags&1 != 0, pid: callerPID(ctx)}
	if errno := f.fsys.decide(&o); errno != 0 {
		return errno
	}
	if s, ok := f.inner.(fs.FileFsyncer); ok {
		return s.Fsync(ctx, flags)
	}
	return syscall.ENOTSUP
}

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if r, ok := f.inner.(fs.FileReader); ok {
		return r.Read(ctx, dest, off)
	}
	return nil, syscall.ENOTSUP
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	if fl, ok := f.inner.(fs.FileFlusher); ok {
		return fl.Flush(ctx)
	}
	return 0
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	if r, ok := f.inner.(fs.FileReleaser); ok {
		return r.Release(ctx)
	}
	return 0
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if g, ok := f.inner.(fs.FileGetattrer); ok {
		return g.Getattr(ctx, out)
	}
	return syscall.ENOTSUP
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if s, ok := f.inner.(fs.FileSetattrer); ok {
		return s.Setattr(ctx, in, out)
	}
	return syscall.ENOTSUP
}

func (f *file) Statx(ctx context.Context, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if s, ok := f.inner.(fs.FileStatxer); ok {
		return s.Statx(ctx, flags, mask, out)
	}
	return syscall.ENOTSUP
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if l, ok := f.inner.(fs.FileLseeker); ok {
		return l.Lseek(ctx, off, whence)
	}
	return 0, syscall.ENOTSUP
}

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if a, ok := f.inner.(fs.FileAllocater); ok {
		return a.Allocate(ctx, off, size, mode)
	}
	return syscall.ENOTSUP
}

// dir is an open directory: the loopback's, with fsync passing the rules.
type dir struct {
	inner fs.FileHandle
	inode *fs.Inode
	fsys  *FS
}

func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if r, ok := d.inner.(fs.FileReaddirenter); ok {
		return r.Readdirent(ctx)
	}
	return nil, syscall.ENOTSUP
}

func (d *dir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.inner.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dir) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.inner.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
	}
}

func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	o := opInfo{op: OpFsync, path: d.inode.Path(nil), datasync: flags&1 != 0, dir: true, pid: callerPID(ctx)}
	if errno := d.fsys.decide(&o); errno != 0 {
		return errno
	}
	if s, ok := d.inner.(fs.FileFsyncdirer); ok {
		return s.Fsyncdir(ctx, flags)
	}
	return syscall.ENOTSUP
}
