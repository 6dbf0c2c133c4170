//go:build unix

package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// storeLock is an exclusive flock on the store's lock file. The kernel
// drops it when the process ends, however it ends, so a killed sidecar
// never leaves its store locked.
type storeLock struct{ f *os.File }

func lockStore(dir string) (*storeLock, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStoreDir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid := readPID(f)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			if pid != "" {
				return nil, fmt.Errorf("%w: %s is held by pid %s", ErrStoreLocked, dir, pid)
			}
			return nil, fmt.Errorf("%w: %s", ErrStoreLocked, dir)
		}
		return nil, fmt.Errorf("%w: lock %s: %v", ErrStoreDir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f}, nil
}

// release unlocks; the pid stays in the file, it is only read while the
// lock is held.
func (l *storeLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
