package pubsubapi

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Recording a subscription's activity never holds the RPC that is the
// activity: with the server's answers held back (a cluster electing the
// bucket's leader), touch returns at once, the write under way counts
// for expiration, and close ends it.
func TestActivityTouchDoesNotWait(t *testing.T) {
	srv := testutil.Server(t)
	p, err := faultproxy.Start(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	nc := testutil.Connect(t, p.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a := newActivity(&Server{log: slog.New(slog.DiscardHandler)}, js, 1, func() time.Time { return now })
	p.HoldReplies()

	const name = "projects/p/subscriptions/s"
	start := time.Now()
	a.touch(name)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("touch took %v with the server's answers held back", took)
	}
	if at, ok := a.lastTouched(name); !ok || !at.Equal(now) {
		t.Fatalf("the write under way is not counted: %v %v", at, ok)
	}
	start = time.Now()
	a.close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("close took %v: the write was not ended", took)
	}
	a.touch(name + "2") // after close: nothing starts
	if _, ok := a.lastTouched(name + "2"); ok {
		t.Fatal("a write started after close")
	}
}
