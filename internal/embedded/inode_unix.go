//go:build unix

package embedded

import (
	"io/fs"
	"syscall"
)

// inode is the file's inode number: a file replaced by rename has a new one.
func inode(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino) //nolint:unconvert // int32 or uint64 by platform
	}
	return 0
}
