package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	ce "github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// delivered is what a CloudEvents handler saw of one message.
type delivered struct {
	e      *event.Event
	err    error
	stream uint64
}

// eventLog collects deliveries for assertions on the test goroutine.
type eventLog struct {
	mu  sync.Mutex
	all []delivered
}

func (l *eventLog) handler(ctx context.Context, e *event.Event, m *adapter.Message, err error) {
	l.mu.Lock()
	l.all = append(l.all, delivered{e: e, err: err, stream: m.StreamSequence})
	l.mu.Unlock()
	if err == nil {
		m.Ack()
	}
}

func (l *eventLog) snapshot() []delivered {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]delivered(nil), l.all...)
}

func (l *eventLog) count() int { return len(l.snapshot()) }

func receiveEvents(t *testing.T, sub *adapter.Subscription, l *eventLog) *receiving {
	t.Helper()
	return startReceiving(t, func(ctx context.Context) error { return ce.Receive(ctx, sub, l.handler) })
}

func newTestEvent(source string, i int) event.Event {
	e := ce.NewEvent()
	e.SetID(fmt.Sprint(source, "-", i))
	e.SetSource(source)
	e.SetType("com.example.test")
	e.SetSubject("ünïcödé \"subject\" 100%")
	e.SetTime(time.Now())
	_ = e.SetData("application/json", map[string]int{"i": i})
	return e
}

// Events in both modes go through a topic and an ordered subscription;
// recordedtime arrives byte for byte, stored as the producer wrote it.
func TestCloudEventsRoundTripThroughTopic(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ce-roundtrip")
	sub := e.createSub("ce-roundtrip", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const recorded = "2026-11-21T10:00:00.123+01:00" // a form sdk-go would not write
	var sent []event.Event
	for i, mode := range []ce.Mode{ce.Binary, ce.Structured, ce.Binary, ce.Structured} {
		ev := newTestEvent("/roundtrip", i)
		ev.SetExtension(ce.ExtPartitionKey, "user-1")
		ev.SetExtension(ce.ExtRecordedTime, recorded)
		ev.SetExtension("binaryext", []byte{0, 1, 2})
		if err := ev.SetData("application/octet-stream", []byte{0, 0xff, byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := ce.Publish(ctx, topic, ev, ce.WithMode(mode)).Get(ctx); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		sent = append(sent, ev)
	}
	// The stored message holds the producer's text.
	stored, err := lastStored(t, e, "ce-roundtrip", "user-1")
	if err != nil {
		t.Fatal(err)
	}
	var structured struct {
		RecordedTime string `json:"recordedtime"`
	}
	if err := json.Unmarshal(stored.Data, &structured); err != nil || structured.RecordedTime != recorded {
		t.Fatalf("stored structured event: recordedtime %q (%v)", structured.RecordedTime, err)
	}

	var log eventLog
	receiveEvents(t, sub, &log)
	testutil.Eventually(t, 20*time.Second, func() bool { return log.count() >= len(sent) }, "%d of %d events delivered", log.count, len(sent))
	got := log.snapshot()
	for i, d := range got {
		if d.err != nil {
			t.Fatalf("event %d: %v", i, d.err)
		}
		want := sent[i]
		if d.e.ID() != want.ID() || d.e.Subject() != want.Subject() || string(d.e.Data()) != string(want.Data()) ||
			!d.e.Time().Equal(want.Time()) || d.e.DataContentType() != want.DataContentType() {
			t.Fatalf("event %d:\n got %v\nwant %v", i, d.e, want)
		}
		rt, text, ok, err := ce.RecordedTime(*d.e)
		if err != nil || !ok || text != recorded || !rt.Equal(time.Date(2026, 11, 21, 9, 0, 0, 123e6, time.UTC)) {
			t.Fatalf("event %d: recordedtime %q, %v", i, text, err)
		}
		if seq, _ := ce.Sequence(*d.e); seq != fmt.Sprintf("%020d", d.stream) {
			t.Fatalf("event %d: sequence %q at stream position %d", i, seq, d.stream)
		}
	}
}

// Two publishers (two Topic handles, as two processes would have) publish
// events of one source over several partition keys without a sequence. Every
// delivered event gets a sequence; sorting the source's events by it gives
// exactly the order the topic stored them in, and each key's events arrive
// in publish order.
func TestCloudEventsSequenceAcrossPublishers(t *testing.T) {
	e := newEnv(t)
	topicA := e.createTopic("ce-sequence")
	_, clientB := e.connect()
	topicB := clientB.Topic("ce-sequence")
	sub := e.createSub("ce-sequence", adapter.SubscriptionConfig{Topic: topicA, EnableMessageOrdering: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const perPublisher, keys = 100, 5
	checker := ordercheck.New()
	var results []*adapter.PublishResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p, topic := range []*adapter.Topic{topicA, topicB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perPublisher {
				key := fmt.Sprintf("p%d-k%d", p, i%keys)
				ev := newTestEvent("/orders", p*perPublisher+i)
				ev.SetExtension(ce.ExtPartitionKey, key)
				_ = ev.SetData("text/plain", ordercheck.Encode(key, i/keys))
				checker.Published(key, i/keys)
				r := ce.Publish(ctx, topic, ev)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}

	var log eventLog
	receiveEvents(t, sub, &log)
	total := 2 * perPublisher
	testutil.Eventually(t, 30*time.Second, func() bool { return log.count() >= total }, "%d of %d events", log.count, total)
	bySeq := map[string]uint64{}
	for _, d := range log.snapshot() {
		if d.err != nil {
			t.Fatal(d.err)
		}
		key, idx, err := ordercheck.Decode(d.e.Data())
		if err != nil {
			t.Fatal(err)
		}
		checker.Delivered("s", key, idx) // the handler acks at once
		checker.Acked("s", key, idx)
		seq, ok := ce.Sequence(*d.e)
		if !ok || len(seq) != 20 {
			t.Fatalf("sequence %q", seq)
		}
		if _, dup := bySeq[seq]; dup {
			t.Fatalf("sequence %s given twice", seq)
		}
		bySeq[seq] = d.stream
	}
	if v := checker.Violations(); len(v) > 0 || !checker.Complete("s") {
		t.Fatalf("order: %v; missing: %s", v, checker.Missing("s"))
	}
	if len(bySeq) != total {
		t.Fatalf("%d distinct sequences for %d events", len(bySeq), total)
	}
	var prevSeq string
	var prevStream uint64
	for _, seq := range slices.Sorted(maps.Keys(bySeq)) {
		if seq <= prevSeq || bySeq[seq] <= prevStream {
			t.Fatalf("sequence %s (stream %d) after %s (stream %d)", seq, bySeq[seq], prevSeq, prevStream)
		}
		prevSeq, prevStream = seq, bySeq[seq]
	}
}

// Messages written the way sdk-go's NATS bindings write them, published on
// the topic's subjects with plain NATS, are delivered as events; a message
// that is not a CloudEvent is handed over as an error once, acked, and does
// not hold back its key.
func TestCloudEventsForeignAndUndecodableMessages(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ce-foreign")
	sub := e.createSub("ce-foreign", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetstreamOf(t, e)
	subject := keyrouter.KeyedSubject(project, "ce-foreign", "device-7")

	structured := newTestEvent("/sdk", 1)
	data, err := json.Marshal(structured)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("{broken"),
		Header: nats.Header{"content-type": {ce.StructuredContentType}}}); err != nil {
		t.Fatal(err)
	}
	binary := nats.Header{}
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "sdk-2", "ce-source": "/sdk", "ce-type": "t",
		"ce-subject": "ünescaped ünïcödé", "ce-time": "2026-01-02T03:04:05.000000006Z", "content-type": "text/plain"} {
		binary.Set(k, v)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("hello"), Header: binary}); err != nil {
		t.Fatal(err)
	}

	var log eventLog
	receiveEvents(t, sub, &log)
	testutil.Eventually(t, 20*time.Second, func() bool { return log.count() >= 3 }, "%d of 3 messages", log.count)
	got := log.snapshot()
	if got[0].err != nil || got[0].e.ID() != structured.ID() || got[0].e.Subject() != structured.Subject() {
		t.Fatalf("sdk-go structured: %v %v", got[0].e, got[0].err)
	}
	if !errors.Is(got[1].err, ce.ErrInvalidEvent) || got[1].e != nil {
		t.Fatalf("broken JSON: %v %v", got[1].e, got[1].err)
	}
	if got[2].err != nil || got[2].e.ID() != "sdk-2" || got[2].e.Subject() != "ünescaped ünïcödé" || string(got[2].e.Data()) != "hello" {
		t.Fatalf("sdk-go binary: %v %v", got[2].e, got[2].err)
	}
	// The key's next message came, so the undecodable one was acked: an
	// ordered subscription holds a key until its message is acked.
}

// A subscription created with a start time replays what the topic recorded
// from then on, and nothing before.
func TestSubscriptionStartTimeReplays(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ce-replay")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publishEvents := func(from, n int) {
		for i := from; i < from+n; i++ {
			if _, err := ce.Publish(ctx, topic, newTestEvent("/replay", i), ce.WithOrderingKey("k")).Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	publishEvents(0, 5)
	// The start time is taken from the server's own timestamp of the last
	// early message, so no clock skew is involved.
	last, err := lastStored(t, e, "ce-replay", "k")
	if err != nil {
		t.Fatal(err)
	}
	since := last.Time.Add(time.Nanosecond)
	publishEvents(5, 5)

	for _, tt := range []struct {
		name  string
		start time.Time
		first int
	}{
		{"from the beginning", last.Time.Add(-time.Hour), 0},
		{"from the split", since, 5},
	} {
		sub := e.createSub("replay-"+fmt.Sprint(tt.first), adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, StartTime: tt.start})
		cfg, err := sub.Config(ctx)
		if err != nil || !cfg.StartTime.Equal(tt.start) {
			t.Fatalf("%s: config start time %v (%v)", tt.name, cfg.StartTime, err)
		}
		var log eventLog
		r := receiveEvents(t, sub, &log)
		want := 10 - tt.first
		testutil.Eventually(t, 20*time.Second, func() bool { return log.count() >= want }, "%s: %d of %d events", tt.name, log.count, want)
		r.stop()
		got := log.snapshot()
		if len(got) != want {
			t.Fatalf("%s: %d events, want %d", tt.name, len(got), want)
		}
		for i, d := range got {
			if d.err != nil || d.e.ID() != fmt.Sprint("/replay-", tt.first+i) {
				t.Fatalf("%s: event %d is %v (%v)", tt.name, i, d.e, d.err)
			}
		}
	}
}

// lastStored is the topic's last stored message of key.
func lastStored(t *testing.T, e *env, topicID, key string) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := jetstreamOf(t, e).Stream(ctx, keyrouter.StreamName(project, topicID))
	if err != nil {
		return nil, err
	}
	return stream.GetLastMsgForSubject(ctx, keyrouter.KeyedSubject(project, topicID, key))
}

// An event Publish cannot encode fails with an error naming the attribute,
// and, having a partition key, pauses that key like any refused message.
func TestCloudEventsInvalidEventPausesItsKey(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ce-invalid")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := newTestEvent("/invalid", 0)
	bad.SetExtension(ce.ExtPartitionKey, "k")
	bad.SetExtension(ce.ExtRecordedTime, "not a time")
	if _, err := ce.Publish(ctx, topic, bad).Get(ctx); !errors.Is(err, ce.ErrInvalidEvent) || !strings.Contains(err.Error(), "recordedtime") {
		t.Fatalf("invalid event: %v", err)
	}
	good := newTestEvent("/invalid", 1)
	good.SetExtension(ce.ExtPartitionKey, "k")
	if _, err := ce.Publish(ctx, topic, good).Get(ctx); !errors.Is(err, adapter.ErrPublishingPaused) {
		t.Fatalf("next event of the key: %v, want ErrPublishingPaused", err)
	}
	if _, err := ce.Publish(ctx, topic, newTestEvent("/invalid", 2), ce.WithOrderingKey("other")).Get(ctx); err != nil {
		t.Fatalf("another key: %v", err)
	}
	topic.ResumePublish("k")
	if _, err := ce.Publish(ctx, topic, good).Get(ctx); err != nil {
		t.Fatalf("after ResumePublish: %v", err)
	}
}

// An event published through Google's Go client is stamped as one
// published over HTTP: recordedtime when it has none. Delivered to the Go
// client, an event without a sequence gets its position in the topic as
// one, as the library's Decode gives it; what the producer wrote is kept.
// Binary mode (ce-* attributes) and structured mode (a JSON body) alike.
func TestCloudEventsGoClientStamps(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "stamped")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("stamped"), Topic: topicPath("stamped")})
	pub := c.Publisher("stamped")
	defer pub.Stop()
	binary := map[string]string{"ce-specversion": "1.0", "ce-id": "b1", "ce-source": "/go", "ce-type": "t"}
	kept := map[string]string{"ce-specversion": "1.0", "ce-id": "b2", "ce-source": "/go", "ce-type": "t",
		"ce-sequence": "7", "ce-recordedtime": "2026-01-02T03:04:05.000006Z"}
	structured := map[string]string{"content-type": "application/cloudevents+json"}
	ctx := context.Background()
	for _, m := range []*pubsub.Message{
		{Data: []byte("b1"), Attributes: binary},
		{Data: []byte("b2"), Attributes: kept},
		{Data: []byte(`{"specversion":"1.0","id":"s1","source":"/go","type":"t","data":"s1"}`), Attributes: structured},
	} {
		if _, err := pub.Publish(ctx, m).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := receiveAll(t, c.Subscriber("stamped"), 3, nil)
	seqPattern := regexp.MustCompile(`^[0-9]{20}$`)
	for _, m := range got {
		switch id := m.Attributes["ce-id"]; {
		case id == "b1":
			if !seqPattern.MatchString(m.Attributes["ce-sequence"]) {
				t.Errorf("b1: ce-sequence %q, want the stream sequence in 20 digits", m.Attributes["ce-sequence"])
			}
			if _, err := time.Parse(time.RFC3339Nano, m.Attributes["ce-recordedtime"]); err != nil {
				t.Errorf("b1: ce-recordedtime %q: %v", m.Attributes["ce-recordedtime"], err)
			}
		case id == "b2":
			if m.Attributes["ce-sequence"] != "7" || m.Attributes["ce-recordedtime"] != kept["ce-recordedtime"] {
				t.Errorf("b2: the producer's sequence and recordedtime changed: %v", m.Attributes)
			}
		default:
			var e map[string]any
			if err := json.Unmarshal(m.Data, &e); err != nil || e["id"] != "s1" {
				t.Fatalf("structured event delivered as %s (%v)", m.Data, err)
			}
			if s, _ := e["sequence"].(string); !seqPattern.MatchString(s) {
				t.Errorf("structured: sequence %v, want the stream sequence in 20 digits", e["sequence"])
			}
			if r, _ := e["recordedtime"].(string); r == "" {
				t.Errorf("structured: no recordedtime in %s", m.Data)
			} else if _, err := time.Parse(time.RFC3339Nano, r); err != nil {
				t.Errorf("structured: recordedtime %q: %v", r, err)
			}
		}
	}
}
