package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

var (
	// ErrStoreDir is returned by Start when the store directory is not a
	// directory, cannot be created, or is not writable.
	ErrStoreDir = errors.New("embedded: store directory unusable")
	// ErrStoreLocked is returned by Start when another process runs a
	// server on the same store directory.
	ErrStoreLocked = errors.New("embedded: store directory in use by another process")
	// ErrPortInUse is returned by Start when the client port is taken.
	ErrPortInUse = errors.New("embedded: client port in use")
)

// checkStoreDir makes sure dir is a directory this process can write,
// creating it if needed.
func checkStoreDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrStoreDir, dir)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("%w: %v", ErrStoreDir, err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("%w: %s is not writable: %v", ErrStoreDir, dir, err)
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return nil
}

// checkPort reports a client port another process listens on. nats-server
// itself only logs that failure and never becomes ready.
func checkPort(host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPortInUse, addr, err)
	}
	return l.Close()
}

// lockName is the lock file in the store directory; it holds the pid of
// the process that has the store.
const lockName = "jetorder.lock"

// readPID returns the pid written in a lock file, "" when unknown.
func readPID(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid := strings.TrimSpace(string(b[:n]))
	if _, err := strconv.Atoi(pid); err != nil {
		return ""
	}
	return pid
}

// logBridge passes nats-server's log to a slog.Logger and keeps the first
// fatal error, which ends Start.
type logBridge struct {
	log *slog.Logger

	mu  sync.Mutex
	err error
}

func newLogBridge(log *slog.Logger) *logBridge {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &logBridge{log: log.With("component", "nats-server")}
}

func (b *logBridge) fatal() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *logBridge) logf(level slog.Level, format string, v []any) {
	if b.log.Enabled(context.Background(), level) {
		b.log.Log(context.Background(), level, fmt.Sprintf(format, v...))
	}
}

// Notices are nats-server's start-up banner and routine events: debug.
func (b *logBridge) Noticef(format string, v ...any) { b.logf(slog.LevelDebug, format, v) }
func (b *logBridge) Warnf(format string, v ...any) {
	level := slog.LevelWarn
	if strings.Contains(format, "generally discouraged") {
		level = slog.LevelDebug // MaxPayload's, chosen on purpose
	}
	b.logf(level, format, v)
}
func (b *logBridge) Errorf(format string, v ...any) { b.logf(slog.LevelError, format, v) }
func (b *logBridge) Debugf(format string, v ...any) { b.logf(slog.LevelDebug, format, v) }
func (b *logBridge) Tracef(format string, v ...any) {}

// Fatalf is an error nats-server cannot go on from (a port it cannot
// listen on, JetStream that cannot start); its own logger would exit the
// process.
func (b *logBridge) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	b.log.Error(msg)
	b.mu.Lock()
	if b.err == nil {
		b.err = errors.New(msg)
	}
	b.mu.Unlock()
}
