package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

const stampProject = "p"

// stampEnv is a server, a broker on it and a topic.
type stampEnv struct {
	t     *testing.T
	srv   *embedded.Server
	b     *Broker
	js    jetstream.JetStream
	topic string
}

func newStampEnv(t *testing.T) *stampEnv {
	t.Helper()
	srv := testutil.Server(t)
	e := &stampEnv{t: t, srv: srv, b: e2broker(t, srv), topic: "events"}
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	e.js = js
	c, err := e.b.Client(stampProject)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTopic(context.Background(), e.topic); err != nil {
		t.Fatal(err)
	}
	return e
}

// e2broker is another broker on srv, as another sidecar would be.
func e2broker(t *testing.T, srv *embedded.Server) *Broker {
	t.Helper()
	b := New(testutil.Connect(t, srv.ClientURL()), nil, nil)
	t.Cleanup(b.Close)
	return b
}

// plaintext is a DIDComm plaintext message of thread "t1".
func plaintext(id, from string, extra string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"https://example.org/bid","thid":"t1","from":%q,"body":{}%s}`, id, from, extra)
}

func stampMsg(data []byte, attrs ...string) *adapter.Message {
	m := &adapter.Message{Data: data, Attributes: map[string]string{AttrDIDComm: DIDCommStamp}}
	for i := 0; i+1 < len(attrs); i += 2 {
		m.Attributes[attrs[i]] = attrs[i+1]
	}
	return m
}

// storedMsg is a message as the topic's stream holds it.
type storedMsg struct {
	data   []byte
	header nats.Header
	attrs  map[string]string
}

// stored reads every message of the topic's stream, in stream order.
func (e *stampEnv) stored() []storedMsg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := keyrouter.StreamName(stampProject, e.topic)
	s, err := e.js.Stream(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	cons, err := e.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []storedMsg
	for uint64(len(out)) < info.State.Msgs {
		batch, err := cons.Fetch(int(info.State.Msgs)-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			sm := storedMsg{data: m.Data(), header: m.Headers(), attrs: map[string]string{}}
			for k, v := range m.Headers() {
				if name, ok := strings.CutPrefix(k, "Jetorder-Attr-"); ok { // docs/WIRE.md
					k, _ := keyrouter.DecodeKey(name)
					sm.attrs[k], _ = keyrouter.DecodeKey(v[0])
				}
			}
			out = append(out, sm)
		}
		if got == 0 {
			e.t.Fatalf("read %d of %d stored messages: %v", len(out), info.State.Msgs, batch.Error())
		}
	}
	return out
}

// orders reads the sender_order of every stored message.
func (e *stampEnv) orders() []uint64 {
	e.t.Helper()
	var out []uint64
	for _, m := range e.stored() {
		h, err := didcomm.Read(&adapter.Message{Data: m.data, Header: m.header, Attributes: m.attrs})
		if err != nil {
			e.t.Fatalf("stored message %s: %v", m.data, err)
		}
		out = append(out, h.SenderOrder)
	}
	return out
}

func (e *stampEnv) publish(msgs ...*adapter.Message) error {
	_, err := e.b.Publish(context.Background(), stampProject, e.topic, msgs)
	return err
}

func TestStampPlaintext(t *testing.T) {
	e := newStampEnv(t)
	first := stampMsg(plaintext("m1", "did:ex:alice", `,"sent_count":3`), "other", "kept")
	callerAttrs := maps.Clone(first.Attributes)
	attrsMap := first.Attributes
	if err := e.publish(first, stampMsg(plaintext("m2", "did:ex:alice", "")), stampMsg(plaintext("m3", "did:ex:bob", ""))); err != nil {
		t.Fatal(err)
	}
	if err := e.publish(stampMsg(plaintext("m4", "did:ex:alice", ""))); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(attrsMap, callerAttrs) {
		t.Fatalf("the caller's attribute map was changed: %v", attrsMap)
	}
	want := []string{"m1 alice 1", "m2 alice 2", "m3 bob 1", "m4 alice 3"}
	var got []string
	for _, m := range e.stored() {
		h, err := didcomm.ReadPlaintext(m.data)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %d", h.ID, strings.TrimPrefix(h.From, "did:ex:"), h.SenderOrder))
		if h.SentCount != 0 {
			t.Errorf("%s: sent_count %d kept: a stamped message is a first send", h.ID, h.SentCount)
		}
		if _, ok := m.attrs[AttrDIDComm]; ok {
			t.Errorf("%s: attribute %s stored", h.ID, AttrDIDComm)
		}
		if h.ID == "m1" && m.attrs["other"] != "kept" {
			t.Errorf("m1: other attributes lost: %v", m.attrs)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
}

func TestStampAttributesAndHeaderForms(t *testing.T) {
	e := newStampEnv(t)
	attrForm := stampMsg([]byte("opaque payload"), didcomm.AttrID, "a1", didcomm.AttrThread, "t1", "DIDComm-From", "did:ex:alice", didcomm.AttrSentCount, "2")
	headerForm := stampMsg([]byte("opaque payload"))
	headerForm.Header = nats.Header{}
	didcomm.WriteHeader(headerForm.Header, didcomm.Headers{ID: "h1", Thread: "t1", From: "did:ex:alice"})
	if err := e.publish(attrForm, headerForm); err != nil {
		t.Fatal(err)
	}
	msgs := e.stored()
	if len(msgs) != 2 {
		t.Fatalf("stored %d messages, want 2", len(msgs))
	}
	a := msgs[0].attrs
	if a[didcomm.AttrSenderOrder] != "1" || a[didcomm.AttrFrom] != "did:ex:alice" || a[didcomm.AttrID] != "a1" {
		t.Fatalf("attribute form stored %v, want didcomm-sender-order 1", a)
	}
	if _, ok := a[didcomm.AttrSentCount]; ok {
		t.Errorf("didcomm-sent-count kept: %v", a)
	}
	if _, ok := a["DIDComm-From"]; ok {
		t.Errorf("an attribute in another case kept beside the written one: %v", a)
	}
	if got := msgs[1].header.Get(didcomm.HeaderSenderOrder); got != "2" {
		t.Fatalf("header form: %s %q, want 2", didcomm.HeaderSenderOrder, got)
	}
	if string(msgs[0].data) != "opaque payload" || string(msgs[1].data) != "opaque payload" {
		t.Fatalf("payloads changed: %q, %q", msgs[0].data, msgs[1].data)
	}
}

// Every refusal names its reason, stores nothing of the request and takes
// no order: the next good message gets the next one.
func TestStampRefusals(t *testing.T) {
	e := newStampEnv(t)
	if err := e.publish(stampMsg(plaintext("ok0", "did:ex:alice", ""))); err != nil {
		t.Fatal(err)
	}
	// A plaintext message whose JSON grows when written again ("<" is
	// escaped as \u003c): it fits as sent, not once stamped.
	big := plaintext("big", "did:ex:alice", `,"pad":"`+strings.Repeat("<", embedded.MaxPayload/5)+`"`)
	bothForms := stampMsg(plaintext("both", "did:ex:alice", ""), didcomm.AttrID, "both")
	strict := stampMsg([]byte(`{"id":"s","from":"did:ex:alice","sender_order":"1"}`))
	strict.Header = nats.Header{"Content-Type": {didcomm.PlaintextMediaType}}
	for _, tc := range []struct {
		name string
		m    *adapter.Message
		want string
	}{
		{"bad value", stampMsg(plaintext("x", "did:ex:alice", ""), AttrDIDComm, "Stamp"), `attribute jetorder-didcomm is "Stamp": the only value is "stamp"`},
		{"not DIDComm", stampMsg([]byte(`{"hello":"world"}`)), "not a DIDComm message"},
		{"not JSON", stampMsg([]byte("plain text")), "not a DIDComm message"},
		{"no id", stampMsg([]byte("opaque"), didcomm.AttrFrom, "did:ex:alice"), "has no id"},
		{"no from", stampMsg([]byte(`{"id":"x","type":"t"}`)), "has no from"},
		{"already sequenced", stampMsg(plaintext("x", "did:ex:alice", `,"sender_order":7`)), "already has sender_order 7; a resend keeps its order"},
		{"two forms", bothForms, "more than one form"},
		{"broken header", stampMsg([]byte("opaque"), didcomm.AttrID, "x", didcomm.AttrFrom, "a", didcomm.AttrSentCount, "0"), "invalid sent_count"},
		{"broken plaintext", strict, "invalid sender_order"},
		{"too large once stamped", stampMsg(big), "once stamped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.publish(stampMsg(plaintext("good", "did:ex:alice", "")), tc.m)
			if !errors.Is(err, adapter.ErrInvalidMessage) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "messages[1]: ") {
				t.Fatalf("got %v, want messages[1]: ErrInvalidMessage with %q", err, tc.want)
			}
		})
	}
	if err := e.publish(stampMsg(plaintext("ok1", "did:ex:alice", ""))); err != nil {
		t.Fatal(err)
	}
	if got := e.orders(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("stored orders %v, want [1 2]: a refused request stored something or took an order", got)
	}
}

// A publish that fails after the reservation, to a topic that does not
// exist, gives its orders back.
func TestStampGivesBackOrdersOfFailedPublish(t *testing.T) {
	e := newStampEnv(t)
	_, err := e.b.Publish(context.Background(), stampProject, "missing", []*adapter.Message{stampMsg(plaintext("lost1", "did:ex:alice", "")), stampMsg(plaintext("lost2", "did:ex:alice", ""))})
	if !errors.Is(err, adapter.ErrTopicNotFound) {
		t.Fatalf("publish to a missing topic: %v", err)
	}
	if err := e.publish(stampMsg(plaintext("ok", "did:ex:alice", ""))); err != nil {
		t.Fatal(err)
	}
	if got := e.orders(); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("stored orders %v, want [1]", got)
	}
}

// Many requests of one sender through one broker, their messages on
// several ordering keys: the broker stores the requests in order. Another
// broker stamping for the same sender at the same time interleaves, with
// no repeat and no hole.
func TestStampConcurrentRequests(t *testing.T) {
	e := newStampEnv(t)
	brokers := []*Broker{e.b, e2broker(t, e.srv)}
	const goroutines, requests, perRequest = 4, 15, 3
	errs := make(chan error, len(brokers)*goroutines)
	var wg sync.WaitGroup
	for bi, b := range brokers {
		for g := range goroutines {
			wg.Go(func() {
				for r := range requests {
					var msgs []*adapter.Message
					for i := range perRequest {
						m := stampMsg(plaintext(fmt.Sprintf("b%d-g%d-r%d-%d", bi, g, r, i), "did:ex:alice", ""))
						m.OrderingKey = fmt.Sprintf("key-%d", (g+r+i)%5)
						msgs = append(msgs, m)
					}
					if _, err := b.Publish(context.Background(), stampProject, e.topic, msgs); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Orders are consecutive within a request, in request order; and a
	// broker stores its requests in order. Messages of one request on
	// different ordering keys have no order among them (as in Pub/Sub).
	firsts := map[string]int{}    // by "b<broker>-g<goroutine>-r<request>": its first order
	lastFirst := map[string]int{} // by broker: the first order of its latest request stored
	var all []uint64
	for _, m := range e.stored() {
		h, err := didcomm.ReadPlaintext(m.data)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, h.SenderOrder)
		var bi, g, r, i int
		if _, err := fmt.Sscanf(h.ID, "b%d-g%d-r%d-%d", &bi, &g, &r, &i); err != nil {
			t.Fatal(err)
		}
		req := fmt.Sprintf("b%d-g%d-r%d", bi, g, r)
		first, seen := firsts[req]
		if !seen {
			first = int(h.SenderOrder) - i
			firsts[req] = first
			b := h.ID[:2]
			if first < lastFirst[b] {
				t.Errorf("broker %s stored request %s (orders from %d) after a later one (from %d)", b, req, first, lastFirst[b])
			}
			lastFirst[b] = first
		}
		if int(h.SenderOrder) != first+i {
			t.Errorf("%s: order %d, want %d: a request's orders are consecutive in request order", h.ID, h.SenderOrder, first+i)
		}
	}
	slices.Sort(all)
	for i, o := range all {
		if o != uint64(i+1) {
			t.Fatalf("orders are not exactly 1..%d: position %d holds %d", len(all), i, o)
		}
	}
	if want := len(brokers) * goroutines * requests * perRequest; len(all) != want {
		t.Fatalf("stored %d messages, want %d", len(all), want)
	}
}
