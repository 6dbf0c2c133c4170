package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// The sidecar stamps DIDComm sender_order on messages published with
// jetorder-didcomm: stamp, from counters in JetStream KV shared by every
// sidecar on the NATS system.

// unstampedBid is a DIDComm plaintext bid of thread "auction-1" from
// alice without sender_order, asking the sidecar to stamp it.
func unstampedBid(id string) *pubsub.Message {
	return &pubsub.Message{
		Data:       fmt.Appendf(nil, `{"id":%q,"type":"https://example.org/auction/1.0/bid","thid":"auction-1","from":"did:ex:alice","body":{}}`, id),
		Attributes: map[string]string{broker.AttrDIDComm: broker.DIDCommStamp},
	}
}

// stampedMessage is a message as a topic's stream holds it, with its
// DIDComm headers read as receivers read them.
type stampedMessage struct {
	h      didcomm.Headers
	attrs  map[string]string
	header nats.Header
}

// storedStamped reads every message of a topic's stream on the NATS
// server at url.
func storedStamped(t *testing.T, url, topic string) []stampedMessage {
	t.Helper()
	js, err := jetstream.New(testutil.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := keyrouter.StreamName(project, topic)
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []stampedMessage
	for uint64(len(out)) < info.State.Msgs {
		batch, err := cons.Fetch(min(int(info.State.Msgs)-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			sm := stampedMessage{attrs: map[string]string{}, header: m.Headers()}
			for k, v := range m.Headers() {
				if name, ok := strings.CutPrefix(k, "Jetorder-Attr-"); ok { // docs/WIRE.md
					k, _ := keyrouter.DecodeKey(name)
					sm.attrs[k], _ = keyrouter.DecodeKey(v[0])
				}
			}
			if sm.h, err = didcomm.Read(&adapter.Message{Data: m.Data(), Attributes: sm.attrs}); err != nil {
				t.Fatalf("stored message %q: %v", m.Data(), err)
			}
			out = append(out, sm)
		}
		if got == 0 {
			t.Fatalf("read %d of %d stored messages: %v", len(out), info.State.Msgs, batch.Error())
		}
	}
	return out
}

// checkOrders fails unless the messages' orders are exactly 1..len(msgs),
// and none kept the stamping attribute.
func checkOrders(t *testing.T, msgs []stampedMessage) {
	t.Helper()
	orders := make([]uint64, len(msgs))
	for i, m := range msgs {
		orders[i] = m.h.SenderOrder
		if _, ok := m.attrs[broker.AttrDIDComm]; ok {
			t.Fatalf("message %s stored with the attribute %s", m.h.ID, broker.AttrDIDComm)
		}
	}
	slices.Sort(orders)
	for i, o := range orders {
		if o != uint64(i+1) {
			t.Fatalf("stored orders are not exactly 1..%d: position %d holds %d (a repeat or a hole)", len(orders), i, o)
		}
	}
}

// Done-when: 8 goroutines, 4 through each of 2 sidecars on one NATS
// server, stamp 10,000 messages of one thread and sender, and one sidecar
// is stopped and started again in the middle: orders are exactly
// 1..10,000.
func TestDIDCommStampTwoSidecarsAndARestart(t *testing.T) {
	const (
		topic        = "stamped"
		goroutines   = 8
		perGoroutine = 1250
		chunk        = 25                       // messages published before waiting for their results
		midwayChunk  = perGoroutine / chunk / 3 // where the restart comes
		total        = goroutines * perGoroutine
	)
	srv := testutil.Server(t)
	url := srv.ClientURL()
	scs := []*itest.Sidecar{itest.Start(t, sidecar.Config{NATSURL: url}), itest.Start(t, sidecar.Config{NATSURL: url})}
	clients := []*pubsub.Client{scs[0].GoClient(itest.Patient()...), scs[1].GoClient(itest.Patient()...)}
	mustCreateTopic(t, clients[0], topic)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	midway := make(chan struct{}, goroutines)
	restarted := make(chan struct{})
	done := make(chan error, goroutines)
	var retried atomic.Int64 // publishes the test had to repeat itself
	start := time.Now()
	for g := range goroutines {
		side := g % 2 // sidecar 1 restarts
		pub := clients[side].Publisher(topic)
		go func() {
			defer pub.Stop()
			done <- func() error {
				for c := range perGoroutine / chunk {
					if c == midwayChunk {
						midway <- struct{}{}
						if side == 0 { // so both sidecars stamp again after the restart
							select {
							case <-restarted:
							case <-ctx.Done():
								return ctx.Err()
							}
						}
					}
					ids := make([]string, chunk)
					results := make([]*pubsub.PublishResult, chunk)
					for i := range chunk {
						ids[i] = fmt.Sprintf("g%d-%d", g, c*chunk+i)
						results[i] = pub.Publish(ctx, unstampedBid(ids[i]))
					}
					for i, r := range results {
						for attempt := 1; ; attempt++ {
							_, err := r.Get(ctx)
							if err == nil {
								break
							}
							if attempt == 5 || ctx.Err() != nil {
								return fmt.Errorf("sidecar %d: publish %s: %w", side, ids[i], err)
							}
							retried.Add(1)
							r = pub.Publish(ctx, unstampedBid(ids[i]))
						}
					}
				}
				return nil
			}()
		}()
	}
	deadline := time.After(60 * time.Second)
	for range goroutines {
		select {
		case <-midway:
		case err := <-done:
			t.Fatalf("a publisher ended before midway: %v", err)
		case <-deadline:
			t.Fatal("publishers did not reach midway within 60s")
		}
	}
	atMidway := time.Since(start)
	scs[1] = scs[1].Restart()
	close(restarted)
	restartedAt := time.Since(start)
	for range goroutines {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("publishers did not finish within 60s")
		}
	}
	published := time.Since(start)

	stored := storedStamped(t, url, topic)
	ids := map[string]bool{}
	for _, m := range stored {
		if m.h.ThreadID() != "auction-1" || m.h.From != "did:ex:alice" {
			t.Fatalf("stored %+v: another thread or sender", m.h)
		}
		ids[m.h.ID] = true
	}
	if len(ids) != total {
		t.Fatalf("%d distinct messages stored, want %d", len(ids), total)
	}
	checkOrders(t, stored)
	t.Logf("%d messages stamped and stored in %v (midway at %v, sidecar 1 back at %v; %d copies stored twice, %d publishes repeated by the test)",
		len(stored), published.Round(time.Millisecond), atMidway.Round(time.Millisecond), restartedAt.Round(time.Millisecond), len(stored)-len(ids), retried.Load())
	if retried.Load() == 0 && len(stored) != total {
		t.Fatalf("%d messages stored for %d publishes that were not repeated: orders 1..%d", len(stored), total, len(stored))
	}
}

// stampCase is a message the sidecar must refuse to stamp.
type stampCase struct {
	name  string
	data  string
	attrs map[string]string
	want  string // in the error message
}

var stampRefusals = []stampCase{
	{"not DIDComm", `{"hello":"world"}`, nil, "not a DIDComm message"},
	{"no id", "opaque", map[string]string{didcomm.AttrFrom: "did:ex:alice"}, "has no id"},
	{"no from", `{"id":"x","type":"https://example.org/bid"}`, nil, "has no from"},
	{"bad jetorder-didcomm value", `{"id":"x","type":"t","from":"did:ex:alice"}`, map[string]string{broker.AttrDIDComm: "yes"}, `attribute jetorder-didcomm is "yes": the only value is "stamp"`},
}

func (c stampCase) message() (data []byte, attrs map[string]string) {
	attrs = map[string]string{broker.AttrDIDComm: broker.DIDCommStamp}
	for k, v := range c.attrs {
		attrs[k] = v
	}
	return []byte(c.data), attrs
}

type httpPublishMessage struct {
	Data       []byte            `json:"data"` // base64
	Attributes map[string]string `json:"attributes,omitempty"`
}

// httpPublish posts a publish request to the sidecar's HTTP API and
// returns the status and the error message.
func httpPublish(t *testing.T, sc *itest.Sidecar, topic string, msgs ...httpPublishMessage) (int, string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return postJSON(t, "http://"+sc.HTTP+"/v1/projects/"+project+"/topics/"+topic+":publish", string(body))
}

// Refusals through gRPC and HTTP: INVALID_ARGUMENT / 400 naming the
// reason, nothing of the request stored, no order taken.
func TestDIDCommStampRefusals(t *testing.T) {
	srv := testutil.Server(t)
	sc := itest.Start(t, sidecar.Config{NATSURL: srv.ClientURL()})
	mustCreateTopic(t, sc.GoClient(), "refusals")
	grpcPub, _ := sc.RawClients()
	ctx := context.Background()
	good := func(id string) *pb.PubsubMessage {
		m := unstampedBid(id)
		return &pb.PubsubMessage{Data: m.Data, Attributes: m.Attributes}
	}
	if _, err := grpcPub.Publish(ctx, &pb.PublishRequest{Topic: topicPath("refusals"), Messages: []*pb.PubsubMessage{good("first")}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range stampRefusals {
		t.Run(tc.name+"/grpc", func(t *testing.T) {
			data, attrs := tc.message()
			_, err := grpcPub.Publish(ctx, &pb.PublishRequest{Topic: topicPath("refusals"), Messages: []*pb.PubsubMessage{good("refused-" + tc.name), {Data: data, Attributes: attrs}}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "messages[1]") {
				t.Fatalf("got %v, want INVALID_ARGUMENT naming messages[1] and %q", err, tc.want)
			}
		})
		t.Run(tc.name+"/http", func(t *testing.T) {
			data, attrs := tc.message()
			g := unstampedBid("refused-" + tc.name)
			code, msg := httpPublish(t, sc, "refusals", httpPublishMessage{g.Data, g.Attributes}, httpPublishMessage{data, attrs})
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "messages[1]") {
				t.Fatalf("got %d %q, want 400 naming messages[1] and %q", code, msg, tc.want)
			}
		})
	}
	// A publish that fails after stamping (no such topic) gives its order
	// back.
	g := unstampedBid("to-nowhere")
	if code, msg := httpPublish(t, sc, "no-such-topic", httpPublishMessage{g.Data, g.Attributes}); code != http.StatusNotFound {
		t.Fatalf("publish to a missing topic: %d %q, want 404", code, msg)
	}
	if _, err := grpcPub.Publish(ctx, &pb.PublishRequest{Topic: topicPath("refusals"), Messages: []*pb.PubsubMessage{good("second")}}); err != nil {
		t.Fatal(err)
	}
	g = unstampedBid("third")
	if code, msg := httpPublish(t, sc, "refusals", httpPublishMessage{g.Data, g.Attributes}); code != http.StatusOK {
		t.Fatalf("HTTP publish: %d %q", code, msg)
	}
	stored := storedStamped(t, srv.ClientURL(), "refusals")
	var got []string
	for _, m := range stored {
		got = append(got, fmt.Sprintf("%s:%d", m.h.ID, m.h.SenderOrder))
	}
	if want := []string{"first:1", "second:2", "third:3"}; !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
}

// A message whose payload is not DIDComm plaintext carries its headers as
// didcomm-* attributes; stamped through HTTP, a subscriber sees
// didcomm-sender-order among them.
func TestDIDCommStampAttributesOverHTTP(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "attrs")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("attrs-sub"), Topic: topicPath("attrs")})
	for i := range 2 {
		attrs := map[string]string{
			broker.AttrDIDComm:  broker.DIDCommStamp,
			didcomm.AttrID:      fmt.Sprintf("m%d", i+1),
			didcomm.AttrThread:  "thread-7",
			didcomm.AttrFrom:    "did:ex:bob",
			"application-label": "kept",
		}
		if code, msg := httpPublish(t, sc, "attrs", httpPublishMessage{[]byte("opaque payload"), attrs}); code != http.StatusOK {
			t.Fatalf("publish: %d %q", code, msg)
		}
	}
	got := make(chan map[string]string, 2)
	receiveGo(t, c.Subscriber("attrs-sub"), func(_ context.Context, m *pubsub.Message) {
		if string(m.Data) == "opaque payload" {
			got <- m.Attributes
		}
		m.Ack()
	})
	orders := map[string]string{}
	for range 2 {
		select {
		case a := <-got:
			if _, ok := a[broker.AttrDIDComm]; ok {
				t.Errorf("delivered with %s: %v", broker.AttrDIDComm, a)
			}
			if a["application-label"] != "kept" || a[didcomm.AttrThread] != "thread-7" || a[didcomm.AttrFrom] != "did:ex:bob" {
				t.Errorf("attributes lost: %v", a)
			}
			orders[a[didcomm.AttrID]] = a[didcomm.AttrSenderOrder]
		case <-time.After(30 * time.Second):
			t.Fatalf("received %d of 2 messages within 30s", len(orders))
		}
	}
	if orders["m1"] != "1" || orders["m2"] != "2" {
		t.Fatalf("didcomm-sender-order by id: %v, want m1:1, m2:2", orders)
	}
}
