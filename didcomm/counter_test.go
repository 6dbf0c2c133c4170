package didcomm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// counterBucket starts a server and returns a way to open the same bucket
// over as many connections as a test wants, as separate processes would.
func counterBucket(t *testing.T) func() jetstream.KeyValue {
	t.Helper()
	srv := testutil.Server(t)
	open := func() jetstream.KeyValue {
		t.Helper()
		js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "ORDERS"})
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	return open
}

func reserve(t *testing.T, s *KVSequencer, thread, sender string, n uint64) uint64 {
	t.Helper()
	first, err := s.Reserve(context.Background(), thread, sender, n)
	if err != nil {
		t.Fatalf("Reserve(%q, %q, %d): %v", thread, sender, n, err)
	}
	return first
}

func TestKVSequencerCountsPerThreadAndSender(t *testing.T) {
	open := counterBucket(t)
	kv := open()
	s := NewKVSequencer(kv, "p")
	steps := []struct {
		thread, sender string
		n, want        uint64
	}{
		{"t1", "did:ex:alice", 1, 1},
		{"t1", "did:ex:alice", 3, 2},
		{"t1", "did:ex:bob", 1, 1},
		{"t2", "did:ex:alice", 2, 1},
		{"t1", "did:ex:alice", 1, 5},
	}
	for _, st := range steps {
		if got := reserve(t, s, st.thread, st.sender, st.n); got != st.want {
			t.Fatalf("Reserve(%q, %q, %d) = %d, want %d", st.thread, st.sender, st.n, got, st.want)
		}
	}
	// Another process (connection, sequencer) goes on from the bucket.
	other := NewKVSequencer(open(), "p")
	if got := reserve(t, other, "t1", "did:ex:alice", 1); got != 6 {
		t.Fatalf("second sequencer: got %d, want 6", got)
	}
	// Its stale hint does not make the first one repeat an order.
	if got := reserve(t, s, "t1", "did:ex:alice", 1); got != 7 {
		t.Fatalf("after another sequencer reserved: got %d, want 7", got)
	}
	if last, err := other.Last(context.Background(), "t1", "did:ex:alice"); err != nil || last != 7 {
		t.Fatalf("Last = %d, %v; want 7", last, err)
	}
	if last, err := s.Last(context.Background(), "t9", "did:ex:alice"); err != nil || last != 0 {
		t.Fatalf("Last of an unused counter = %d, %v; want 0", last, err)
	}
	// A prefix is a scope of its own.
	if got := reserve(t, NewKVSequencer(kv, "q"), "t1", "did:ex:alice", 1); got != 1 {
		t.Fatalf("other prefix: got %d, want 1", got)
	}

	// The key and value as docs/WIRE.md gives them.
	e, err := kv.Get(context.Background(), "p.t1.did_3Aex_3Aalice")
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Value()) != "7" {
		t.Fatalf("stored value %q, want \"7\"", e.Value())
	}
	long := strings.Repeat("thread.", 100)
	reserve(t, s, long, "did:ex:alice", 1)
	if _, err := kv.Get(context.Background(), "p."+keyrouter.KVToken(long)+".did_3Aex_3Aalice"); err != nil {
		t.Fatalf("long thread id: %v", err)
	}
	if !strings.HasPrefix(keyrouter.KVToken(long), "=") {
		t.Fatalf("expected a hashed token for a long thread, got %q", keyrouter.KVToken(long))
	}
}

func TestKVSequencerStamp(t *testing.T) {
	s := NewKVSequencer(counterBucket(t)(), "p")
	ctx := context.Background()
	h := Headers{ID: "m1", From: "did:ex:alice", SentCount: 3}
	if err := s.Stamp(ctx, &h); err != nil {
		t.Fatal(err)
	}
	if h.SenderOrder != 1 || h.SentCount != 0 {
		t.Fatalf("stamped %+v, want sender_order 1 and no sent_count", h)
	}
	// A message without thid is its own thread: m2 starts at 1 too.
	h2 := Headers{ID: "m2", From: "did:ex:alice"}
	h3 := Headers{ID: "m3", Thread: "m1", From: "did:ex:alice"}
	for _, h := range []*Headers{&h2, &h3} {
		if err := s.Stamp(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if h2.SenderOrder != 1 || h3.SenderOrder != 2 {
		t.Fatalf("orders %d (own thread) and %d (thread m1), want 1 and 2", h2.SenderOrder, h3.SenderOrder)
	}
	for _, tc := range []struct {
		name string
		h    Headers
		want error
	}{
		{"no id", Headers{From: "did:ex:alice"}, ErrMissingID},
		{"no from", Headers{ID: "m4"}, ErrMissingSender},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			if err := s.Stamp(ctx, &h); !errors.Is(err, tc.want) {
				t.Fatalf("Stamp: %v, want %v", err, tc.want)
			}
			if h.SenderOrder != 0 {
				t.Fatalf("stamped %d on error", h.SenderOrder)
			}
		})
	}
	if _, err := s.Reserve(ctx, "t", "did:ex:alice", 0); err == nil {
		t.Fatal("Reserve of 0 orders succeeded")
	}
}

func TestKVSequencerGiveBack(t *testing.T) {
	open := counterBucket(t)
	a, b := NewKVSequencer(open(), "p"), NewKVSequencer(open(), "p")
	ctx := context.Background()
	first := reserve(t, a, "t", "s", 3)
	if ok, err := a.GiveBack(ctx, "t", "s", first, 3); err != nil || !ok {
		t.Fatalf("GiveBack with nothing reserved after: %v, %v", ok, err)
	}
	if got := reserve(t, b, "t", "s", 2); got != 1 {
		t.Fatalf("after a give-back: got %d, want 1", got)
	}
	// b holds 1..2; a takes 3, b cannot give 1..2 back any more.
	if got := reserve(t, a, "t", "s", 1); got != 3 {
		t.Fatalf("got %d, want 3", got)
	}
	if ok, err := b.GiveBack(ctx, "t", "s", 1, 2); err != nil || ok {
		t.Fatalf("GiveBack with a reservation after: %v, %v; want false", ok, err)
	}
	if got := reserve(t, b, "t", "s", 1); got != 4 {
		t.Fatalf("after a refused give-back: got %d, want 4", got)
	}
	if _, err := a.GiveBack(ctx, "t", "s", 0, 1); err == nil {
		t.Fatal("GiveBack from order 0 succeeded")
	}
}

func TestKVSequencerRefusesWhatItCannotCount(t *testing.T) {
	kv := counterBucket(t)()
	s := NewKVSequencer(kv, "p")
	ctx := context.Background()
	if _, err := kv.Put(ctx, "p.t.s", []byte("not a number")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, "t", "s", 1); !errors.Is(err, ErrInvalidSenderOrder) {
		t.Fatalf("Reserve over a corrupt counter: %v, want ErrInvalidSenderOrder", err)
	}
	if e, err := kv.Get(ctx, "p.t.s"); err != nil || string(e.Value()) != "not a number" {
		t.Fatalf("the corrupt counter was overwritten: %q, %v", e.Value(), err)
	}
	if _, err := kv.Put(ctx, "p.t.s", []byte(strconv.FormatUint(math.MaxUint64-1, 10))); err != nil {
		t.Fatal(err)
	}
	if got := reserve(t, s, "t", "s", 1); got != math.MaxUint64 {
		t.Fatalf("got %d, want the largest order", got)
	}
	if _, err := s.Reserve(ctx, "t", "s", 1); !errors.Is(err, ErrInvalidSenderOrder) {
		t.Fatalf("Reserve past the largest order: %v, want ErrInvalidSenderOrder", err)
	}
	for _, tc := range []struct {
		name           string
		thread, sender string
		want           error
	}{
		{"no thread", "", "s", ErrMissingID},
		{"no sender", "t", "", ErrMissingSender},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Reserve(ctx, tc.thread, tc.sender, 1); !errors.Is(err, tc.want) {
				t.Fatalf("Reserve: %v, want %v", err, tc.want)
			}
		})
	}
}

// Reservers on several connections, several goroutines each, reserving
// runs of 1 to 3 orders: together they hold exactly 1..N, each order once.
func TestKVSequencerConcurrentReserversNoRepeatNoHole(t *testing.T) {
	open := counterBucket(t)
	const conns, perConn, reservations = 3, 4, 60
	type run struct{ first, n uint64 }
	runs := make(chan run, conns*perConn*reservations)
	errs := make(chan error, conns*perConn)
	var wg sync.WaitGroup
	for c := range conns {
		s := NewKVSequencer(open(), "p")
		for g := range perConn {
			wg.Go(func() {
				for i := range reservations {
					n := uint64((c+g+i)%3 + 1)
					first, err := s.Reserve(context.Background(), "thread", "did:ex:alice", n)
					if err != nil {
						errs <- fmt.Errorf("connection %d goroutine %d: %w", c, g, err)
						return
					}
					runs <- run{first, n}
				}
			})
		}
	}
	wg.Wait()
	close(runs)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var orders []uint64
	for r := range runs {
		for o := r.first; o < r.first+r.n; o++ {
			orders = append(orders, o)
		}
	}
	slices.Sort(orders)
	for i, o := range orders {
		if o != uint64(i+1) {
			t.Fatalf("orders are not exactly 1..%d: position %d holds %d (a repeat or a hole)", len(orders), i, o)
		}
	}
	last, err := NewKVSequencer(open(), "p").Last(context.Background(), "thread", "did:ex:alice")
	if err != nil || last != uint64(len(orders)) {
		t.Fatalf("Last = %d, %v; want %d", last, err, len(orders))
	}
}
