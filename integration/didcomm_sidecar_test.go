package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The specification's received_orders example, as it prints it.
const specReceivedOrders = `[
  {"id": "did:ex:bob", "last": 2, "gaps": []},
  {"id": "did:ex:alice", "last": 4, "gaps": [2,3]}
]`

// seenBySidecar is one message a Google client got from a tracked
// subscription, with the attributes the sidecar's tracker added.
type seenBySidecar struct {
	data                            string
	thread, sender, order           string
	events, receivedOrders, problem string
	attempt                         int
}

// sidecarLog records what a Google client handler got, and acks it.
type sidecarLog struct {
	mu  sync.Mutex
	all []seenBySidecar
}

func (l *sidecarLog) handler(_ context.Context, m *pubsub.Message) {
	a := m.Attributes
	s := seenBySidecar{
		data: string(m.Data), thread: a["jetorder-didcomm-thread"], sender: a["jetorder-didcomm-sender"], order: a["jetorder-didcomm-sender-order"],
		events: a["jetorder-didcomm-events"], receivedOrders: a["jetorder-didcomm-received-orders"], problem: a["jetorder-didcomm-error"],
	}
	if m.DeliveryAttempt != nil {
		s.attempt = *m.DeliveryAttempt
	}
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	m.Ack()
}

func (l *sidecarLog) snapshot() []seenBySidecar {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]seenBySidecar(nil), l.all...)
}

// find returns the last delivery whose data is data.
func (l *sidecarLog) find(data []byte) (seenBySidecar, bool) {
	all := l.snapshot()
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].data == string(data) {
			return all[i], true
		}
	}
	return seenBySidecar{}, false
}

func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("not JSON: %s: %v", s, err)
	}
	return b.String()
}

// The specification's auction through the sidecar and Google's Go client:
// the attributes show the gap [2,3] opening on Alice's 4 and closing on her
// resends, received_orders is the specification's example, and a second
// resend never reaches the client.
func TestSidecarDIDCommAuction(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "auction")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("auctioneer"), Topic: topicPath("auction"), EnableMessageOrdering: true,
		Labels: map[string]string{"jetorder-didcomm": "track"}})
	pub := c.Publisher("auction")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	send := func(data []byte) {
		t.Helper()
		// One key: the client sees the messages in this order.
		if _, err := pub.Publish(context.Background(), &pubsub.Message{Data: data, OrderingKey: "auction-1"}).Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var log sidecarLog
	receiveGo(t, c.Subscriber("auctioneer"), log.handler)
	waitFor := func(data []byte) seenBySidecar {
		t.Helper()
		var got seenBySidecar
		testutil.Eventually(t, 15*time.Second, func() bool {
			var ok bool
			got, ok = log.find(data)
			return ok
		}, "%s not delivered; got %v", data, log.snapshot)
		return got
	}

	bob1, bob2 := bid(t, "auction-1", "did:ex:bob", 1, 0), bid(t, "auction-1", "did:ex:bob", 2, 0)
	alice1, alice4 := bid(t, "auction-1", "did:ex:alice", 1, 0), bid(t, "auction-1", "did:ex:alice", 4, 0)
	for _, b := range [][]byte{bob1, bob2, alice1, alice4} {
		send(b)
	}
	if got := waitFor(bob1); got.thread != "auction-1" || got.sender != "did:ex:bob" || got.order != "1" || got.events != "[]" ||
		got.receivedOrders != `[{"id":"did:ex:bob","last":1,"gaps":[]}]` {
		t.Fatalf("bob's bid 1: %+v", got)
	}
	got := waitFor(alice4)
	if want := `[{"event":"gap_opened","sender":"did:ex:alice","first":2,"last":3},{"event":"out_of_order","sender":"did:ex:alice","order":4}]`; got.events != want {
		t.Fatalf("alice's bid 4: events\n got %s\nwant %s", got.events, want)
	}
	if want := compactJSON(t, specReceivedOrders); got.receivedOrders != want {
		t.Fatalf("alice's bid 4: received_orders\n got %s\nwant %s (the specification's example)", got.receivedOrders, want)
	}

	// Alice resends 2 and 3, then 2 once more; her next message comes after
	// them on the same key, so once it is delivered the copy was dealt with.
	alice2, alice3 := bid(t, "auction-1", "did:ex:alice", 2, 2), bid(t, "auction-1", "did:ex:alice", 3, 2)
	alice2again, alice5 := bid(t, "auction-1", "did:ex:alice", 2, 3), bid(t, "auction-1", "did:ex:alice", 5, 0)
	for _, b := range [][]byte{alice2, alice3, alice2again, alice5} {
		send(b)
	}
	waitFor(alice5)
	if got := waitFor(alice2); got.events != `[{"event":"gap_filled","sender":"did:ex:alice","order":2},{"event":"out_of_order","sender":"did:ex:alice","order":2}]` ||
		got.receivedOrders != `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[3]}]` {
		t.Fatalf("alice's resent bid 2: %+v", got)
	}
	if got := waitFor(alice3); !strings.HasPrefix(got.events, `[{"event":"gap_filled","sender":"did:ex:alice","order":3}`) ||
		got.receivedOrders != `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[]}]` {
		t.Fatalf("alice's resent bid 3: %+v", got)
	}
	if got, ok := log.find(alice2again); ok {
		t.Fatalf("the second resend of alice's bid 2 reached the client: %+v", got)
	}
	var datas []string
	for _, s := range log.snapshot() {
		datas = append(datas, s.data)
	}
	if len(datas) != 7 {
		t.Fatalf("delivered %d messages, want 7:\n%s", len(datas), strings.Join(datas, "\n"))
	}

	// A broken header is delivered untracked, saying what is wrong; a
	// message that is not DIDComm passes as it is.
	broken := []byte(`{"id":"b-1","type":"https://example.org/auction/1.0/bid","thid":"auction-1","from":"did:ex:carol","sender_order":-1}`)
	send(broken)
	send([]byte("not didcomm"))
	if got := waitFor(broken); !strings.Contains(got.problem, "invalid sender_order") || got.thread != "" || got.receivedOrders != "" {
		t.Fatalf("broken header: %+v", got)
	}
	if got := waitFor([]byte("not didcomm")); got != (seenBySidecar{data: "not didcomm"}) {
		t.Fatalf("plain message got DIDComm attributes: %+v", got)
	}

	metrics := sc.Metrics()
	for name, want := range map[string]float64{
		"jetorder_didcomm_gaps_opened_total":    2,
		"jetorder_didcomm_gaps_filled_total":    2,
		"jetorder_didcomm_copies_dropped_total": 1,
		"jetorder_didcomm_open_gaps":            0,
	} {
		if got, ok := metrics.Value(name, "subscription", subPath("auctioneer")); !ok || got != want {
			t.Errorf("%s{subscription=%q} = %v (found: %v), want %v", name, subPath("auctioneer"), got, ok, want)
		}
	}
}

// Switching tracking on for a subscription with a backlog delivers the
// backlog, tracked, and nothing acked before.
func TestSidecarDIDCommTrackingSwitchedOn(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "bids")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("bids-sub"), Topic: topicPath("bids"), EnableMessageOrdering: true})
	pub := c.Publisher("bids")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	send := func(order uint64) []byte {
		t.Helper()
		data := bid(t, "t-1", "did:ex:bob", order, 0)
		if _, err := pub.Publish(context.Background(), &pubsub.Message{Data: data, OrderingKey: "t-1"}).Get(context.Background()); err != nil {
			t.Fatal(err)
		}
		return data
	}
	var log sidecarLog
	for order := uint64(1); order <= 3; order++ {
		send(order)
	}
	stop := receiveGo(t, c.Subscriber("bids-sub"), log.handler)
	testutil.Eventually(t, 15*time.Second, func() bool { return len(log.snapshot()) == 3 }, "untracked: got %v", log.snapshot)
	stop()
	for _, s := range log.snapshot() {
		if s.thread != "" {
			t.Fatalf("tracked before tracking was on: %+v", s)
		}
	}

	backlog := [][]byte{send(4), send(6)}
	cur, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: subPath("bids-sub")})
	if err != nil {
		t.Fatal(err)
	}
	labels := func(value string) map[string]string {
		l := maps.Clone(cur.GetLabels()) // with the delivery mode, which cannot change
		l["jetorder-didcomm"] = value
		return l
	}
	if _, err := c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: subPath("bids-sub"), Labels: labels("track")},
		UpdateMask:   fieldMask("labels"),
	}); err != nil {
		t.Fatal(err)
	}
	_, err = c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: subPath("bids-sub"), Labels: labels("yes")},
		UpdateMask:   fieldMask("labels"),
	})
	wantCode(t, "label jetorder-didcomm: yes", err, codes.InvalidArgument)
	if !strings.Contains(err.Error(), `the only value is "track"`) {
		t.Fatalf("label jetorder-didcomm: yes: %v", err)
	}

	receiveGo(t, c.Subscriber("bids-sub"), log.handler)
	testutil.Eventually(t, 15*time.Second, func() bool { return len(log.snapshot()) >= 5 }, "backlog: got %v", log.snapshot)
	all := log.snapshot()
	if len(all) != 5 || all[3].data != string(backlog[0]) || all[4].data != string(backlog[1]) {
		t.Fatalf("deliveries after switching on: %+v", all)
	}
	// The tracker starts with order 4: the orders before it are a gap, as
	// they would be for any receiver that joins a thread late.
	if all[4].order != "6" || all[4].events != `[{"event":"gap_opened","sender":"did:ex:bob","first":5,"last":5},{"event":"out_of_order","sender":"did:ex:bob","order":6}]` {
		t.Fatalf("order 6 after switching on: %+v", all[4])
	}
}

// One subscription read through the sidecar and through the library
// (didcomm.Receive, over the sidecar's NATS port): both see the same gaps
// and drop the same copies, and the tracker's state survives a SIGKILL of
// the sidecar and its restart on its data dir.
func TestSidecarDIDCommSharedWithLibraryAcrossSIGKILL(t *testing.T) {
	natsAddr := itest.FreeAddr(t)
	a := itest.Start(t, sidecar.Config{NATSListen: natsAddr}, itest.Binary(itest.BuildSidecar(t)))
	c := a.GoClient()
	mustCreateTopic(t, c, "shared")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("shared-sub"), Topic: topicPath("shared"), EnableMessageOrdering: true,
		Labels: map[string]string{"jetorder-didcomm": "track"}})
	publishBids := func(c *pubsub.Client, bids ...[]byte) {
		t.Helper()
		pub := c.Publisher("shared")
		pub.EnableMessageOrdering = true
		defer pub.Stop()
		for _, b := range bids {
			if _, err := pub.Publish(context.Background(), &pubsub.Message{Data: b, OrderingKey: "auction-2"}).Get(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Through the sidecar: Bob 1, 2 and Alice 1, 4.
	var viaSidecar sidecarLog
	stop := receiveGo(t, c.Subscriber("shared-sub"), viaSidecar.handler)
	alice4 := bid(t, "auction-2", "did:ex:alice", 4, 0)
	publishBids(c, bid(t, "auction-2", "did:ex:bob", 1, 0), bid(t, "auction-2", "did:ex:bob", 2, 0), bid(t, "auction-2", "did:ex:alice", 1, 0), alice4)
	testutil.Eventually(t, 15*time.Second, func() bool { _, ok := viaSidecar.find(alice4); return ok }, "alice's 4 not delivered: %v", viaSidecar.snapshot)
	if got, _ := viaSidecar.find(alice4); got.receivedOrders != compactJSON(t, specReceivedOrders) {
		t.Fatalf("alice's 4 through the sidecar: %+v", got)
	}
	stop()

	// The sidecar dies and comes back on its data dir.
	a.Kill()
	a = a.Restart()

	// Through the library: Alice resends 2, 3 and 4 (a copy), then sends 5.
	nc, err := nats.Connect("nats://"+natsAddr, nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	lib, err := adapter.NewClient(nc, project)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	c = a.GoClient()
	alice4again, alice5 := bid(t, "auction-2", "did:ex:alice", 4, 2), bid(t, "auction-2", "did:ex:alice", 5, 0)
	publishBids(c, bid(t, "auction-2", "did:ex:alice", 2, 2), bid(t, "auction-2", "did:ex:alice", 3, 2), alice4again, alice5)
	var viaLibrary handoverLog
	libSub := lib.Subscription("shared-sub")
	r := receiveDIDComm(t, libSub, &viaLibrary, 1)
	testutil.Eventually(t, 15*time.Second, func() bool {
		for _, h := range viaLibrary.snapshot() {
			if h.from == "did:ex:alice" && h.order == 5 {
				return true
			}
		}
		return false
	}, "alice's 5 not handed over by the library: %v", viaLibrary.snapshot)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var filled []string
	for _, h := range viaLibrary.snapshot() {
		if h.from == "did:ex:alice" && h.order == 4 && h.sent == 2 {
			t.Fatalf("the library handed over alice's resent 4, a copy of what the sidecar's client handled: %v", viaLibrary.snapshot())
		}
		if len(h.events) > 0 && h.events[0] == didcomm.GapFilled {
			filled = append(filled, h.String())
		}
	}
	if len(filled) != 2 {
		t.Fatalf("the library filled %v, want alice's 2 and 3 (the gap the sidecar saw open): %v", filled, viaLibrary.snapshot())
	}

	// Back to the sidecar: copies of what the library handled are dropped.
	alice3again, bob2again, alice6 := bid(t, "auction-2", "did:ex:alice", 3, 3), bid(t, "auction-2", "did:ex:bob", 2, 2), bid(t, "auction-2", "did:ex:alice", 6, 0)
	publishBids(c, alice3again, bob2again, alice6)
	viaSidecar = sidecarLog{}
	stop = receiveGo(t, c.Subscriber("shared-sub"), viaSidecar.handler)
	testutil.Eventually(t, 15*time.Second, func() bool { _, ok := viaSidecar.find(alice6); return ok }, "alice's 6 not delivered: %v", viaSidecar.snapshot)
	stop()
	for _, copied := range [][]byte{alice3again, bob2again} {
		if _, ok := viaSidecar.find(copied); ok {
			t.Errorf("the sidecar delivered %s, a copy of what the library handled", copied)
		}
	}
	if got, _ := viaSidecar.find(alice6); got.receivedOrders != `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":6,"gaps":[]}]` {
		t.Fatalf("alice's 6: %+v", got)
	}
	a.Stop()
}
