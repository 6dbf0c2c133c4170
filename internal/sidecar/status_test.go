package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/status"
	"github.com/jetorder/jetorder/internal/testutil"
)

func getStatus(t *testing.T, base string) *status.Status {
	t.Helper()
	resp, err := http.Get(base + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("/v1/status: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	var st status.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func subscriptionOf(st *status.Status, name string) *status.Subscription {
	for i := range st.Subscriptions {
		if st.Subscriptions[i].Name == name {
			return &st.Subscriptions[i]
		}
	}
	return nil
}

// /v1/status of both delivery modes: the backlog counts what nobody has
// received yet (with per-key delivery, also the messages no key consumer
// covers yet), the partitions show their owner, the client shows while it
// receives, and everything goes back to 0 once acked.
func TestStatusJSON(t *testing.T) {
	at := startSidecar(t)
	base := "http://" + at.HTTP
	c := goClient(t, at.GRPC)
	createTopic(t, c, "status")
	for _, mode := range []string{"per-key", "partitioned"} {
		createSub(t, c, &pb.Subscription{Name: subPath("status-" + mode), Topic: topicPath("status"), EnableMessageOrdering: true,
			Labels: map[string]string{"jetorder-delivery": mode}})
	}
	p := c.Publisher("status")
	p.EnableMessageOrdering = true
	t.Cleanup(p.Stop)
	publish(t, p, 0, 7, 3)

	var st *status.Status
	for _, mode := range []string{"per-key", "partitioned"} {
		name := subPath("status-" + mode)
		testutil.Eventually(t, 20*time.Second, func() bool {
			st = getStatus(t, base)
			s := subscriptionOf(st, name)
			return s != nil && s.Backlog == 7 && s.OldestUnackedAgeSeconds > 0
		}, "%s never showed a backlog of 7: %+v", name, func() any { return subscriptionOf(st, name) })
		s := subscriptionOf(st, name)
		if s.Delivery != mode || s.Topic != topicPath("status") || s.Receiving || s.KeysInFlight != 0 {
			t.Errorf("%s: %+v", name, s)
		}
		if mode == "partitioned" && len(s.Partitions) != 8 {
			t.Errorf("%s has %d partitions, want 8", name, len(s.Partitions))
		}
	}
	if !st.NATS.Connected || !st.NATS.Embedded || !st.JetStream.OK || st.JetStream.AsOf.IsZero() {
		t.Errorf("health: NATS %+v, JetStream %+v", st.NATS, st.JetStream)
	}
	if len(st.Topics) != 1 || st.Topics[0].Name != topicPath("status") || st.Topics[0].Messages != 7 || st.Topics[0].Bytes == 0 {
		t.Errorf("topics: %+v", st.Topics)
	}

	// A Go client receives the partitioned subscription and holds one
	// message unacked until the status shows it: m0, of key k0, which holds
	// back m3 and m6.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // should the test end before it does
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber("status-partitioned").Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			if string(m.Data) == "m0" {
				<-release
			}
			m.Ack()
		})
	}()
	name := subPath("status-partitioned")
	testutil.Eventually(t, 20*time.Second, func() bool {
		st = getStatus(t, base)
		s := subscriptionOf(st, name)
		return s != nil && s.Backlog == 3 && s.KeysInFlight == 1 && s.Outstanding == 1 && s.Streams > 0 && s.PartitionsOwned > 0 && len(st.Clients) > 0
	}, "the status never showed the held message: %+v, clients %+v", func() any { return subscriptionOf(st, name) }, func() any { return st.Clients })
	// Partitions are taken as they have messages.
	for _, part := range subscriptionOf(st, name).Partitions {
		if part.Unacked > 0 && (part.Owner != "this sidecar" || part.PinID == "") {
			t.Errorf("partition %+v, want it owned by this sidecar", part)
		}
	}
	if cl := st.Clients[0]; cl.Subscription != name || cl.Peer == "" || cl.UserAgent == "" || cl.Since.IsZero() {
		t.Errorf("client %+v", cl)
	}
	releaseOnce()
	testutil.Eventually(t, 20*time.Second, func() bool {
		s := subscriptionOf(getStatus(t, base), name)
		return s.Backlog == 0 && s.OldestUnackedAgeSeconds == 0 && s.KeysInFlight == 0
	}, "the backlog never went back to 0")
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Receive: %v", err)
	}
}

// The status says when the server's writes reach disk, and warns when an
// acknowledged publish may be lost in a power cut: under --sync lazy, and
// on an external server that does not tell its policy.
func TestStatusSync(t *testing.T) {
	ext := testutil.Server(t)
	for _, tc := range []struct {
		name      string
		configure func(*sidecar.Config)
		want      string
		risk      bool
	}{
		{"default", func(*sidecar.Config) {}, "group commit", false},
		{"always", func(c *sidecar.Config) { c.Sync = embedded.SyncAlways }, "every write synced", false},
		{"lazy", func(c *sidecar.Config) { c.Sync = embedded.SyncLazy }, "lazy", true},
		{"external", func(c *sidecar.Config) { c.NATSURL = ext.ClientURL() }, "unknown", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := startSidecar(t, tc.configure)
			st := getStatus(t, "http://"+at.HTTP)
			if !strings.Contains(st.NATS.Sync, tc.want) || st.NATS.SyncRisk != tc.risk {
				t.Errorf("status: sync %q, risk %v; want %q in it, risk %v", st.NATS.Sync, st.NATS.SyncRisk, tc.want, tc.risk)
			}
		})
	}
}
