// Package powercut is a FUSE pass-through file system that can simulate a
// power cut: every write that was never made durable with fsync is dropped.
//
// Mount mirrors a backing directory at a mount point. Writes go straight
// through to the backing files, and the file system keeps, per file, just
// enough to undo them. Cut unmounts, rolls every file back to what it held at
// its last sync, and mounts again, so no kernel cache survives either.
//
// Semantics:
//
//   - State is kept per backing inode, so it follows renames and hard links.
//     A file untouched since Mount (or the last Cut) counts as synced as it is.
//   - For each file we remember its size at the last sync and, the first time a
//     4 KiB page inside that size is changed after the sync, the page's
//     original bytes (a copy-on-first-write undo log). Bytes beyond the synced
//     size need no undo: a cut truncates them away.
//   - fsync and fdatasync (on a handle, or on a node without one) commit the
//     file: its undo log is dropped and its synced size becomes its size.
//   - Writes through a handle opened with O_SYNC or O_DSYNC commit at once, as
//     if each write were followed by fsync.
//   - A file created through the mount has synced size 0 until it is synced,
//     so a cut leaves it existing but empty. That is the harsh but allowed
//     outcome of a power cut on a journaling file system (ext4, xfs).
//   - Truncation is a write: the pages it removes from the synced region are
//     saved first, so a cut restores them. O_TRUNC at open is handled the same.
//   - rename, unlink, link, mkdir and rmdir are durable at once (metadata
//     journaling). Unlinking a file's last name drops its state, as does
//     renaming another file over it. fsync of a directory has no effect.
//   - fallocate and copy_file_range are not offered (the kernel then falls
//     back or reports EOPNOTSUPP), so no write can bypass the undo log.
//
// The backing file system itself never loses power: fsync is not passed on,
// and O_SYNC, O_DSYNC and O_DIRECT are stripped when backing files are opened.
// Writeback caching and FUSE passthrough are off, so every write reaches this
// server before write(2) returns. Mounting needs root and /dev/fuse; the mount
// is made with mount(2) directly, no fusermount binary is involved.
package powercut

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const pageSize = 4096

// truncateAll ends the undo range of a truncation: everything from the new
// size up to the synced size may be lost.
const truncateAll = math.MaxInt64

// Stats describes what a Cut rolled back.
type Stats struct {
	Files int   // files that had unsynced writes
	Bytes int64 // bytes rolled back: restored page bytes plus bytes truncated away
}

// FS is a mounted power-cut file system.
type FS struct {
	backing, mountpoint string

	mu     sync.Mutex // serialises Cut and Close
	server *fuse.Server

	filesMu sync.Mutex
	files   map[fileKey]*fileState
}

// fileKey names a backing file by inode, so its state follows renames.
type fileKey struct{ dev, ino uint64 }

// fileState is what a Cut needs to roll one file back to its last sync.
type fileState struct {
	mu     sync.Mutex
	synced int64            // size at the last sync
	undo   map[int64][]byte // page index -> bytes it held at the last sync
	dirty  bool             // changed since the last sync
}

// Available reports why a mount cannot work here (not root, no /dev/fuse), or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("powercut: needs root to mount FUSE with mount(2)")
	}
	dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("powercut: %w", err)
	}
	dev.Close()
	// Root in a container may still lack CAP_SYS_ADMIN, which mount(2) needs.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("powercut: %w", err)
	}
	for line := range strings.Lines(string(status)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err == nil && caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
				return errors.New("powercut: mount(2) needs CAP_SYS_ADMIN")
			}
		}
	}
	return nil
}

// Mount mounts a pass-through of backing (an existing dir) at mountpoint (an existing empty dir).
func Mount(backing, mountpoint string) (*FS, error) {
	var err error
	f := &FS{files: make(map[fileKey]*fileState)}
	if f.backing, err = filepath.Abs(backing); err != nil {
		return nil, err
	}
	if f.mountpoint, err = filepath.Abs(mountpoint); err != nil {
		return nil, err
	}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) mount() error {
	var st unix.Stat_t
	if err := unix.Stat(f.backing, &st); err != nil {
		return fmt.Errorf("powercut: backing %s: %w", f.backing, err)
	}
	data := &fs.LoopbackRoot{Path: f.backing, Dev: st.Dev}
	root := &node{LoopbackNode: &fs.LoopbackNode{RootData: data}, fsys: f}
	data.RootNode = root
	server, err := fs.Mount(f.mountpoint, root, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMount:       true,
		DirectMountStrict: true, // report mount(2)'s error instead of falling back to fusermount
		FsName:            f.backing,
		Name:              "powercut",
		// Off by default already; say so, because the undo log is only
		// complete if every write reaches us before write(2) returns.
		DisabledCapabilities: fuse.CAP_WRITEBACK_CACHE | fuse.CAP_PASSTHROUGH,
	}})
	if err != nil {
		return fmt.Errorf("powercut: mount %s: %w", f.mountpoint, err)
	}
	f.server = server
	return nil
}

// Cut simulates a power cut. The caller must already have killed every process that writes
// under the mount. Cut unmounts, rolls every file in backing back to what it held at its last
// sync, then mounts again at the same mountpoint (so no kernel cache survives), and returns what it rolled back.
//
// While anything under the mount is still open (a file, or a process's working
// directory), the unmount fails with EBUSY after go-fuse's brief retries; Cut
// then returns that error and leaves the mount and its undo state as they were.
func (f *FS) Cut() (Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.server == nil {
		return Stats{}, errors.New("powercut: not mounted")
	}
	// Unmount fails with EBUSY while a file is open, and returns only
	// after every request handler has finished, so no write races the rollback.
	if err := f.server.Unmount(); err != nil {
		return Stats{}, fmt.Errorf("powercut: unmount %s: %w", f.mountpoint, err)
	}
	f.server = nil
	stats, err := f.rollback()
	return stats, errors.Join(err, f.mount())
}

// Close unmounts (no rollback).
func (f *FS) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.server == nil {
		return nil
	}
	if err := f.server.Unmount(); err != nil {
		return fmt.Errorf("powercut: unmount %s: %w", f.mountpoint, err)
	}
	f.server = nil
	return nil
}

// rollback restores every tracked file it finds under backing and starts
// afresh: after a cut, everything on disk counts as synced.
func (f *FS) rollback() (Stats, error) {
	f.filesMu.Lock()
	files := f.files
	f.files = make(map[fileKey]*fileState)
	f.filesMu.Unlock()

	var stats Stats
	err := filepath.WalkDir(f.backing, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		k := fileKey{st.Dev, st.Ino}
		s := files[k]
		delete(files, k) // another hard link to it must not be rolled back twice
		if s == nil {
			return nil
		}
		changed, n, err := s.rollback(path)
		if changed {
			stats.Files++
			stats.Bytes += n
		}
		return err
	})
	if err != nil {
		return stats, fmt.Errorf("powercut: rollback: %w", err)
	}
	return stats, nil
}

// rollback truncates the file at path to its synced size and writes the
// saved pages back, if it changed since its last sync. It returns whether it
// did and the number of bytes rolled back.
func (s *fileState) rollback(path string) (bool, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty {
		return false, 0, nil
	}
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return true, 0, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return true, 0, err
	}
	n := max(info.Size()-s.synced, 0)
	if err := file.Truncate(s.synced); err != nil {
		return true, n, err
	}
	for page, data := range s.undo {
		if _, err := file.WriteAt(data, page*pageSize); err != nil {
			return true, n, err
		}
		n += int64(len(data))
	}
	return true, n, file.Close()
}

// track returns the state of the file open as fd, creating it on first use
// with the current size as synced size. It returns nil for a file a Cut
// cannot find (unlinked) or need not roll back (not a regular file).
func (f *FS) track(k fileKey, fd int) (*fileState, error) {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	if s := f.files[k]; s != nil {
		return s, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Nlink == 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil
	}
	s := &fileState{synced: st.Size}
	f.files[k] = s
	return s, nil
}

// change saves the undo for the byte range [start, end) of the file and
// applies do while holding the file's lock, so that no other writer changes
// a page between saving it and writing it. With commit, the file is synced
// after do succeeds.
func (f *FS) change(k fileKey, fd int, start, end int64, commit bool, do func() syscall.Errno) syscall.Errno {
	s, err := f.track(k, fd)
	if err != nil {
		return fs.ToErrno(err)
	}
	if s == nil {
		return do()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.saveUndo(fd, start, end); err != nil {
		return fs.ToErrno(err)
	}
	s.dirty = true
	errno := do()
	if errno == 0 && commit {
		errno = s.commitLocked(fd)
	}
	return errno
}

// saveUndo saves the synced bytes of every page in [start, end) that has
// not been saved since the last sync. s.mu must be held.
func (s *fileState) saveUndo(fd int, start, end int64) error {
	end = min(end, s.synced)
	if start >= end {
		return nil // all beyond the synced size: a cut truncates it away
	}
	if s.undo == nil {
		s.undo = make(map[int64][]byte)
	}
	for page := start / pageSize; page*pageSize < end; page++ {
		if _, ok := s.undo[page]; ok {
			continue
		}
		off := page * pageSize
		buf := make([]byte, min(pageSize, s.synced-off))
		n, err := unix.Pread(fd, buf, off)
		if err != nil {
			return err
		}
		s.undo[page] = buf[:n]
	}
	return nil
}

// commit makes the file open as fd durable, as fsync would.
func (f *FS) commit(k fileKey, fd int) syscall.Errno {
	f.filesMu.Lock()
	s := f.files[k]
	f.filesMu.Unlock()
	if s == nil {
		return 0 // untouched since the last sync
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitLocked(fd)
}

func (s *fileState) commitLocked(fd int) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	s.synced, s.undo, s.dirty = st.Size, nil, false
	return 0
}

// create records that file k was just created, so that a cut empties it.
// It replaces any stale state left under a reused inode number.
func (f *FS) create(k fileKey) {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	f.files[k] = &fileState{}
}

// forget drops the state of a file whose last name was removed.
func (f *FS) forget(k fileKey) {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	delete(f.files, k)
}

// lastLink reports the key of the regular file at path if path is its only
// name, that is, if removing path removes the file.
func lastLink(path string) (fileKey, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fileKey{}, false
	}
	return fileKey{st.Dev, st.Ino}, st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1
}

// keyOf returns the key and size of the file open as fd.
func keyOf(fd int) (fileKey, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileKey{}, 0, err
	}
	return fileKey{st.Dev, st.Ino}, st.Size, nil
}
