package didcomm

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
)

func TestCounterValueRoundTrip(t *testing.T) {
	pending := []Pending{{First: 3, N: 2, Record: []byte(`{"a":1}`)}, {First: 5, N: 1, Record: []byte("x y")}}
	v := formatCounter(5, pending)
	if want := "5\n3 2 {\"a\":1}\n5 1 x y"; string(v) != want {
		t.Fatalf("formatCounter = %q, want %q", v, want)
	}
	last, got, err := parseCounter(v)
	if err != nil || last != 5 || len(got) != 2 || got[0].First != 3 || got[0].N != 2 || string(got[0].Record) != `{"a":1}` || string(got[1].Record) != "x y" {
		t.Fatalf("parseCounter(%q) = %d, %+v, %v", v, last, got, err)
	}
	for _, bad := range []string{"5\n", "5\n3 2", "5\n0 1 r", "5\nx 1 r", "5\n3 0 r", "05", "5\n3 -1 r"} {
		if _, _, err := parseCounter([]byte(bad)); err == nil {
			t.Errorf("parseCounter(%q) succeeded", bad)
		}
	}
}

// A reservation written ahead keeps its record, and the index names its
// counter, until Settle; a later reserver sees it as earlier; a plain
// Reserve and GiveBack keep it.
func TestKVSequencerWriteAhead(t *testing.T) {
	ctx := context.Background()
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ORDERS"})
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "PENDING"})
	if err != nil {
		t.Fatal(err)
	}
	a, b := NewKVSequencer(kv, "p"), NewKVSequencer(kv, "p")
	a.IndexPending(index)
	b.IndexPending(index)
	key := a.Key("t", "s")

	first, earlier, err := a.ReserveWith(ctx, "t", "s", 2, func(first uint64) ([]byte, error) { return fmt.Appendf(nil, "rec-%d", first), nil })
	if err != nil || first != 1 || len(earlier) != 0 {
		t.Fatalf("ReserveWith = %d, %v, %v; want 1, none", first, earlier, err)
	}
	if keys, err := b.PendingCounters(ctx); err != nil || !slices.Equal(keys, []string{key}) {
		t.Fatalf("PendingCounters = %v, %v; want [%s]", keys, err, key)
	}
	if got := reserve(t, b, "t", "s", 1); got != 3 { // a plain reservation keeps the record
		t.Fatalf("Reserve after = %d, want 3", got)
	}
	first, earlier, err = b.ReserveWith(ctx, "t", "s", 1, func(first uint64) ([]byte, error) { return fmt.Appendf(nil, "rec-%d", first), nil })
	if err != nil || first != 4 || len(earlier) != 1 || earlier[0].First != 1 || earlier[0].N != 2 || string(earlier[0].Record) != "rec-1" {
		t.Fatalf("second ReserveWith = %d, %+v, %v; want 4 after rec-1", first, earlier, err)
	}
	if ok, err := b.GiveBack(ctx, "t", "s", 4, 1); !ok || err != nil {
		t.Fatalf("GiveBack = %v, %v", ok, err)
	}
	last, pending, err := a.PendingAt(ctx, key)
	if err != nil || last != 3 || len(pending) != 2 || string(pending[1].Record) != "rec-4" {
		t.Fatalf("PendingAt = %d, %+v, %v; want 3 with rec-1 and rec-4", last, pending, err)
	}
	for _, f := range []uint64{1, 4, 4} { // settling twice does nothing
		if err := a.Settle(ctx, key, f); err != nil {
			t.Fatalf("Settle(%d): %v", f, err)
		}
	}
	if last, pending, err := b.PendingAt(ctx, key); err != nil || last != 3 || len(pending) != 0 {
		t.Fatalf("PendingAt after settling = %d, %+v, %v; want 3, none", last, pending, err)
	}
	if keys, err := b.PendingCounters(ctx); err != nil || len(keys) != 0 {
		t.Fatalf("PendingCounters after settling = %v, %v; want none", keys, err)
	}
	if _, _, err := a.ReserveWith(ctx, "t", "s", 1, func(uint64) ([]byte, error) { return []byte("two\nlines"), nil }); err == nil {
		t.Fatal("a record of two lines was taken")
	}
	if got := reserve(t, a, "t", "s", 1); got != 4 {
		t.Fatalf("Reserve after a refused record = %d, want 4 (nothing taken)", got)
	}
}
