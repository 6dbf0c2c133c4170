package didcomm

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// EventKind says what a tracker noticed.
type EventKind int

const (
	// GapOpened: a message arrived ahead of orders not yet seen; Gap holds
	// the orders now missing.
	GapOpened EventKind = iota + 1
	// GapFilled: a message arrived late and filled the order in Gap.
	GapFilled
	// OutOfOrder: a message was not the next after the largest order seen
	// from its sender. It comes with GapOpened (early) or GapFilled (late),
	// or alone for a late message whose gap had been given up.
	OutOfOrder
	// Duplicate: a copy of a message already handed over was dropped.
	Duplicate
	// GapAbandoned: a sender had more than MaxGapRanges gaps; the lowest,
	// in Gap, is no longer tracked and no longer listed.
	GapAbandoned
)

var eventNames = [...]string{GapOpened: "gap opened", GapFilled: "gap filled", OutOfOrder: "out of order", Duplicate: "duplicate", GapAbandoned: "gap abandoned"}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is something a tracker noticed that the application can act on,
// for instance by asking the sender to resend a gap.
type Event struct {
	Kind EventKind
	// Thread, Sender, MessageID, Order and SentCount describe the message
	// observed.
	Thread, Sender, MessageID string
	Order, SentCount          uint64
	// Gap is the gap opened, filled or abandoned.
	Gap Range
}

// Observation is what a tracker decided about one message.
type Observation struct {
	// Duplicate: a copy of a message already handed over. Drop it.
	Duplicate bool
	// Redelivery: the same copy (same stream position) was handed over
	// before and not acked; it is not a duplicate.
	Redelivery bool
	// Events noticed on this message, in order.
	Events []Event
	// ReceivedOrders is the thread's received_orders as it stands with
	// this message, as saved (nil for a duplicate).
	ReceivedOrders []ReceivedOrder
}

// Defaults of the tracker's limits.
const (
	DefaultMaxThreads          = 100_000
	DefaultMaxGapRanges        = 100
	DefaultMaxRenderedGaps     = 100
	DefaultMaxSendersPerThread = 100
	// MaxStateBytes bounds one thread's saved state, below NATS's default
	// 1 MiB message size. Within the default limits a thread's state stays
	// below it (about 360 KiB with 200-byte sender ids).
	MaxStateBytes = 512 << 10
	// maxClaims bounds the unacked copies remembered per thread: as many as
	// a subscription's shared consumer lets out at once.
	maxClaims = 2048
	// maxConflicts bounds the retries of one update against a Store that
	// other trackers keep changing.
	maxConflicts = 32
)

type config struct {
	maxThreads, maxGapRanges, maxRenderedGaps, maxSenders int
	maxStateBytes                                         int
	store                                                 Store
	hook                                                  func(Event)
	logger                                                *slog.Logger
}

// Option configures a Tracker.
type Option func(*config) error

func positive(name string, n int, dst *int) error {
	if n < 1 {
		return fmt.Errorf("didcomm: %s must be at least 1, got %d", name, n)
	}
	*dst = n
	return nil
}

// WithMaxThreads bounds the threads held in memory (default 100,000); the
// least recently used are dropped beyond it. With a Store they are loaded
// again when needed; without one their history is lost, and a thread seen
// again starts afresh.
func WithMaxThreads(n int) Option {
	return func(c *config) error { return positive("max threads", n, &c.maxThreads) }
}

// WithMaxGapRanges bounds the gap ranges held per sender and thread
// (default 100). Beyond it the lowest gap is given up (a GapAbandoned
// event) and the sender's orders up to its end are no longer tracked: a
// message there, late or a copy of one already handed over, is handed over
// with an OutOfOrder event and no duplicate check. A sender that skips
// every other order reaches the limit after 100 gaps, so feed the tracker
// authenticated senders only.
func WithMaxGapRanges(n int) Option {
	return func(c *config) error { return positive("max gap ranges", n, &c.maxGapRanges) }
}

// WithMaxRenderedGaps bounds the orders listed in one received_orders
// entry's gaps (default 100); the rest are counted in gaps_omitted.
func WithMaxRenderedGaps(n int) Option {
	return func(c *config) error { return positive("max rendered gaps", n, &c.maxRenderedGaps) }
}

// WithMaxSendersPerThread bounds the senders tracked in one thread
// (default 100); a message from one more is an ErrTooManySenders error.
// With larger limits a thread's state can pass MaxStateBytes: its messages
// are then ErrStateTooLarge errors.
func WithMaxSendersPerThread(n int) Option {
	return func(c *config) error { return positive("max senders per thread", n, &c.maxSenders) }
}

// WithStore keeps the tracker's state in s, shared with every tracker
// using the same store, and surviving restarts.
func WithStore(s Store) Option {
	return func(c *config) error {
		if s == nil {
			return errors.New("didcomm: nil store")
		}
		c.store = s
		return nil
	}
}

// WithLogger gives Receive a logger for store failures (default: none).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l != nil {
			c.logger = l
		}
		return nil
	}
}

// WithEventHook calls f with every event, on the goroutine that observed
// the message, after the tracker's state is saved. f must not block long.
func WithEventHook(f func(Event)) Option {
	return func(c *config) error { c.hook = f; return nil }
}

// Tracker detects gaps, out-of-order arrivals and duplicates per thread and
// sender, as DIDComm Advanced Sequencing defines them. Feed it every
// delivered message. It is safe for concurrent use: messages of different
// threads are observed in parallel, those of one thread one at a time.
type Tracker struct {
	cfg     config
	boundTo string // the store prefix of OpenSubscriptionTracker's subscription

	mu      sync.Mutex
	threads map[string]*list.Element // of *threadEntry
	lru     list.List                // front: most recently used
}

// threadEntry holds one thread's state in memory.
type threadEntry struct {
	id string

	mu     sync.Mutex
	st     *threadState
	rev    uint64 // the store's revision of st
	loaded bool   // false: st is to be loaded from the store
	// released are claims released in memory and not yet saved: they are
	// saved with the thread's next change, and applied again to state
	// loaded meanwhile.
	released []claimRef
}

type claimRef struct {
	sender     string
	order, pos uint64
}

// NewTracker returns a tracker; without WithStore it keeps its state in
// memory only.
func NewTracker(opts ...Option) (*Tracker, error) {
	t := &Tracker{
		cfg: config{
			maxThreads:      DefaultMaxThreads,
			maxGapRanges:    DefaultMaxGapRanges,
			maxRenderedGaps: DefaultMaxRenderedGaps,
			maxSenders:      DefaultMaxSendersPerThread,
			maxStateBytes:   MaxStateBytes,
			logger:          slog.New(slog.DiscardHandler),
		},
		threads: make(map[string]*list.Element),
	}
	for _, o := range opts {
		if err := o(&t.cfg); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Threads is the number of threads held in memory.
func (t *Tracker) Threads() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.threads)
}

// OpenGaps counts the orders missing (gaps, as received_orders counts
// them, given-up ones excluded) in the threads held in memory, as this
// tracker last saw them.
func (t *Tracker) OpenGaps() uint64 {
	t.mu.Lock()
	entries := make([]*threadEntry, 0, len(t.threads))
	for _, el := range t.threads {
		entries = append(entries, el.Value.(*threadEntry))
	}
	t.mu.Unlock()
	var n uint64
	for _, e := range entries {
		e.mu.Lock()
		if e.st != nil {
			for _, s := range e.st.Senders {
				for _, g := range s.Gaps {
					n += g.Len()
				}
			}
		}
		e.mu.Unlock()
	}
	return n
}

func (t *Tracker) limits() limits {
	return limits{maxGapRanges: t.cfg.maxGapRanges, maxClaims: maxClaims, maxSenders: t.cfg.maxSenders}
}

// entry returns the thread's entry, making it the most recently used and
// dropping the least recently used beyond MaxThreads.
func (t *Tracker) entry(thread string) *threadEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.threads[thread]; ok {
		t.lru.MoveToFront(el)
		return el.Value.(*threadEntry)
	}
	e := &threadEntry{id: thread}
	t.threads[thread] = t.lru.PushFront(e)
	for len(t.threads) > t.cfg.maxThreads {
		last := t.lru.Back()
		t.lru.Remove(last)
		delete(t.threads, last.Value.(*threadEntry).id)
	}
	return e
}

// Observe records a delivered message and says whether it is a duplicate,
// and what it revealed. pos is the message's position in its stream
// (adapter.Message.StreamSequence), or 0 when there is none: with a
// position, a redelivery of a copy handed over and not yet released is not
// a duplicate. It returns a header error (ErrNotSequenced, ErrMissingID,
// ErrMissingSender), ErrTooManySenders, ErrStateTooLarge, or the store's
// error; the state is unchanged then. Events are reported once, when the
// message is first handed over, not on its redeliveries.
func (t *Tracker) Observe(ctx context.Context, h Headers, pos uint64) (Observation, error) {
	if err := h.validate(); err != nil {
		return Observation{}, err
	}
	thread := h.ThreadID()
	e := t.entry(thread)
	var (
		v         verdict
		opened    Range
		abandoned []Range
		ros       []ReceivedOrder
	)
	err := t.update(ctx, e, func(st *threadState, fresh bool) (changed bool, err error) {
		v, opened, abandoned, err = st.observe(h.From, h.SenderOrder, pos, t.limits())
		if (v == redelivery || v == duplicate) && !fresh && t.cfg.store != nil {
			// Dropping a message, or handing it over again, on the word
			// of state in memory: another tracker may have released the
			// claim, or forgotten the thread. Check the saved state.
			return false, errStale
		}
		if err == nil && v != duplicate {
			ros = st.receivedOrders(t.cfg.maxRenderedGaps)
		}
		return err == nil && v != duplicate && v != redelivery && v != untracked, err
	})
	if err != nil {
		return Observation{}, err
	}
	ev := Event{Thread: thread, Sender: h.From, MessageID: h.ID, Order: h.SenderOrder, SentCount: max(h.SentCount, 1)}
	obs := Observation{ReceivedOrders: ros}
	add := func(k EventKind, gap Range) {
		ev.Kind, ev.Gap = k, gap
		obs.Events = append(obs.Events, ev)
	}
	switch v {
	case early:
		add(GapOpened, opened)
		add(OutOfOrder, Range{})
	case late:
		add(GapFilled, Range{First: h.SenderOrder, Last: h.SenderOrder})
		add(OutOfOrder, Range{})
	case untracked:
		add(OutOfOrder, Range{})
	case duplicate:
		obs.Duplicate = true
		add(Duplicate, Range{})
	case redelivery:
		obs.Redelivery = true
	}
	for _, g := range abandoned {
		add(GapAbandoned, g)
	}
	if t.cfg.hook != nil {
		for _, e := range obs.Events {
			t.cfg.hook(e)
		}
	}
	return obs, nil
}

// Release tells the tracker that the copy of h's message at stream
// position pos was acked: a later delivery of it is a duplicate. Receive
// calls it from Delivery.Ack. It does no I/O when the thread is in memory:
// the release is saved with the thread's next change. Until then, only a
// redelivery of this very copy (its ack lost) would be handed over again,
// which at-least-once delivery allows.
func (t *Tracker) Release(ctx context.Context, h Headers, pos uint64) error {
	if err := h.validate(); err != nil || pos == 0 {
		return err
	}
	e := t.entry(h.ThreadID())
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := t.load(ctx, e); err != nil {
		return err
	}
	if e.st.release(h.From, h.SenderOrder, pos) && t.cfg.store != nil {
		e.released = append(e.released, claimRef{h.From, h.SenderOrder, pos})
	}
	return nil
}

// ReceivedOrders returns the thread's received_orders: per sender, the
// largest order seen and the gaps below it. With a Store it reads the
// latest saved state, so it includes what other trackers saw.
func (t *Tracker) ReceivedOrders(ctx context.Context, thread string) ([]ReceivedOrder, error) {
	if thread == "" {
		return nil, fmt.Errorf("%w: empty thread id", ErrMissingID)
	}
	e := t.entry(thread)
	e.mu.Lock()
	defer e.mu.Unlock()
	if t.cfg.store != nil {
		e.loaded = false
	}
	if err := t.load(ctx, e); err != nil {
		return nil, err
	}
	return e.st.receivedOrders(t.cfg.maxRenderedGaps), nil
}

// Forget drops everything known about a finished thread, from memory and
// from the store: a later message of it starts the thread afresh, on every
// tracker sharing the store.
func (t *Tracker) Forget(ctx context.Context, thread string) error {
	t.mu.Lock()
	if el, ok := t.threads[thread]; ok {
		t.lru.Remove(el)
		delete(t.threads, thread)
	}
	t.mu.Unlock()
	if t.cfg.store == nil {
		return nil
	}
	return t.cfg.store.Delete(ctx, thread)
}

// load makes e's state current; e.mu must be held.
func (t *Tracker) load(ctx context.Context, e *threadEntry) error {
	if e.loaded {
		return nil
	}
	e.st, e.rev = &threadState{}, 0
	if t.cfg.store != nil {
		data, rev, err := t.cfg.store.Load(ctx, e.id)
		if err != nil {
			return fmt.Errorf("didcomm: load thread %q: %w", e.id, err)
		}
		if data != nil {
			if err := json.Unmarshal(data, e.st); err != nil {
				return fmt.Errorf("didcomm: thread %q: stored state is corrupt: %w", e.id, err)
			}
			e.st.countClaims()
		}
		e.rev = rev
		for _, r := range e.released {
			e.st.release(r.sender, r.order, r.pos)
		}
	}
	e.loaded = true
	return nil
}

// errStale asks update to load the state and apply f again.
var errStale = errors.New("didcomm: state in memory may be stale")

// update applies f to the thread's state and, when f changed it, saves it,
// loading and applying again when another tracker saved first or f asks
// for fresh state (errStale). f learns whether the state was just loaded.
// On any error the state in memory is dropped, to be loaded again.
func (t *Tracker) update(ctx context.Context, e *threadEntry, f func(st *threadState, fresh bool) (bool, error)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for attempt := 0; ; attempt++ {
		fresh := !e.loaded
		if err := t.load(ctx, e); err != nil {
			return err
		}
		changed, err := f(e.st, fresh)
		if errors.Is(err, errStale) {
			e.loaded = false
			continue
		}
		if err != nil || !changed || t.cfg.store == nil {
			return err
		}
		data, _ := json.Marshal(e.st)
		if len(data) > t.cfg.maxStateBytes {
			e.loaded = false
			return fmt.Errorf("%w: thread %q would take %d bytes", ErrStateTooLarge, e.id, len(data))
		}
		rev, err := t.cfg.store.Save(ctx, e.id, data, e.rev)
		if err == nil {
			e.rev, e.released = rev, nil
			return nil
		}
		e.loaded = false
		if !errors.Is(err, ErrStateConflict) {
			return fmt.Errorf("didcomm: save thread %q: %w", e.id, err)
		}
		if attempt >= maxConflicts {
			return fmt.Errorf("didcomm: save thread %q: %w %d times", e.id, err, attempt+1)
		}
	}
}
