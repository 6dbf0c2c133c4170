package adapter

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestBindWatchStepsDownAConsumerStalledUnboundTwice(t *testing.T) {
	info := func(name string, bound, paused bool, pending, ackPending int, delivered uint64) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{Name: name, PushBound: bound, Paused: paused, NumPending: uint64(pending),
			NumAckPending: ackPending, Delivered: jetstream.SequenceInfo{Consumer: delivered}}
	}
	w := newBindWatch()
	now := time.Now()
	listing := func(want map[string]bool, infos ...*jetstream.ConsumerInfo) {
		t.Helper()
		for _, i := range infos {
			if got := w.observe(i, now); got != want[i.Name] {
				t.Errorf("at %v, %s (bound %v paused %v pending %d ack pending %d delivered %d): step down %v, want %v",
					now.Sub(now.Truncate(time.Hour)), i.Name, i.PushBound, i.Paused, i.NumPending, i.NumAckPending, i.Delivered.Consumer, got, want[i.Name])
			}
		}
		w.listed(now)
		now = now.Add(bindCheckInterval)
	}
	// First listing: nobody is stepped down on one sighting.
	listing(nil,
		info("stalled", false, false, 1, 0, 5),
		info("unacked", false, false, 0, 1, 5),
		info("progressing", false, false, 3, 0, 5),
		info("bound", true, false, 3, 0, 5),
		info("paused", false, true, 3, 0, 5),
		info("idle", false, false, 0, 0, 5))
	// Second: the stalled ones are; one that delivered meanwhile is not.
	listing(map[string]bool{"stalled": true, "unacked": true},
		info("stalled", false, false, 1, 0, 5),
		info("unacked", false, false, 0, 1, 5),
		info("progressing", false, false, 3, 0, 6),
		info("bound", true, false, 3, 0, 5),
		info("paused", false, true, 3, 0, 5),
		info("idle", false, false, 0, 0, 5))
	// Still stalled: not asked again before restepAfter.
	listing(nil, info("stalled", false, false, 1, 0, 5), info("unacked", false, false, 0, 1, 5))
	now = now.Add(restepAfter)
	listing(map[string]bool{"stalled": true}, info("stalled", false, false, 1, 0, 5))
	// Bound again, then unbound: two sightings again.
	listing(nil, info("stalled", true, false, 1, 0, 5))
	listing(nil, info("stalled", false, false, 1, 0, 5))
}
