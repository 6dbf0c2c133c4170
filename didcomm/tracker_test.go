package didcomm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

func newTracker(t *testing.T, opts ...Option) *Tracker {
	t.Helper()
	tr, err := NewTracker(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func msg(thread, from string, order uint64) Headers {
	return Headers{ID: fmt.Sprintf("%s/%s/%d", thread, from, order), Thread: thread, From: from, SenderOrder: order}
}

func observe(t *testing.T, tr *Tracker, h Headers, pos uint64) Observation {
	t.Helper()
	obs, err := tr.Observe(context.Background(), h, pos)
	if err != nil {
		t.Fatalf("Observe(%+v): %v", h, err)
	}
	return obs
}

func kinds(obs Observation) []EventKind {
	var out []EventKind
	for _, e := range obs.Events {
		out = append(out, e.Kind)
	}
	return out
}

func renderOrders(t *testing.T, tr *Tracker, thread string) string {
	t.Helper()
	ros, err := tr.ReceivedOrders(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ros)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The example of the specification: the auctioneer saw bids 1 and 2 from
// Bob and bids 1 and 4 from Alice.
func TestSpecificationExample(t *testing.T) {
	tr := newTracker(t)
	for _, h := range []Headers{msg("auction", "did:ex:bob", 1), msg("auction", "did:ex:bob", 2), msg("auction", "did:ex:alice", 1), msg("auction", "did:ex:alice", 4)} {
		observe(t, tr, h, 0)
	}
	want := `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[2,3]}]`
	if got := renderOrders(t, tr, "auction"); got != want {
		t.Fatalf("received_orders\n got %s\nwant %s", got, want)
	}
	// The header the auctioneer would send parses back to the same view.
	ros, err := ParseReceivedOrders([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	if len(ros) != 2 || ros[1].ID != "did:ex:alice" || ros[1].Last != 4 || !slices.Equal(ros[1].Gaps, []uint64{2, 3}) {
		t.Fatalf("parsed %+v", ros)
	}
}

// Each observation carries the thread's received_orders as it stands with
// the message, and open gaps count the orders missing.
func TestObservationCarriesReceivedOrders(t *testing.T) {
	tr := newTracker(t)
	observe(t, tr, msg("t", "a", 1), 0)
	obs := observe(t, tr, msg("t", "a", 4), 0)
	if b, _ := json.Marshal(obs.ReceivedOrders); string(b) != `[{"id":"a","last":4,"gaps":[2,3]}]` {
		t.Fatalf("after 4: %s", b)
	}
	if n := tr.OpenGaps(); n != 2 {
		t.Fatalf("open gaps %d, want 2", n)
	}
	obs = observe(t, tr, msg("t", "a", 3), 0)
	if b, _ := json.Marshal(obs.ReceivedOrders); string(b) != `[{"id":"a","last":4,"gaps":[2]}]` {
		t.Fatalf("after 3: %s", b)
	}
	if obs = observe(t, tr, msg("t", "a", 3), 0); !obs.Duplicate || obs.ReceivedOrders != nil {
		t.Fatalf("copy of 3: %+v", obs)
	}
	if n := tr.OpenGaps(); n != 1 {
		t.Fatalf("open gaps %d, want 1", n)
	}
}

func TestGapOpenedAndFilled(t *testing.T) {
	tr := newTracker(t)
	if obs := observe(t, tr, msg("t", "a", 1), 0); len(obs.Events) != 0 || obs.Duplicate {
		t.Fatalf("first message: %+v", obs)
	}
	obs := observe(t, tr, msg("t", "a", 5), 0)
	if !slices.Equal(kinds(obs), []EventKind{GapOpened, OutOfOrder}) || obs.Events[0].Gap != (Range{2, 4}) {
		t.Fatalf("early message: %+v", obs)
	}
	obs = observe(t, tr, msg("t", "a", 3), 0)
	if !slices.Equal(kinds(obs), []EventKind{GapFilled, OutOfOrder}) || obs.Events[0].Gap != (Range{3, 3}) {
		t.Fatalf("late message: %+v", obs)
	}
	if got, want := renderOrders(t, tr, "t"), `[{"id":"a","last":5,"gaps":[2,4]}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	observe(t, tr, msg("t", "a", 2), 0)
	observe(t, tr, msg("t", "a", 4), 0)
	if got, want := renderOrders(t, tr, "t"), `[{"id":"a","last":5,"gaps":[]}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	// A sender whose first message is not 1 has a gap from 1.
	obs = observe(t, tr, msg("t", "b", 3), 0)
	if obs.Events[0].Kind != GapOpened || obs.Events[0].Gap != (Range{1, 2}) {
		t.Fatalf("first message at 3: %+v", obs)
	}
}

func TestResendsAreDroppedWhateverTheirSentCount(t *testing.T) {
	var hooked []Event
	tr := newTracker(t, WithEventHook(func(e Event) { hooked = append(hooked, e) }))
	h := msg("t", "a", 1)
	observe(t, tr, h, 0)
	for n := uint64(2); n <= 5; n++ {
		h.Resend()
		if h.SentCount != n {
			t.Fatalf("after resend %d sent_count is %d", n-1, h.SentCount)
		}
		obs := observe(t, tr, h, 0)
		if !obs.Duplicate || obs.Events[0].Kind != Duplicate || obs.Events[0].SentCount != n {
			t.Fatalf("resend with sent_count %d: %+v", n, obs)
		}
	}
	// A resend that arrives before the first copy is the one kept.
	late := msg("t", "a", 2)
	late.SentCount = 2
	if obs := observe(t, tr, late, 0); obs.Duplicate {
		t.Fatal("first copy to arrive dropped as a duplicate")
	}
	if obs := observe(t, tr, msg("t", "a", 2), 0); !obs.Duplicate {
		t.Fatal("original arriving after its resend was not dropped")
	}
	if len(hooked) != 5 {
		t.Fatalf("hook saw %d events, want 5 duplicates", len(hooked))
	}
}

func TestRedeliveryOfTheClaimedCopyIsNotADuplicate(t *testing.T) {
	tr := newTracker(t)
	ctx := context.Background()
	h := msg("t", "a", 1)
	observe(t, tr, h, 10)
	if obs := observe(t, tr, h, 10); obs.Duplicate || !obs.Redelivery {
		t.Fatalf("redelivery of the same copy: %+v", obs)
	}
	if obs := observe(t, tr, h, 11); !obs.Duplicate {
		t.Fatalf("another copy at another position: %+v", obs)
	}
	if err := tr.Release(ctx, h, 10); err != nil {
		t.Fatal(err)
	}
	if obs := observe(t, tr, h, 10); !obs.Duplicate {
		t.Fatalf("the same copy after it was acked: %+v", obs)
	}
}

func TestHugeJumpCostsOneRange(t *testing.T) {
	tr := newTracker(t)
	observe(t, tr, msg("t", "a", 3), 0)
	obs := observe(t, tr, msg("t", "a", 1_000_000_000_000), 0)
	if obs.Events[0].Gap != (Range{4, 999_999_999_999}) {
		t.Fatalf("gap %+v", obs.Events[0].Gap)
	}
	e := tr.entry("t")
	if n := len(e.st.Senders["a"].Gaps); n != 2 {
		t.Fatalf("%d gap ranges, want 2", n)
	}
	ros, err := tr.ReceivedOrders(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	ro := ros[0]
	if len(ro.Gaps) != DefaultMaxRenderedGaps || ro.Gaps[0] != 1 || ro.Gaps[2] != 4 || ro.GapsOmitted != 2+999_999_999_996-uint64(DefaultMaxRenderedGaps) {
		t.Fatalf("rendered %d gaps from %v, omitted %d", len(ro.Gaps), ro.Gaps[:3], ro.GapsOmitted)
	}
	// The largest order there is.
	observe(t, tr, msg("t", "b", ^uint64(0)), 0)
	if obs := observe(t, tr, msg("t", "b", ^uint64(0)), 0); !obs.Duplicate {
		t.Fatal("copy of the largest order not dropped")
	}
}

func TestGapRangesAreBounded(t *testing.T) {
	tr := newTracker(t, WithMaxGapRanges(3))
	var abandoned []Range
	for order := uint64(2); order <= 12; order += 2 { // 2, 4, ..., 12: gaps 1, 3, 5, ...
		for _, e := range observe(t, tr, msg("t", "a", order), 0).Events {
			if e.Kind == GapAbandoned {
				abandoned = append(abandoned, e.Gap)
			}
		}
	}
	if !slices.Equal(abandoned, []Range{{1, 1}, {3, 3}, {5, 5}}) {
		t.Fatalf("abandoned %v", abandoned)
	}
	if got, want := renderOrders(t, tr, "t"), `[{"id":"a","last":12,"gaps":[7,9,11]}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	// A late message in an abandoned gap is handed over, flagged.
	obs := observe(t, tr, msg("t", "a", 3), 0)
	if obs.Duplicate || !slices.Equal(kinds(obs), []EventKind{OutOfOrder}) {
		t.Fatalf("late message below the floor: %+v", obs)
	}
}

func TestThreadsAreBounded(t *testing.T) {
	tr := newTracker(t, WithMaxThreads(100))
	for i := range 1000 {
		observe(t, tr, msg(fmt.Sprint("thread-", i), "a", 1), 0)
	}
	if n := tr.Threads(); n != 100 {
		t.Fatalf("%d threads in memory, want 100", n)
	}
	// The most recent are kept.
	if obs := observe(t, tr, msg("thread-999", "a", 1), 0); !obs.Duplicate {
		t.Fatal("most recent thread forgotten")
	}
}

func TestTrackerErrors(t *testing.T) {
	tr := newTracker(t, WithMaxSendersPerThread(2))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		h    Headers
		want error
	}{
		{"no sender_order", Headers{ID: "m", From: "a"}, ErrNotSequenced},
		{"no id", Headers{From: "a", SenderOrder: 1}, ErrMissingID},
		{"no from", Headers{ID: "m", SenderOrder: 1}, ErrMissingSender},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tr.Observe(ctx, tc.h, 0); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	observe(t, tr, msg("t", "a", 1), 0)
	observe(t, tr, msg("t", "b", 1), 0)
	if _, err := tr.Observe(ctx, msg("t", "c", 1), 0); !errors.Is(err, ErrTooManySenders) {
		t.Fatalf("third sender: %v", err)
	}
	if got, want := renderOrders(t, tr, "t"), `[{"id":"a","last":1,"gaps":[]},{"id":"b","last":1,"gaps":[]}]`; got != want {
		t.Fatalf("a refused sender changed the state: %s", got)
	}
	if _, err := NewTracker(WithMaxThreads(0)); err == nil {
		t.Fatal("max threads 0 accepted")
	}
}

// A message without thid is its own thread.
func TestMessageWithoutThidIsItsOwnThread(t *testing.T) {
	tr := newTracker(t)
	h := Headers{ID: "m-1", From: "a", SenderOrder: 1}
	observe(t, tr, h, 0)
	if got, want := renderOrders(t, tr, "m-1"), `[{"id":"a","last":1,"gaps":[]}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

// Many goroutines over many threads and senders, each sender's messages
// shuffled and resent: every order is handed over exactly once and every
// thread ends without gaps.
func TestConcurrentThreadsAndSenders(t *testing.T) {
	tr := newTracker(t)
	const threads, senders, orders = 20, 5, 50
	var (
		mu     sync.Mutex
		passed = make(map[string]int)
		wg     sync.WaitGroup
		errs   = make(chan error, threads*senders)
	)
	for th := range threads {
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				thread, sender := fmt.Sprint("th-", th), fmt.Sprint("s-", s)
				// Evens first, then odds, each twice.
				var seq []uint64
				for o := uint64(2); o <= orders; o += 2 {
					seq = append(seq, o, o)
				}
				for o := uint64(1); o <= orders; o += 2 {
					seq = append(seq, o, o)
				}
				for _, o := range seq {
					obs, err := tr.Observe(context.Background(), msg(thread, sender, o), 0)
					if err != nil {
						errs <- err
						return
					}
					if !obs.Duplicate {
						mu.Lock()
						passed[fmt.Sprint(thread, sender, o)]++
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(passed) != threads*senders*orders {
		t.Fatalf("%d distinct messages handed over, want %d", len(passed), threads*senders*orders)
	}
	for k, n := range passed {
		if n != 1 {
			t.Fatalf("%s handed over %d times", k, n)
		}
	}
	for th := range threads {
		ros, err := tr.ReceivedOrders(context.Background(), fmt.Sprint("th-", th))
		if err != nil {
			t.Fatal(err)
		}
		for _, ro := range ros {
			if ro.Last != orders || len(ro.Gaps) != 0 {
				t.Fatalf("thread %d: %+v", th, ro)
			}
		}
	}
}

// memStore is a Store in a map, with revisions, for the tracker's own
// tests; the KV store is tested against a real server in integration/.
type memStore struct {
	mu    sync.Mutex
	state map[string][]byte
	rev   map[string]uint64
	next  uint64
	saves int
}

func newMemStore() *memStore {
	return &memStore{state: map[string][]byte{}, rev: map[string]uint64{}}
}

func (m *memStore) Load(_ context.Context, thread string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state[thread], m.rev[thread], nil
}

func (m *memStore) Save(_ context.Context, thread string, state []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rev[thread] != rev {
		return 0, ErrStateConflict
	}
	m.next++
	m.state[thread], m.rev[thread] = slices.Clone(state), m.next
	m.saves++
	return m.next, nil
}

func (m *memStore) Delete(_ context.Context, thread string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.state, thread)
	delete(m.rev, thread)
	return nil
}

// Two trackers on one store: what one saw, the other drops; a release is
// saved with the thread's next change.
func TestTrackersShareAStore(t *testing.T) {
	store := newMemStore()
	a, b := newTracker(t, WithStore(store)), newTracker(t, WithStore(store))
	ctx := context.Background()
	observe(t, a, msg("t", "s", 1), 10)
	if obs := observe(t, b, msg("t", "s", 1), 11); !obs.Duplicate {
		t.Fatalf("b handed over a copy a saw: %+v", obs)
	}
	// b's view of the claim: the copy at 10 is still being handled.
	if obs := observe(t, b, msg("t", "s", 1), 10); !obs.Redelivery {
		t.Fatalf("redelivery of a's copy on b: %+v", obs)
	}
	saves := store.saves
	if err := a.Release(ctx, msg("t", "s", 1), 10); err != nil {
		t.Fatal(err)
	}
	if store.saves != saves {
		t.Fatal("Release saved at once")
	}
	// b changes the thread; a's next change conflicts, loads b's state,
	// applies its pending release again and saves both.
	observe(t, b, msg("t", "s", 2), 12)
	observe(t, a, msg("t", "s", 3), 13)
	if obs := observe(t, b, msg("t", "s", 1), 10); !obs.Duplicate {
		t.Fatalf("the acked copy at 10 after the release was saved: %+v", obs)
	}
	if got, want := renderOrders(t, b, "t"), `[{"id":"s","last":3,"gaps":[]}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	if err := a.Forget(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if got := renderOrders(t, b, "t"); got != "[]" {
		t.Fatalf("after Forget: %s", got)
	}
}

// More copies in flight than the thread's claim limit: the oldest claims
// are dropped, and their copies, nacked and coming back, are still handed
// over rather than lost as duplicates.
func TestEvictedClaimsNeverLoseACopy(t *testing.T) {
	tr := newTracker(t)
	for order := uint64(1); order <= maxClaims+10; order++ {
		observe(t, tr, msg("t", "s", order), order)
	}
	for order := uint64(1); order <= maxClaims+10; order++ {
		if obs := observe(t, tr, msg("t", "s", order), order); obs.Duplicate {
			t.Fatalf("redelivery of order %d dropped as a duplicate", order)
		}
	}
	// A resend published later (a higher position) is still a copy.
	if obs := observe(t, tr, msg("t", "s", 1), 10*maxClaims); !obs.Duplicate {
		t.Fatal("a resend was not dropped")
	}
}

// Another tracker forgets the thread: this one, with the old state in
// memory, does not drop the restarted thread's first message.
func TestForgetReachesTrackersWithTheThreadInMemory(t *testing.T) {
	store := newMemStore()
	a, b := newTracker(t, WithStore(store)), newTracker(t, WithStore(store))
	observe(t, a, msg("t", "s", 1), 1)
	observe(t, b, msg("t", "s", 2), 2)
	if err := a.Forget(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	if obs := observe(t, b, msg("t", "s", 1), 3); obs.Duplicate {
		t.Fatal("first message of the restarted thread dropped on stale state")
	}
}

// A thread whose state would pass MaxStateBytes gets ErrStateTooLarge and
// nothing is saved. (The budget is lowered here to keep the test quick.)
func TestStateTooLarge(t *testing.T) {
	store := newMemStore()
	tr := newTracker(t, WithStore(store), WithMaxGapRanges(10_000))
	tr.cfg.maxStateBytes = 2000
	var err error
	for order := uint64(2); err == nil && order < 10_000; order += 2 {
		_, err = tr.Observe(context.Background(), msg("t", "s", order), 0)
	}
	if !errors.Is(err, ErrStateTooLarge) {
		t.Fatalf("got %v", err)
	}
	if n := len(store.state["t"]); n > 2000 {
		t.Fatalf("saved %d bytes", n)
	}
}

// Within the default limits a thread's state stays below MaxStateBytes:
// 100 senders with long DIDs, each with 100 gaps of large orders, and the
// claim limit reached.
func TestDefaultLimitsFitMaxStateBytes(t *testing.T) {
	var st threadState
	lim := newTracker(t).limits()
	pos := uint64(0)
	for s := range DefaultMaxSendersPerThread {
		sender := fmt.Sprint("did:example:", strings.Repeat("x", 200), s)
		for i := range uint64(DefaultMaxGapRanges + 1) {
			pos++
			if _, _, _, err := st.observe(sender, 1_000_000_000_000+2*i, 1_000_000_000_000+pos, lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	data, _ := json.Marshal(&st)
	if len(data) > MaxStateBytes {
		t.Fatalf("state of %d bytes within the default limits, more than %d", len(data), MaxStateBytes)
	}
	t.Logf("largest state within the default limits: %d bytes", len(data))
}

func TestSequencerNeverWraps(t *testing.T) {
	seq := NewSequencer()
	if err := seq.Restore("t", "a", ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	h := Headers{ID: "m", Thread: "t", From: "a"}
	if err := seq.Stamp(&h); !errors.Is(err, ErrInvalidSenderOrder) {
		t.Fatalf("stamp after the largest order: %v, order %d", err, h.SenderOrder)
	}
	if err := seq.Restore("t", "a", 5); err == nil {
		t.Fatal("Restore went back")
	}
}
