package broker

import (
	"context"
	"slices"
	"testing"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
)

// crashAfterReserve reserves orders for msgs through a broker of its own,
// as a request does before publishing, publishes only the first stored of
// them, runs alive, and then "crashes": the broker's connection closes
// without storing the rest or settling anything.
func (e *stampEnv) crashAfterReserve(stored int, msgs []*adapter.Message, alive func()) {
	e.t.Helper()
	ctx := context.Background()
	nc := testutil.Connect(e.t, e.srv.ClientURL())
	b := New(nc, nil, nil)
	tp, err := b.Topic(stampProject, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := b.stamp(ctx, stampProject, tp, msgs); err != nil {
		e.t.Fatal(err)
	}
	for _, m := range msgs[:stored] {
		if _, err := tp.Publish(ctx, m).Get(ctx); err != nil {
			e.t.Fatal(err)
		}
	}
	alive()
	nc.Close() // the crash: no more publishes, nothing settled, no presence
}

// A broker that dies between reserving orders and storing their messages
// leaves a write-ahead record; another broker's recovery publishes what
// is missing, in order, and the orders have no hole. While the owner
// runs, its record is left alone.
func TestStampCrashBeforeStoreIsReplayed(t *testing.T) {
	e := newStampEnv(t)
	ctx := context.Background()
	b := e2broker(t, e.srv)
	msgs := []*adapter.Message{stampMsg(plaintext("m1", "did:ex:alice", "")), stampMsg(plaintext("m2", "did:ex:alice", ""))}
	e.crashAfterReserve(0, msgs, func() {
		if n, err := b.RecoverStamps(ctx); err != nil || n != 0 {
			t.Fatalf("RecoverStamps while the owner runs = %d, %v; want 0", n, err)
		}
		if got := e.orders(); len(got) != 0 {
			t.Fatalf("stored orders %v while the owner runs, want none", got)
		}
	})
	if n, err := b.RecoverStamps(ctx); err != nil || n != 1 {
		t.Fatalf("RecoverStamps after the crash = %d, %v; want 1", n, err)
	}
	if n, err := b.RecoverStamps(ctx); err != nil || n != 0 {
		t.Fatalf("RecoverStamps again = %d, %v; want 0 (settled)", n, err)
	}
	if _, err := b.Publish(ctx, stampProject, e.topic, []*adapter.Message{stampMsg(plaintext("m3", "did:ex:alice", ""))}); err != nil {
		t.Fatal(err)
	}
	if got := e.orders(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("stored orders %v, want [1 2 3]", got)
	}
}

// A broker that dies after storing part of a request: the sender's next
// request, through another broker, first publishes what is missing, so
// its own messages follow, and stores nothing twice.
func TestStampCrashMidRequestIsReplayedBeforeTheNext(t *testing.T) {
	e := newStampEnv(t)
	ctx := context.Background()
	var msgs []*adapter.Message
	for _, id := range []string{"m1", "m2", "m3"} {
		m := stampMsg(plaintext(id, "did:ex:alice", ""))
		m.OrderingKey = "k"
		msgs = append(msgs, m)
	}
	e.crashAfterReserve(1, msgs, func() {})
	b := e2broker(t, e.srv)
	next := stampMsg(plaintext("m4", "did:ex:alice", ""))
	next.OrderingKey = "k"
	if _, err := b.Publish(ctx, stampProject, e.topic, []*adapter.Message{next}); err != nil {
		t.Fatal(err)
	}
	if got := e.orders(); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Fatalf("stored orders %v, want [1 2 3 4]", got)
	}
	if n, err := b.RecoverStamps(ctx); err != nil || n != 0 {
		t.Fatalf("RecoverStamps = %d, %v; want 0 (replayed and settled by the request)", n, err)
	}
}
