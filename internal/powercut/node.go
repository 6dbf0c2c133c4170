package powercut

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node that keeps the undo log up to date. Everything
// it does not override is plain loopback.
type node struct {
	*fs.LoopbackNode
	fsys *FS
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
)

// WrapChild makes every node the loopback creates one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fsys: n.fsys}
}

// backingPath is the path of in within the backing directory.
func (n *node) backingPath(in *fs.Inode) string {
	return filepath.Join(n.fsys.backing, in.Path(nil))
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, backingFlags(flags))
	if errno != 0 {
		return nil, 0, errno
	}
	h, errno := n.fsys.newHandle(fh.(*fs.LoopbackFile), flags, false)
	return h, fuseFlags, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	// The kernel only sends CREATE for names it believes absent, but the
	// open is O_CREAT without O_EXCL, so look for ourselves.
	_, err := os.Lstat(filepath.Join(n.backingPath(n.EmbeddedInode()), name))
	isNew := errors.Is(err, os.ErrNotExist)
	child, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, backingFlags(flags), mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	h, errno := n.fsys.newHandle(fh.(*fs.LoopbackFile), flags, isNew)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return child, h, fuseFlags, 0
}

// backingFlags turns the flags of an open under the mount into those for the
// backing file. The descriptor must be readable, to save undo pages through it.
// O_TRUNC is applied by newHandle, so that it is undone by a cut. The sync
// flags and O_DIRECT only cost time on a backing file that never loses power.
func backingFlags(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		flags = flags&^syscall.O_ACCMODE | syscall.O_RDWR
	}
	return flags &^ (syscall.O_TRUNC | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_DIRECT)
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// LoopbackNode.Setattr tests its handle against nil, so a nil
	// *LoopbackFile must not be passed as a non-nil interface.
	var lf fs.FileHandle
	h, _ := f.(*handle)
	if h != nil {
		lf = h.lf
	}
	size, ok := in.GetSize()
	if !ok {
		return n.LoopbackNode.Setattr(ctx, lf, in, out)
	}
	// A truncation is a write from the new size on.
	var k fileKey
	var fd int
	if h != nil {
		k, fd = h.key, h.fd
	} else {
		file, err := os.Open(n.backingPath(n.EmbeddedInode()))
		if err != nil {
			return fs.ToErrno(err)
		}
		defer file.Close()
		fd = int(file.Fd())
		if k, _, err = keyOf(fd); err != nil {
			return fs.ToErrno(err)
		}
	}
	return n.fsys.change(k, fd, int64(size), truncateAll, false, func() syscall.Errno {
		return n.LoopbackNode.Setattr(ctx, lf, in, out)
	})
}

// Fsync commits the file. Directory fsyncs mostly go to the loopback's
// directory handle instead; either way they have no effect on the undo log.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return n.fsys.commit(h.key, h.fd)
	}
	file, err := os.Open(n.backingPath(n.EmbeddedInode()))
	if err != nil {
		return fs.ToErrno(err)
	}
	defer file.Close()
	k, _, err := keyOf(int(file.Fd()))
	if err != nil {
		return fs.ToErrno(err)
	}
	return n.fsys.commit(k, int(file.Fd()))
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	k, last := lastLink(filepath.Join(n.backingPath(n.EmbeddedInode()), name))
	errno := n.LoopbackNode.Unlink(ctx, name)
	if errno == 0 && last {
		n.fsys.forget(k)
	}
	return errno
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	from, _ := lastLink(filepath.Join(n.backingPath(n.EmbeddedInode()), name))
	to, last := lastLink(filepath.Join(n.backingPath(newParent.EmbeddedInode()), newName))
	errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	// The replaced file is gone, unless the two were swapped or were
	// one file already (then rename does nothing).
	if errno == 0 && last && flags&unix.RENAME_EXCHANGE == 0 && from != to {
		n.fsys.forget(to)
	}
	return errno
}

// CopyFileRange is refused with ENOSYS, so the kernel copies with reads and
// writes that go through the undo log.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// handle is an open file. It deliberately does not embed LoopbackFile:
// that would also offer passthrough, fallocate and ioctl, which write
// without going through the undo log.
type handle struct {
	fsys *FS
	lf   *fs.LoopbackFile
	fd   int     // lf's descriptor, valid until Release
	key  fileKey // the backing inode
	sync bool    // opened with O_SYNC or O_DSYNC
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileWritever  = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileStatxer   = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
)

// newHandle wraps a freshly opened backing file. flags are those of the open
// under the mount; isNew says whether the open created the file.
func (f *FS) newHandle(lf *fs.LoopbackFile, flags uint32, isNew bool) (*handle, syscall.Errno) {
	// PassthroughFd is just the public way to reach the descriptor;
	// passthrough itself stays off as handle does not offer it.
	fd, _ := lf.PassthroughFd()
	k, size, err := keyOf(fd)
	if err != nil {
		lf.Release(context.Background())
		return nil, fs.ToErrno(err)
	}
	h := &handle{fsys: f, lf: lf, fd: fd, key: k, sync: flags&syscall.O_DSYNC != 0} // O_SYNC includes the O_DSYNC bit
	if isNew {
		f.create(k)
	}
	if flags&syscall.O_TRUNC != 0 && size > 0 {
		errno := f.change(k, fd, 0, truncateAll, false, func() syscall.Errno {
			return fs.ToErrno(unix.Ftruncate(fd, 0))
		})
		if errno != 0 {
			lf.Release(context.Background())
			return nil, errno
		}
	}
	return h, 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return h.Writev(ctx, [][]byte{data}, off)
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var size int64
	for _, d := range data {
		size += int64(len(d))
	}
	var written uint32
	errno := h.fsys.change(h.key, h.fd, off, off+size, h.sync, func() (errno syscall.Errno) {
		written, errno = h.lf.Writev(ctx, data, off)
		return errno
	})
	return written, errno
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, dest, off)
}

func (h *handle) Flush(ctx context.Context) syscall.Errno   { return h.lf.Flush(ctx) }
func (h *handle) Release(ctx context.Context) syscall.Errno { return h.lf.Release(ctx) }

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

func (h *handle) Statx(ctx context.Context, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return h.lf.Statx(ctx, flags, mask, out)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}
