package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// SyncPolicy is when the server's writes reach stable storage before the
// writer is told they are done.
type SyncPolicy string

const (
	// SyncGroup, the default, is group commit: JetStream writes as usual
	// (into the operating system's cache), and Server.Sync makes
	// everything written before the call durable with one round of fsyncs
	// shared by every caller waiting at the time. Callers that must not
	// acknowledge before the data is durable (a publish result, an RPC that
	// created a resource) call Sync first.
	SyncGroup SyncPolicy = "group"
	// SyncAlways is the server's own sync_interval: always: every write is
	// fsynced before the server answers it. Sync does nothing.
	SyncAlways SyncPolicy = "always"
	// SyncLazy is JetStream's default: a background fsync every 2 minutes.
	// A power cut or an operating system crash loses what was written since,
	// acknowledged publishes, topics and subscriptions included. Sync does
	// nothing.
	SyncLazy SyncPolicy = "lazy"
)

// ParseSyncPolicy reads a policy by name.
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch p := SyncPolicy(s); p {
	case SyncGroup, SyncAlways, SyncLazy:
		return p, nil
	case "":
		return SyncGroup, nil
	}
	return "", fmt.Errorf("sync policy %q: want group, always or lazy", s)
}

// groupSyncer makes a store directory durable in rounds. A caller waits for
// the first round that starts after its call: that round's walk sees every
// file the server had written before the call. Rounds run one at a time, so
// callers that arrive while one runs share the next.
type groupSyncer struct {
	dir string

	mu      sync.Mutex
	running bool
	waiting *round // callers waiting for the next round; nil if none
	seen    map[string]fileMark

	syncCounters
}

// syncCounters are the work done so far.
type syncCounters struct {
	rounds, files uint64
	busy          time.Duration
}

func (g *groupSyncer) stats() syncCounters {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.syncCounters
}

// round is one walk of the store: done is closed when it ended, with err.
type round struct {
	done chan struct{}
	err  error
}

// fileMark is what a walk saw of a file: a file whose mark changed since
// the last round that synced it is synced again.
type fileMark struct {
	ino, size uint64
	mtime     int64
}

func newGroupSyncer(dir string) *groupSyncer {
	return &groupSyncer{dir: dir, seen: make(map[string]fileMark)}
}

// sync waits until everything written under the directory before the call
// is durable, or ctx ends.
func (g *groupSyncer) sync(ctx context.Context) error {
	g.mu.Lock()
	r := g.waiting
	if r == nil {
		r = &round{done: make(chan struct{})}
		g.waiting = r
	}
	if !g.running {
		g.running = true
		go g.loop()
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *groupSyncer) loop() {
	for {
		g.mu.Lock()
		r := g.waiting
		g.waiting = nil
		if r == nil {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		start := time.Now()
		n, err := g.walk()
		g.mu.Lock()
		g.rounds++
		g.files += uint64(n)
		g.busy += time.Since(start)
		g.mu.Unlock()
		r.err = err
		close(r.done)
	}
}

// walk fsyncs every file whose mark changed, then every directory that
// holds one of them or changed itself (new, renamed or removed entries),
// and returns how many files it synced. Only loop calls it, so seen needs
// no lock of its own beyond g.mu's hand-over.
func (g *groupSyncer) walk() (int, error) {
	synced := 0
	dirs := make(map[string]bool)
	var errs []error
	err := filepath.WalkDir(g.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// A file removed (a block compacted, a consumer deleted)
			// between listing and stat is not an error: it holds nothing.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		st, _ := info.Sys().(*syscall.Stat_t)
		if st == nil {
			return nil
		}
		mark := fileMark{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano()}
		if g.seen[path] == mark {
			return nil
		}
		if d.IsDir() {
			dirs[path] = true
		} else if d.Type().IsRegular() {
			if err := fsyncPath(path); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				errs = append(errs, err)
				return nil
			}
			synced++
			dirs[filepath.Dir(path)] = true
		}
		g.seen[path] = mark
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	for dir := range dirs {
		if err := fsyncPath(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			delete(g.seen, dir) // try again next round
		}
	}
	if len(errs) > 0 {
		// Forget every mark, so that the next round syncs everything again
		// rather than trust a round that failed.
		clear(g.seen)
		return synced, fmt.Errorf("embedded: sync the store: %w", errors.Join(errs...))
	}
	return synced, nil
}

func fsyncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SyncStats counts the group commit's work since the server started.
type SyncStats struct {
	Policy SyncPolicy
	Rounds uint64        // walks of the store
	Files  uint64        // files fsynced in them
	Busy   time.Duration // time spent in them
}

// Sync returns once everything the server wrote before the call is on
// stable storage (under SyncGroup), or at once under the other policies:
// under SyncAlways the server synced it before answering, under SyncLazy
// nobody asked. Concurrent callers share one round of fsyncs.
func (s *Server) Sync(ctx context.Context) error {
	if s.syncer == nil {
		return nil
	}
	return s.syncer.sync(ctx)
}

// SyncPolicy is the policy the server runs with.
func (s *Server) SyncPolicy() SyncPolicy { return s.policy }

// SyncStats reports the group commit's work.
func (s *Server) SyncStats() SyncStats {
	st := SyncStats{Policy: s.policy}
	if s.syncer != nil {
		c := s.syncer.stats()
		st.Rounds, st.Files, st.Busy = c.rounds, c.files, c.busy
	}
	return st
}
