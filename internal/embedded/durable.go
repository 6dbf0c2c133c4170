package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
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

// groupSyncInterval is the server's own background fsync under SyncGroup
// (JetStream's default is 2 minutes).
const groupSyncInterval = time.Second

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
//
// It walks the server's own tree (<store>/jetstream, symbolic links
// resolved), not whatever else the directory holds (a volume's lost+found).
// Consumer state files (o.dat) are left out: nats-server rewrites them every
// 100 ms per active consumer, and a cut may roll acks back anyway.
type groupSyncer struct {
	root string // the store directory, links resolved
	tree string // root/jetstream: what the rounds walk

	mu      sync.Mutex
	running bool
	waiting *round // callers waiting for the next round; nil if none
	// failed is the first fsync error: after it the kernel may have
	// dropped the pages it could not write and marked them clean, so no
	// later round can promise anything. Every later Sync fails with it.
	failed error
	syncCounters

	// Only the running loop touches these.
	seen       map[string]fileMark
	lastRound  time.Time
	rootSynced bool
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

func newGroupSyncer(dir string) (*groupSyncer, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded: store directory: %w", err)
	}
	return &groupSyncer{root: root, tree: filepath.Join(root, "jetstream"), seen: make(map[string]fileMark)}, nil
}

// sync waits until everything written under the directory before the call
// is durable, or ctx ends.
func (g *groupSyncer) sync(ctx context.Context) error {
	g.mu.Lock()
	if g.failed != nil {
		g.mu.Unlock()
		return g.failed
	}
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
		failed := g.failed
		g.mu.Unlock()
		start := time.Now()
		n, err := 0, failed
		if failed == nil {
			n, err = g.walk(start)
		}
		g.mu.Lock()
		g.rounds++
		g.files += uint64(n)
		g.busy += time.Since(start)
		if errors.Is(err, errFsync) && g.failed == nil {
			g.failed = err
		}
		g.mu.Unlock()
		r.err = err
		close(r.done)
	}
}

// errFsync marks a failed fsync, after which the syncer fails for good.
var errFsync = errors.New("embedded: fsync failed; writes may be lost, and the store is not durable until the server restarts")

// walk fsyncs every file whose mark changed, then every directory that
// holds one of them, or changed, or is new (and its parent), and returns
// how many files it synced.
func (g *groupSyncer) walk(start time.Time) (int, error) {
	synced := 0
	dirs := make(map[string]bool)
	if !g.rootSynced {
		dirs[g.root] = true // the entry of jetstream/ itself
	}
	seen := make(map[string]fileMark, len(g.seen))
	var errs []error
	err := filepath.WalkDir(g.tree, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// A file removed (a block compacted, a consumer deleted)
			// between listing and stat is not an error: it holds nothing.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && d.Name() == "o.dat" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		mark := fileMark{ino: inode(info), size: uint64(info.Size()), mtime: info.ModTime().UnixNano()}
		old, known := g.seen[path]
		// A change within the file system's timestamp granularity of the
		// last round could leave the mark as it was ("racy" marks, as git
		// calls them): a mark that new is synced again next round.
		racy := !g.lastRound.IsZero() && mark.mtime >= g.lastRound.Add(-timestampSlack).UnixNano()
		if known && old == mark && !racy {
			seen[path] = mark
			return nil
		}
		if !known || old.ino != mark.ino {
			dirs[filepath.Dir(path)] = true // a new entry in its directory
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
		}
		seen[path] = mark
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // no jetstream/ yet: nothing written
		errs = append(errs, err)
	}
	for dir := range dirs {
		if err := fsyncPath(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return synced, fmt.Errorf("%w: %w", errFsync, errors.Join(errs...))
	}
	g.seen, g.lastRound, g.rootSynced = seen, start, true
	return synced, nil
}

// timestampSlack covers file systems whose timestamps are coarser than
// the clock (a jiffy, up to 10 ms).
const timestampSlack = 20 * time.Millisecond

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
// nobody asked. Concurrent callers share one round of fsyncs. It covers a
// standalone server: a stream with replicas writes lazily even on its
// leader, and its durability is the Raft log's (sync_interval: always).
// After an fsync fails, every later call fails: the kernel may have
// dropped what it could not write.
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
