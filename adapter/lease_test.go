package adapter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The discovery lease, driven with a stepped clock and a store whose
// answers the test chooses.

// fakeLeaseStore is one KV key with revisions, as JetStream's KV answers
// Create (fails if the key exists), Update (fails unless the revision is
// the latest) and Delete.
type fakeLeaseStore struct {
	value   string
	rev     uint64
	exists  bool
	fail    error // every call fails with it, if set
	deletes int
}

func (f *fakeLeaseStore) Create(_ context.Context, _ string, v []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	if f.fail != nil {
		return 0, f.fail
	}
	if f.exists {
		return 0, jetstream.ErrKeyExists
	}
	f.rev++
	f.value, f.exists = string(v), true
	return f.rev, nil
}

func (f *fakeLeaseStore) Update(_ context.Context, _ string, v []byte, rev uint64) (uint64, error) {
	if f.fail != nil {
		return 0, f.fail
	}
	if !f.exists || rev != f.rev {
		return 0, errors.New("wrong last sequence")
	}
	f.rev++
	f.value = string(v)
	return f.rev, nil
}

func (f *fakeLeaseStore) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error {
	f.deletes++
	f.exists = false
	return f.fail
}

func (f *fakeLeaseStore) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	if !f.exists {
		return nil, jetstream.ErrKeyNotFound
	}
	return fakeEntry{value: f.value, rev: f.rev}, nil
}

// fakeEntry is a KV entry with a value and a revision.
type fakeEntry struct {
	jetstream.KeyValueEntry
	value string
	rev   uint64
}

func (e fakeEntry) Value() []byte    { return []byte(e.value) }
func (e fakeEntry) Revision() uint64 { return e.rev }

type leaseClock struct{ t time.Time }

func (c *leaseClock) now() time.Time       { return c.t }
func (c *leaseClock) step(d time.Duration) { c.t = c.t.Add(d) }
func newLeaseClock() *leaseClock           { return &leaseClock{t: t0} }
func testLease(kv leaseStore, c *leaseClock) *lease {
	l := newLease(kv, "k", "me", 8*time.Second, 10*time.Second, nil)
	l.now = c.now
	return l
}

func TestLeaseAcquire(t *testing.T) {
	storeDown := errors.New("store down")
	tests := []struct {
		name      string
		store     *fakeLeaseStore
		want      bool
		wantErr   error
		wantValid bool
	}{
		{"free", &fakeLeaseStore{}, true, nil, true},
		{"held by another", &fakeLeaseStore{exists: true, rev: 3, value: "other"}, false, nil, false},
		{"store fails", &fakeLeaseStore{fail: storeDown}, false, storeDown, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newLeaseClock()
			l := testLease(tt.store, c)
			got, err := l.acquire(context.Background(), nil)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Fatalf("acquire = %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
			if l.valid() != tt.wantValid {
				t.Fatalf("valid = %v, want %v", l.valid(), tt.wantValid)
			}
		})
	}
}

func TestLeaseTakeOverFromGoneHolder(t *testing.T) {
	goneHolder := func(holder string) bool { return holder == "gone" }
	tests := []struct {
		name      string
		store     *fakeLeaseStore
		gone      func(string) bool
		want      bool
		wantValue string
	}{
		{"holder gone", &fakeLeaseStore{exists: true, rev: 3, value: "gone"}, goneHolder, true, "me"},
		{"holder there", &fakeLeaseStore{exists: true, rev: 3, value: "alive"}, goneHolder, false, "alive"},
		{"no presence check", &fakeLeaseStore{exists: true, rev: 3, value: "gone"}, nil, false, "gone"},
		// Its release never reached the server: nobody took it since.
		{"still mine", &fakeLeaseStore{exists: true, rev: 3, value: "me"}, nil, true, "me"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLease(tt.store, newLeaseClock())
			got, err := l.acquire(context.Background(), tt.gone)
			if got != tt.want || err != nil {
				t.Fatalf("acquire = %v, %v; want %v", got, err, tt.want)
			}
			if tt.store.value != tt.wantValue || l.valid() != tt.want {
				t.Fatalf("lease value %q, valid %v; want %q, %v", tt.store.value, l.valid(), tt.wantValue, tt.want)
			}
		})
	}
	t.Run("two takers, one wins", func(t *testing.T) {
		kv := &fakeLeaseStore{exists: true, rev: 3, value: "gone"}
		// The second taker read the record before the first wrote it.
		racing := &racingStore{fakeLeaseStore: kv}
		a, b := testLease(kv, newLeaseClock()), testLease(racing, newLeaseClock())
		b.id = "other"
		racing.beforeUpdate = func() {
			if ok, _ := a.acquire(context.Background(), goneHolder); !ok {
				t.Error("first taker did not take the lease")
			}
		}
		if ok, _ := b.acquire(context.Background(), goneHolder); ok {
			t.Fatal("both takers hold the lease")
		}
		if kv.value != "me" {
			t.Fatalf("lease value %q, want the first taker's", kv.value)
		}
	})
}

// racingStore runs beforeUpdate just before its first Update.
type racingStore struct {
	*fakeLeaseStore
	beforeUpdate func()
}

func (r *racingStore) Update(ctx context.Context, key string, v []byte, rev uint64) (uint64, error) {
	if f := r.beforeUpdate; f != nil {
		r.beforeUpdate = nil
		f()
	}
	return r.fakeLeaseStore.Update(ctx, key, v, rev)
}

func TestLeaseInvalidAfterReconnect(t *testing.T) {
	// A holder whose connection came back may have been taken for gone:
	// it acts again only after a renewal sent since succeeds.
	c := newLeaseClock()
	kv := &fakeLeaseStore{}
	var reconnects uint64
	l := testLease(kv, c)
	l.reconnects = func() uint64 { return reconnects }
	l.acquire(context.Background(), nil)
	reconnects++
	if l.valid() {
		t.Fatal("valid after a reconnect")
	}
	if _, _, err := l.opContext(context.Background()); !errors.Is(err, errLeaseLost) {
		t.Fatalf("opContext after a reconnect: %v, want errLeaseLost", err)
	}
	if err := l.renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !l.valid() {
		t.Fatal("invalid after a renewal sent since the reconnect")
	}
	// Taken over meanwhile: the renewal fails and the lease stays invalid.
	reconnects++
	kv.rev++
	if err := l.renew(context.Background()); !errors.Is(err, errLeaseLost) {
		t.Fatalf("renew over a take-over: %v, want errLeaseLost", err)
	}
	if l.valid() {
		t.Fatal("valid after a reconnect and a failed renewal")
	}
}

func TestLeaseValidForHalfATTL(t *testing.T) {
	// The holder acts for half a TTL after its last renewal was sent, so
	// every action of a holder that stopped renewing has ended before the
	// bucket's TTL lets another in.
	c := newLeaseClock()
	l := testLease(&fakeLeaseStore{}, c)
	if ok, err := l.acquire(context.Background(), nil); !ok || err != nil {
		t.Fatalf("acquire = %v, %v", ok, err)
	}
	c.step(4*time.Second - time.Nanosecond)
	if !l.valid() {
		t.Fatal("invalid before half a TTL")
	}
	c.step(time.Nanosecond)
	if l.valid() {
		t.Fatal("still valid at half a TTL")
	}
	if _, _, err := l.opContext(context.Background()); !errors.Is(err, errLeaseLost) {
		t.Fatalf("opContext after expiry: %v, want errLeaseLost", err)
	}
}

func TestLeaseRenew(t *testing.T) {
	t.Run("extends from the renewal", func(t *testing.T) {
		c := newLeaseClock()
		kv := &fakeLeaseStore{}
		l := testLease(kv, c)
		l.acquire(context.Background(), nil)
		c.step(3 * time.Second)
		if err := l.renew(context.Background()); err != nil {
			t.Fatal(err)
		}
		c.step(4*time.Second - time.Nanosecond)
		if !l.valid() {
			t.Fatal("renewal did not extend the lease to half a TTL after it")
		}
		c.step(time.Nanosecond)
		if l.valid() {
			t.Fatal("renewal extended the lease past half a TTL after it")
		}
	})
	t.Run("another writer takes it", func(t *testing.T) {
		c := newLeaseClock()
		kv := &fakeLeaseStore{}
		l := testLease(kv, c)
		l.acquire(context.Background(), nil)
		kv.rev++ // someone else wrote the key (it expired and was taken)
		c.step(3 * time.Second)
		if err := l.renew(context.Background()); !errors.Is(err, errLeaseLost) {
			t.Fatalf("renew over another's write: %v, want errLeaseLost", err)
		}
		c.step(time.Second) // half a TTL after the acquire
		if l.valid() {
			t.Fatal("a failed renewal extended the lease")
		}
	})
	t.Run("renewals chain revisions", func(t *testing.T) {
		c := newLeaseClock()
		kv := &fakeLeaseStore{}
		l := testLease(kv, c)
		l.acquire(context.Background(), nil)
		for i := range 3 {
			c.step(2 * time.Second)
			if err := l.renew(context.Background()); err != nil {
				t.Fatalf("renewal %d: %v", i, err)
			}
		}
	})
}

func TestLeaseOpContextEndsWithTheLease(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		elapsed time.Duration
		want    time.Duration // deadline after t0
	}{
		{"the lease ends first", 10 * time.Second, 0, 4 * time.Second},
		{"the lease ends first, later", 10 * time.Second, 3 * time.Second, 4 * time.Second},
		{"the timeout ends first", time.Second, 2 * time.Second, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newLeaseClock()
			l := testLease(&fakeLeaseStore{}, c)
			l.timeout = tt.timeout
			l.acquire(context.Background(), nil)
			c.step(tt.elapsed)
			ctx, cancel, err := l.opContext(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer cancel()
			if d, _ := ctx.Deadline(); !d.Equal(t0.Add(tt.want)) {
				t.Fatalf("deadline %v after t0, want %v", d.Sub(t0), tt.want)
			}
		})
	}
}

func TestLeaseRelease(t *testing.T) {
	c := newLeaseClock()
	kv := &fakeLeaseStore{}
	l := testLease(kv, c)
	l.acquire(context.Background(), nil)
	l.release()
	if l.valid() || kv.deletes != 1 || kv.exists {
		t.Fatalf("after release: valid %v, deletes %d, key exists %v", l.valid(), kv.deletes, kv.exists)
	}
	// Another process takes it at once, without waiting for the TTL.
	other := testLease(kv, c)
	if ok, _ := other.acquire(context.Background(), nil); !ok {
		t.Fatal("released lease not free")
	}
}
