package upgrade_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// layoutOf is the account's layout: 1 without a record.
func layoutOf(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	v, err := adapter.AccountLayout(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func streamNames(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var names []string
	l := js.StreamNames(context.Background())
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// layoutAccount starts a nats-server with an empty account and connects
// to it.
func layoutAccount(t *testing.T) (*embedded.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv := testutil.Server(t)
	nc := testutil.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, js
}

func newClient(t *testing.T, nc *nats.Conn) *adapter.Client {
	t.Helper()
	c, err := adapter.NewClient(nc, itest.Project)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A new account gets the record with the library's first write.
func TestLayoutRecordWritten(t *testing.T) {
	t.Parallel()
	_, nc, js := layoutAccount(t)
	c := newClient(t, nc)
	if got := layoutOf(t, js); got != 1 {
		t.Fatalf("layout before any write: %d, want 1 (no record)", got)
	}
	if _, err := c.CreateTopic(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	if got := layoutOf(t, js); got != adapter.LayoutVersion {
		t.Errorf("layout record after CreateTopic: %d, want %d", got, adapter.LayoutVersion)
	}
}

// A newer layout (a downgrade, or a build too old for the account) is
// refused by the library and the sidecar with both versions named, and
// nothing is written.
func TestLayoutNewerRefused(t *testing.T) {
	t.Parallel()
	srv, nc, js := layoutAccount(t)
	ctx := context.Background()
	newer := adapter.LayoutVersion + 1
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "JO_LAYOUT"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "layout", fmt.Appendf(nil, `{"version":%d}`, newer)); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("holds jetorder storage layout %d, and this build knows layouts up to %d", newer, adapter.LayoutVersion)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, adapter.ErrLayoutNewer) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s on a newer layout: %v, want ErrLayoutNewer saying %q", what, err, want)
		}
	}

	c := newClient(t, nc)
	_, err = c.CreateTopic(ctx, "orders")
	check("CreateTopic", err)
	_, err = c.CreateSubscription(ctx, "orders-sub", adapter.SubscriptionConfig{Topic: c.Topic("orders")})
	check("CreateSubscription", err)
	_, err = c.Topic("orders").Publish(ctx, &adapter.Message{Data: []byte("x"), OrderingKey: "k"}).Get(ctx)
	check("Publish", err)
	err = c.Subscription("orders-sub").Receive(ctx, func(context.Context, *adapter.Message) {})
	check("Receive", err)

	_, err = itest.StartErr(t, sidecar.Config{NATSURL: srv.ClientURL()})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("sidecar start on a newer layout: %v, want it to fail saying %q", err, want)
	}
	if got := streamNames(t, js); len(got) != 1 || got[0] != "KV_JO_LAYOUT" {
		t.Errorf("streams after the refusals: %v, want only KV_JO_LAYOUT", got)
	}
	if got := layoutOf(t, js); got != newer {
		t.Errorf("layout record after the refusals: %d, want %d", got, newer)
	}
}

// legacyAccount makes an account as a build before the record left it:
// subscriptions created by the library, the per-key one's record without
// its delivery mode (as written before partitioned delivery), and no
// layout record. It returns the records as they were then.
func legacyAccount(t *testing.T, c *adapter.Client, js jetstream.JetStream) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	topic, err := c.CreateTopic(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for id, cfg := range map[string]adapter.SubscriptionConfig{
		"perkey":      {Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey},
		"partitioned": {Topic: topic, EnableMessageOrdering: true},
		"unordered":   {Topic: topic},
	} {
		if _, err := c.CreateSubscription(ctx, id, cfg); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, "JO_SUBSCRIPTIONS")
	if err != nil {
		t.Fatal(err)
	}
	records := map[string][]byte{}
	for _, id := range []string{"perkey", "partitioned", "unordered"} {
		key := itest.Project + "." + id
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		val := e.Value()
		if id == "perkey" {
			val = withoutDelivery(t, val)
			if _, err := kv.Put(ctx, key, val); err != nil {
				t.Fatal(err)
			}
		}
		records[key] = val
	}
	if err := js.DeleteKeyValue(ctx, "JO_LAYOUT"); err != nil {
		t.Fatal(err)
	}
	return records
}

func withoutDelivery(t *testing.T, rec []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(rec, &m); err != nil {
		t.Fatal(err)
	}
	if string(m["delivery"]) != `"per-key"` {
		t.Fatalf("record %s: want a per-key delivery member", rec)
	}
	delete(m, "delivery")
	out, _ := json.Marshal(m)
	return out
}

// checkMigrated reports how records stand against their legacy values:
// ordered records without a delivery mode must have gained "per-key" and
// nothing else, others be unchanged. It returns the number migrated.
func checkMigrated(t *testing.T, js jetstream.JetStream, legacy map[string][]byte) (migrated int, problems []string) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "JO_SUBSCRIPTIONS")
	if err != nil {
		t.Fatal(err)
	}
	for key, old := range legacy {
		e, err := kv.Get(ctx, key)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		var was, now map[string]json.RawMessage
		_ = json.Unmarshal(old, &was)
		if err := json.Unmarshal(e.Value(), &now); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		if _, had := was["delivery"]; !had && string(was["ordering"]) == "true" {
			if string(now["delivery"]) != `"per-key"` {
				continue // not yet
			}
			delete(now, "delivery")
			migrated++
		}
		a, _ := json.Marshal(was)
		b, _ := json.Marshal(now)
		if string(a) != string(b) {
			problems = append(problems, fmt.Sprintf("%s: %s, was %s", key, b, a))
		}
	}
	return migrated, problems
}

// An unversioned account is migrated by the library's first write: the
// per-key record gains its delivery mode, the others are untouched, the
// record is written, and the migrated subscription still delivers.
func TestLayoutMigration(t *testing.T) {
	t.Parallel()
	_, nc, js := layoutAccount(t)
	ctx := context.Background()
	legacy := legacyAccount(t, newClient(t, nc), js)

	// Several clients at once, as sidecars starting together.
	errs := make(chan error, 4)
	for range 4 {
		c := newClient(t, nc)
		go func() { _, err := c.Subscriptions(ctx); errs <- err }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("a client on the unversioned account: %v", err)
		}
	}
	if got := layoutOf(t, js); got != adapter.LayoutVersion {
		t.Errorf("layout record: %d, want %d", got, adapter.LayoutVersion)
	}
	if n, problems := checkMigrated(t, js, legacy); n != 1 || len(problems) > 0 {
		t.Errorf("migrated %d records of 1; problems: %v", n, problems)
	}

	c := newClient(t, nc)
	cfg, err := c.Subscription("perkey").Config(ctx)
	if err != nil || cfg.Delivery != adapter.DeliveryPerKey {
		t.Fatalf("migrated subscription: %+v, %v", cfg, err)
	}
	if _, err := c.Topic("orders").Publish(ctx, &adapter.Message{Data: []byte("m"), OrderingKey: "k"}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got := make(chan string, 1)
	err = c.Subscription("perkey").Receive(rctx, func(_ context.Context, m *adapter.Message) {
		m.Ack()
		select {
		case got <- string(m.Data):
		default:
		}
		cancel()
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d != "m" {
			t.Errorf("delivered %q, want m", d)
		}
	default:
		t.Error("the migrated per-key subscription delivered nothing in 30 s")
	}
}

// A migration SIGKILLed at random points completes when the sidecar starts
// again: every record migrated once, nothing else changed, the record
// written. At least one kill must land halfway, or the test proves
// nothing.
func TestLayoutMigrationKilled(t *testing.T) {
	t.Parallel()
	srv, nc, js := layoutAccount(t)
	ctx := context.Background()
	legacy := legacyAccount(t, newClient(t, nc), js)

	// Many per-key records, so that a migration takes a while.
	kv, err := js.KeyValue(ctx, "JO_SUBSCRIPTIONS")
	if err != nil {
		t.Fatal(err)
	}
	template := legacy[itest.Project+".perkey"]
	const extra = 3000
	for i := range extra {
		key := itest.Project + ".legacy-" + strconv.Itoa(i)
		val := []byte(strings.Replace(string(template), `"id":"perkey"`, `"id":"legacy-`+strconv.Itoa(i)+`"`, 1))
		if _, err := kv.Put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
		legacy[key] = val
	}
	total := extra + 1

	bin := itest.BuildSidecar(t)
	args := []string{"--nats-url", srv.ClientURL(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "off"}
	halfway := 0
	for round := 0; round < 8 && halfway < 2; round++ {
		started := make(chan struct{}, 1)
		p := itest.StartProcess(t, bin, args, nil, func(line string) {
			if strings.Contains(line, "migrating the storage layout") {
				select {
				case started <- struct{}{}:
				default:
				}
			}
		})
		select {
		case <-started:
		case <-p.Exited():
			t.Fatalf("round %d: the sidecar exited before migrating:\n%s", round, p.Log())
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: no migration started in 60 s:\n%s", round, p.Log())
		}
		// The fault's moment, not a wait for a state: random in the
		// first part of the migration.
		time.Sleep(rand.N(1500 * time.Millisecond))
		p.Kill()
		<-p.Exited()
		n, problems := checkMigrated(t, js, legacy)
		if len(problems) > 0 {
			t.Fatalf("round %d: records changed beyond the migration: %v", round, problems[:min(len(problems), 5)])
		}
		t.Logf("round %d: killed with %d of %d records migrated, layout %d", round, n, total, layoutOf(t, js))
		if n > 0 && n < total {
			halfway++
		}
		if n == total {
			break
		}
	}
	if halfway == 0 {
		t.Fatal("no kill landed halfway through the migration")
	}

	sc := itest.Start(t, sidecar.Config{NATSURL: srv.ClientURL()}, itest.Binary(bin))
	n, problems := checkMigrated(t, js, legacy)
	if n != total || len(problems) > 0 {
		t.Errorf("after the restart: %d of %d records migrated; problems: %v", n, total, problems[:min(len(problems), 5)])
	}
	if got := layoutOf(t, js); got != adapter.LayoutVersion {
		t.Errorf("layout record after the restart: %d, want %d", got, adapter.LayoutVersion)
	}
	sc.Stop()
}
