package adapter

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lastingWatch is a KV watch that outlives its watcher. nats.go ends a
// watch whose ordered consumer it could not create again (js.go,
// resetOrderedConsumer: an error other than a timeout unsubscribes it),
// as a receiver cut off from the bucket's leader by a partition meets,
// and then closes its updates channel. A receiver that stopped watching
// its subscription's members or partition owners there would never see
// them change again: its partitions' assignment frozen, or its take-over
// sweeps blind. So the watch's user renews it when the updates end.
type lastingWatch struct {
	kv      jetstream.KeyValue
	pattern string
	opts    []jetstream.WatchOpt
	w       jetstream.KeyWatcher
}

// watchLasting starts a lasting watch of pattern in kv.
func watchLasting(ctx context.Context, kv jetstream.KeyValue, pattern string, opts ...jetstream.WatchOpt) (*lastingWatch, error) {
	l := &lastingWatch{kv: kv, pattern: pattern, opts: opts}
	w, err := kv.Watch(ctx, pattern, opts...)
	if err != nil {
		return nil, err
	}
	l.w = w
	return l, nil
}

// updates is the current watcher's channel: every value there now, then
// nil, then each change; closed when the watcher ends (renew).
func (l *lastingWatch) updates() <-chan jetstream.KeyValueEntry { return l.w.Updates() }

// renew watches again after the watcher ended by itself, trying until it
// succeeds or done is closed (then it returns false). The new watcher
// sends every value there now again, then nil: what its user kept from
// the old one may hold keys deleted since, which no delete will report.
func (l *lastingWatch) renew(done <-chan struct{}, onErr func(error)) bool {
	return l.watchUntil(done, onErr, renewWatchMin)
}

// watchLastingUntil starts a lasting watch of pattern in kv, trying again
// as renew does until it succeeds or done is closed (then it returns nil).
// A watch that could not start at first (its bucket's leader being
// elected, or out of reach through a partition) would otherwise leave its
// user blind for good: a receiver whose owner records went unwatched kept
// an assignment of the partitions that no other receiver shared, and a
// partition nobody pulled.
func watchLastingUntil(done <-chan struct{}, kv jetstream.KeyValue, pattern string, onErr func(error), opts ...jetstream.WatchOpt) *lastingWatch {
	l := &lastingWatch{kv: kv, pattern: pattern, opts: opts}
	if !l.watchUntil(done, onErr, 0) {
		return nil
	}
	return l
}

// watchUntil sets l.w to a new watcher, the first attempt after delay;
// false if done was closed first.
func (l *lastingWatch) watchUntil(done <-chan struct{}, onErr func(error), delay time.Duration) bool {
	for {
		select {
		case <-done:
			return false
		case <-time.After(delay):
		}
		select { // done before the timer, when both are ready
		case <-done:
			return false
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-done:
				cancel()
			case <-ctx.Done():
			}
		}()
		w, err := l.kv.Watch(ctx, l.pattern, l.opts...)
		if err == nil {
			// The watch lives on after its creating request: ctx is
			// released only when done or the watcher is stopped.
			l.w = &stopCancel{KeyWatcher: w, cancel: cancel}
			return true
		}
		cancel()
		onErr(err)
		delay = min(max(2*delay, renewWatchMin), renewWatchMax)
	}
}

// renewWatchMin and renewWatchMax bound the pause before each attempt to
// watch again.
const (
	renewWatchMin = 200 * time.Millisecond
	renewWatchMax = 5 * time.Second
)

// stop ends the current watcher.
func (l *lastingWatch) stop() { _ = l.w.Stop() }

// stopCancel is a watcher whose Stop also releases the context it was
// created with.
type stopCancel struct {
	jetstream.KeyWatcher
	cancel context.CancelFunc
}

func (s *stopCancel) Stop() error {
	err := s.KeyWatcher.Stop()
	s.cancel()
	return err
}
