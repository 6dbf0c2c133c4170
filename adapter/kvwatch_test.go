package adapter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
)

// A lasting watch whose watcher ended (as nats.go ends one it could not
// re-create) is renewed, and the new watcher reports every value there
// now: a key put while nobody watched, and not one deleted meanwhile.
func TestLastingWatchRenews(t *testing.T) {
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "W"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a.1", []byte("1")); err != nil {
		t.Fatal(err)
	}
	w, err := watchLasting(ctx, kv, "a.*")
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	if got := initialPuts(t, w); !slices.Equal(got, []string{"a.1"}) {
		t.Fatalf("initial values %v, want [a.1]", got)
	}

	_ = w.w.Stop() // as nats.go ends it
	select {
	case _, ok := <-w.updates():
		if ok {
			t.Fatal("an update after the watcher ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the updates did not end with the watcher")
	}
	if _, err := kv.Put(ctx, "a.2", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "a.1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var errs []error
	if !w.renew(done, func(err error) { errs = append(errs, err) }) {
		t.Fatal("renew gave up")
	}
	if got := initialPuts(t, w); !slices.Equal(got, []string{"a.2"}) {
		t.Fatalf("values after the renewal %v, want [a.2] (errors on the way: %v)", got, errs)
	}
	if _, err := kv.Put(ctx, "a.3", []byte("3")); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-w.updates():
		if e == nil || e.Key() != "a.3" {
			t.Fatalf("update %v, want a.3", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a put after the renewal not reported within 10 s")
	}

	// Ending: renew gives up once done is closed.
	w.stop()
	close(done)
	if w.renew(done, func(error) {}) {
		t.Fatal("renew watched again after done was closed")
	}
}

// initialPuts reads w's initial values up to its nil, and returns the keys
// put, sorted.
func initialPuts(t *testing.T, w *lastingWatch) []string {
	t.Helper()
	var keys []string
	for {
		select {
		case e, ok := <-w.updates():
			if !ok {
				t.Fatal("the watcher ended before its initial values were in")
			}
			if e == nil {
				return slices.Sorted(slices.Values(keys))
			}
			if e.Operation() == jetstream.KeyValuePut {
				keys = append(keys, e.Key())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no initial values within 10 s")
		}
	}
}

// A lasting watch that cannot start at first (its bucket out of reach;
// here, gone) is tried again until it starts, rather than given up, and
// gives up only when told to.
func TestLastingWatchStartsOnceItCan(t *testing.T) {
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bucket := jetstream.KeyValueConfig{Bucket: "W"}
	kv, err := js.CreateKeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "W"); err != nil {
		t.Fatal(err)
	}
	// Control: a single attempt fails in this scene.
	if w, err := watchLasting(ctx, kv, "a.*"); err == nil {
		w.stop()
		t.Fatal("a watch of a deleted bucket started: the scene shows nothing")
	}

	errs := make(chan error, 1)
	started := make(chan *lastingWatch, 1)
	done := make(chan struct{})
	go func() {
		started <- watchLastingUntil(done, kv, "a.*", func(err error) {
			select {
			case errs <- err:
			default:
			}
		})
	}()
	select {
	case <-errs:
	case w := <-started:
		t.Fatalf("watchLastingUntil returned %v before the bucket was there again, and reported no error", w)
	case <-time.After(10 * time.Second):
		t.Fatal("no failed attempt reported within 10 s")
	}
	if _, err := js.CreateKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a.1", []byte("1")); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-started:
		if w == nil {
			t.Fatal("watchLastingUntil gave up before done was closed")
		}
		defer w.stop()
		// Started before or after the put: either way a.1 comes, among
		// the initial values or after them.
		for seen := false; !seen; {
			select {
			case e := <-w.updates():
				seen = e != nil && e.Key() == "a.1"
			case <-time.After(10 * time.Second):
				t.Fatal("a.1 not reported within 10 s of the watch's start")
			}
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not start within 20 s of the bucket's return")
	}
	close(done)

	// Ending: it gives up, with nil, once done is closed.
	if err := js.DeleteKeyValue(ctx, "W"); err != nil {
		t.Fatal(err)
	}
	if w := watchLastingUntil(done, kv, "a.*", func(error) {}); w != nil {
		w.stop()
		t.Fatal("watchLastingUntil watched after done was closed")
	}
}
