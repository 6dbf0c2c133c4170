package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The library's confirmed ack, Message.AckWithResult, which the sidecar's
// exactly-once delivery is built on.

// Acks confirmed by the server in every delivery mode: each key's messages
// come in order, one at a time, and an acked message never comes again,
// also once the ack deadline has passed.
func TestExactlyOnceAdapterConfirmedAcks(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  adapter.SubscriptionConfig
	}{
		{"unordered", adapter.SubscriptionConfig{}},
		{"per-key", adapter.SubscriptionConfig{EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey}},
		{"partitioned", adapter.SubscriptionConfig{EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned, Partitions: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			topic := e.createTopic("confirmed")
			cfg := tc.cfg
			cfg.Topic, cfg.AckDeadline, cfg.ExactlyOnce = topic, time.Second, true
			sub := e.createSub("confirmed-sub", cfg)
			if got, err := sub.Config(context.Background()); err != nil || !got.ExactlyOnce {
				t.Fatalf("Config: ExactlyOnce %v, %v", got.ExactlyOnce, err)
			}
			chk := ordercheck.New()
			startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
				key, idx, err := ordercheck.Decode(m.Data)
				if err != nil {
					chk.Fail("undecodable %q: %v", m.Data, err)
					m.Ack()
					return
				}
				chk.Delivered("s", key, idx)
				// Recorded first: the key's next message may start as soon
				// as the server has confirmed the ack.
				chk.Acked("s", key, idx)
				if err := m.AckWithResult(ctx); err != nil {
					chk.Fail("AckWithResult of %s: %v", m.Data, err)
				}
			})
			const keys, msgs = 4, 8
			for i := range msgs {
				for k := 0; k <= keys; k++ {
					key := fmt.Sprint("k", k)
					if k == keys {
						key = ""
					}
					publish(t, topic, string(ordercheck.Encode(key, i)), key)
					chk.Published(key, i)
				}
			}
			testutil.Eventually(t, 30*time.Second, func() bool { return chk.Complete("s") }, "not everything acked: %s; violations %q",
				func() string { return chk.Missing("s") }, chk.Violations)
			// Twice the ack deadline: an ack the server did not have would
			// bring its message back by then. An absence is asserted, so the
			// window is waited out.
			before := chk.Stats("s").Deliveries
			deadline := time.Now().Add(2500 * time.Millisecond)
			for time.Now().Before(deadline) && chk.Stats("s").Deliveries == before {
				time.Sleep(20 * time.Millisecond)
			}
			if v := chk.Violations(); len(v) > 0 {
				t.Fatalf("%d violations, first: %s", len(v), strings.Join(v, "\n"))
			}
			if st := chk.Stats("s"); st.Deliveries != before || st.Redeliveries != 0 {
				t.Fatalf("deliveries after every ack was confirmed: %d, then %d (%d redeliveries)", before, st.Deliveries, st.Redeliveries)
			}
		})
	}
}

// An ack that cannot take effect is ErrAckInvalid: after a nack, or once
// the message has been delivered again. The redelivery's ack succeeds, and
// the message comes no more.
func TestExactlyOnceAdapterInvalidAcks(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("invalid")
	sub := e.createSub("invalid-sub", adapter.SubscriptionConfig{Topic: topic, AckDeadline: time.Second, ExactlyOnce: true})
	type delivery struct {
		m       *adapter.Message
		nackErr error         // AckWithResult after Nack ("nacked" only)
		release chan struct{} // closed by the test to let the handler return
	}
	deliveries := make(chan delivery, 10)
	startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		d := delivery{m: m, release: make(chan struct{})}
		switch {
		case string(m.Data) == "nacked" && m.DeliveryAttempt == 1:
			m.Nack()
			d.nackErr = m.AckWithResult(ctx)
			deliveries <- d
			return
		case string(m.Data) == "expired" && m.DeliveryAttempt == 1:
			deliveries <- d // returns without an ack: redelivered after the deadline
			return
		}
		deliveries <- d
		select { // held (its deadline extended) until the test has acked it
		case <-d.release:
		case <-ctx.Done():
		}
	})
	next := func(what string) delivery {
		t.Helper()
		select {
		case d := <-deliveries:
			return d
		case <-time.After(15 * time.Second):
			t.Fatalf("no delivery of %s within 15s", what)
		}
		return delivery{}
	}
	ack := func(m *adapter.Message) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return m.AckWithResult(ctx)
	}

	publish(t, topic, "nacked", "")
	// The nack's redelivery may reach the channel before the nacked
	// delivery's handler has sent its report: take both, by attempt.
	d, again := next("nacked"), next("nacked, again")
	if d.m.DeliveryAttempt != 1 {
		d, again = again, d
	}
	if !errors.Is(d.nackErr, adapter.ErrAckInvalid) {
		t.Fatalf("AckWithResult after Nack: %v, want ErrAckInvalid", d.nackErr)
	}
	d = again
	if string(d.m.Data) != "nacked" || d.m.DeliveryAttempt != 2 {
		t.Fatalf("got %q attempt %d, want nacked attempt 2", d.m.Data, d.m.DeliveryAttempt)
	}
	if err := ack(d.m); err != nil {
		t.Fatalf("ack of the redelivery: %v", err)
	}
	close(d.release)

	publish(t, topic, "expired", "")
	old := next("expired")
	d = next("expired, after its deadline")
	if string(d.m.Data) != "expired" || d.m.DeliveryAttempt != 2 {
		t.Fatalf("got %q attempt %d, want expired attempt 2", d.m.Data, d.m.DeliveryAttempt)
	}
	if err := ack(old.m); !errors.Is(err, adapter.ErrAckInvalid) {
		t.Fatalf("ack of the delivery the server redelivered: %v, want ErrAckInvalid", err)
	}
	if err := ack(d.m); err != nil {
		t.Fatalf("ack of the redelivery: %v", err)
	}
	if err := ack(d.m); err != nil {
		t.Fatalf("second ack of the redelivery: %v", err)
	}
	d.m.Nack() // after the ack: does nothing
	close(d.release)
	select { // an absence: the window (twice the deadline) is waited out
	case d := <-deliveries:
		t.Fatalf("%q attempt %d delivered after its ack was confirmed", d.m.Data, d.m.DeliveryAttempt)
	case <-time.After(2500 * time.Millisecond):
	}
}

// An ack nobody at the server takes, because the subscription's consumers
// are gone, is ErrAckInvalid.
func TestExactlyOnceAdapterConsumerGone(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("gone")
	sub := e.createSub("gone-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, ExactlyOnce: true})
	held := make(chan *adapter.Message, 1)
	proceed := make(chan struct{})
	results := make(chan error, 1)
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		held <- m
		<-proceed
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		results <- m.AckWithResult(ctx)
	})
	publish(t, topic, "m", "k")
	select {
	case <-held:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery within 15s")
	}
	if err := sub.Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	select {
	case err := <-results:
		if !errors.Is(err, adapter.ErrAckInvalid) || !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("ack after the subscription was deleted: %v, want ErrAckInvalid (no responders)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("AckWithResult did not return within 15s")
	}
}

// An ack whose confirmation does not come (the server's replies are held
// on the way) is ErrAckTimeout; once replies flow, a second call confirms
// it. The key's next message starts only after the ack, and the acked
// message never comes again.
func TestExactlyOnceAdapterAckTimeout(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("slow")
	e.createSub("slow-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second, ExactlyOnce: true})
	proxy, err := faultproxy.Start(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close) // after the receiver stops: cleanups run last first
	client, err := adapter.NewClient(testutil.Connect(t, proxy.URL()), project, testLogger()...)
	if err != nil {
		t.Fatal(err)
	}
	chk := ordercheck.New()
	type delivery struct {
		m    *adapter.Message
		done chan struct{}
	}
	deliveries := make(chan delivery, 10)
	startReceive(t, client.Subscription("slow-sub"), func(ctx context.Context, m *adapter.Message) {
		key, idx, _ := ordercheck.Decode(m.Data)
		chk.Delivered("s", key, idx)
		d := delivery{m, make(chan struct{})}
		deliveries <- d
		select { // the test settles it
		case <-d.done:
		case <-ctx.Done():
		}
	})
	for i := range 2 {
		publish(t, topic, string(ordercheck.Encode("k", i)), "k")
		chk.Published("k", i)
	}
	var d delivery
	select {
	case d = <-deliveries:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery within 15s")
	}
	if string(d.m.Data) != string(ordercheck.Encode("k", 0)) {
		t.Fatalf("first delivery %q", d.m.Data)
	}
	chk.Acked("s", "k", 0) // from here the ack is on its way
	proxy.HoldReplies()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = d.m.AckWithResult(ctx)
	cancel()
	if !errors.Is(err, adapter.ErrAckTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		proxy.ReleaseReplies()
		t.Fatalf("ack with the replies held: %v, want ErrAckTimeout", err)
	}
	proxy.ReleaseReplies()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	err = d.m.AckWithResult(ctx)
	cancel()
	if err != nil {
		t.Fatalf("ack again once replies flow: %v", err)
	}
	close(d.done)
	select {
	case d = <-deliveries:
	case <-time.After(15 * time.Second):
		t.Fatal("k|1 not delivered within 15s")
	}
	chk.Acked("s", "k", 1)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	err = d.m.AckWithResult(ctx)
	cancel()
	close(d.done)
	if err != nil {
		t.Fatalf("ack of k|1: %v", err)
	}
	select { // an absence: the window (past the ack deadline) is waited out
	case d := <-deliveries:
		t.Fatalf("%q attempt %d delivered after its ack was confirmed", d.m.Data, d.m.DeliveryAttempt)
	case <-time.After(3 * time.Second):
	}
	if v := chk.Violations(); len(v) > 0 || !chk.Complete("s") {
		t.Fatalf("violations %q; missing %s", v, chk.Missing("s"))
	}
}
