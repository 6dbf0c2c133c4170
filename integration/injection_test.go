package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Subject injection: ordering keys and topic, subscription and project
// names hold the characters NATS subjects interpret ('.', '*', '>'),
// whitespace, control bytes and escapes that a naive mapping would
// interpret, merge or split. Each is either refused with a clear error,
// storing nothing, or kept apart: every key and topic gets exactly its own
// messages, in order, and never another's.

// trickyKeys are valid ordering keys, each distinct from every other.
func trickyKeys() []string {
	long := strings.Repeat("a.", keyrouter.MaxKeyBytes/2) // 1024 bytes: hash form
	return []string{
		"a", "A", "a.b", "a.*", "a.>", "*", ">", "a.b.>", ".", "..", "a.",
		"a b", "a\tb", "a\nb", "a\rb", "a\r\nb", "a\x00b", "\x00", "\x7f", " ", "a ", " a",
		"a%2Eb", "a%2eb", "a_2Eb", "a-b", "a_b", "a/b", "a+b", "a:b", "%", "%%", "%25", "%2E",
		"é", "e\u0301", "😀", "\u2024", // U+2024 ONE DOT LEADER looks like '.'
		strings.Repeat("x", keyrouter.MaxTokenBytes),   // the longest readable token
		strings.Repeat("x", keyrouter.MaxTokenBytes+1), // the shortest in hash form
		strings.Repeat(".", 85) + "a",                  // encodes to 256 bytes
		strings.Repeat(".", 86),                        // encodes to 258: hash form
		long, long[:len(long)-1] + "b",                 // 1024 bytes each, one byte apart
		keyrouter.KeyToken(long), // spells another key's hash token
	}
}

// refusedKeys are keys Publish refuses, with the error it gives.
func refusedKeys() map[string]error {
	return map[string]error{
		"\xff":                         keyrouter.ErrOrderingKeyNotUTF8,
		"a.\xc3":                       keyrouter.ErrOrderingKeyNotUTF8,
		"\xed\xa0\x80":                 keyrouter.ErrOrderingKeyNotUTF8, // an encoded UTF-16 surrogate
		strings.Repeat("k", 1025):      keyrouter.ErrOrderingKeyTooLong,
		strings.Repeat("é", 512) + ".": keyrouter.ErrOrderingKeyTooLong,
	}
}

// trickyTopics are topic ids that differ only in characters a naive subject or
// stream mapping would merge, each with the ordering key it publishes
// under ("top" with key "ic.x" against "top.ic" with key "x", and so on).
func trickyTopics() [][2]string {
	return [][2]string{
		{"top.ic", "x"}, {"top-ic", "x"}, {"top_ic", "x"}, {"top~ic", "x"}, {"top+ic", "x"}, {"top%ic", "x"},
		{"top%2Eic", "x"}, {"top_2Eic", "x"}, {"top_5F2Eic", "x"}, {"TOP.ic", "x"},
		{"top", "ic.x"}, {"top", "ic"}, {"top.ic.k", "x"}, {"top.ic", "k.x"}, {"top.ic.k.x", ""}, {"top.ic.u", ""},
	}
}

// refusedTopics are topic ids CreateTopic refuses.
var refusedTopics = []string{
	"a b", "a*b", "ab>", "ab.>", "a\x00b", "a\nb", "a\tb", "a\xffb", "a/b", "a:b", "1ab", "ab", "", "goog-topic", "GOOG.x",
	"ab\u2024", strings.Repeat("t", 256),
}

// keyReader checks what one subscription delivers. Each payload is
// ordercheck.Encode(label, index); match says whether a label may arrive
// with an ordering key. With ordering, the ordering checker watches every
// delivery (unkeyed messages as a set); without, every message must arrive
// once, in any order. Either way no message may come twice: nothing here
// nacks or lets a deadline pass, so a second delivery means a message
// reached a consumer that is not its key's.
type keyReader struct {
	sub     string
	ordered bool
	match   func(label, key string) bool
	chk     *ordercheck.Checker

	mu    sync.Mutex
	want  map[string]int         // label -> messages published (without ordering)
	got   map[string]map[int]int // label -> index -> deliveries
	fails []string
}

func newKeyReader(sub string, ordered bool, match func(label, key string) bool) *keyReader {
	return &keyReader{sub: sub, ordered: ordered, match: match, chk: ordercheck.New(), want: map[string]int{}, got: map[string]map[int]int{}}
}

// sameKey matches a payload labelled with the key it was published under.
func sameKey(label, key string) bool { return label == key }

func (r *keyReader) published(label, key string, i int) {
	if r.ordered {
		r.chk.Published(checkerKey(label, key), i)
		return
	}
	r.mu.Lock()
	r.want[label]++
	r.mu.Unlock()
}

// checkerKey: unkeyed messages are the checker's key "".
func checkerKey(label, key string) string {
	if key == "" {
		return ""
	}
	return label
}

// deliver checks one delivery and returns what to call right before acking
// it.
func (r *keyReader) deliver(data []byte, key string, attempt int) (acking func()) {
	label, i, err := ordercheck.Decode(data)
	switch {
	case err != nil || !r.match(label, key):
		r.fail("got %q with ordering key %q", data, key)
		return func() {}
	case attempt > 1:
		r.fail("%q delivered %d times", data, attempt)
	}
	if r.ordered {
		ck := checkerKey(label, key)
		r.chk.Delivered(r.sub, ck, i)
		return func() { r.chk.Acked(r.sub, ck, i) }
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got[label] == nil {
		r.got[label] = map[int]int{}
	}
	if r.got[label][i]++; r.got[label][i] > 1 {
		r.fails = append(r.fails, fmt.Sprintf("%q delivered twice", data))
	}
	return func() {}
}

func (r *keyReader) fail(format string, args ...any) {
	r.mu.Lock()
	r.fails = append(r.fails, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *keyReader) missing() string {
	if r.ordered {
		return r.chk.Missing(r.sub)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for label, n := range r.want {
		if len(r.got[label]) < n {
			return fmt.Sprintf("%q: %d of %d", label, len(r.got[label]), n)
		}
	}
	return ""
}

func (r *keyReader) failures() []string {
	r.mu.Lock()
	fails := append([]string(nil), r.fails...)
	r.mu.Unlock()
	if r.ordered {
		fails = append(fails, r.chk.Violations()...)
		if st := r.chk.Stats(r.sub); st.Redeliveries > 0 {
			fails = append(fails, fmt.Sprintf("%d redeliveries", st.Redeliveries))
		}
	}
	return fails
}

// assertReaders waits until every reader has every message, then fails
// on anything any of them saw wrong.
func assertReaders(t *testing.T, readers ...*keyReader) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, r := range readers {
			if r.missing() != "" {
				return false
			}
		}
		return true
	}, "not everything delivered: %s", func() string {
		var b strings.Builder
		for _, r := range readers {
			if m := r.missing(); m != "" {
				fmt.Fprintf(&b, "%s: %.200s; ", r.sub, m)
			}
		}
		return b.String()
	})
	for _, r := range readers {
		if f := r.failures(); len(f) > 0 {
			t.Fatalf("%s: %d failures, first: %.300s", r.sub, len(f), f[0])
		}
	}
}

// receiveInto runs a library Receive of r's subscription until the test
// ends.
func receiveInto(t *testing.T, c *adapter.Client, r *keyReader) {
	t.Helper()
	startReceive(t, c.Subscription(r.sub), func(_ context.Context, m *adapter.Message) {
		r.deliver(m.Data, m.OrderingKey, m.DeliveryAttempt)()
		m.Ack()
	})
}

// receiveRawInto reads r's subscription through a raw StreamingPull stream,
// acking each message with Acknowledge, until the test ends.
func receiveRawInto(t *testing.T, subc pb.SubscriberClient, r *keyReader) {
	t.Helper()
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath(r.sub), StreamAckDeadlineSeconds: 60})
	go func() {
		for {
			var m *pb.ReceivedMessage
			select {
			case m = <-rs.msgs:
			case <-rs.stream.Context().Done():
				return
			}
			r.deliver(m.GetMessage().GetData(), m.GetMessage().GetOrderingKey(), int(m.GetDeliveryAttempt()))()
			_, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath(r.sub), AckIds: []string{m.GetAckId()}})
			if err != nil {
				if status.Code(err) != codes.Canceled {
					r.fail("Acknowledge: %v", err)
				}
				return
			}
		}
	}()
}

// assertSubjects checks what JetStream stored for a topic: per key
// exactly n messages, each on its key's own subject, a literal subject of
// eleven tokens; and every per-key consumer of the subscriptions subs
// filters on exactly one of those subjects, under the name keyrouter gives
// that key (a consumer with a wildcard would take other keys' messages).
func assertSubjects(t *testing.T, js jetstream.JetStream, proj, topic string, keys []string, n int, subs ...string) {
	t.Helper()
	ctx := context.Background()
	stream, err := js.Stream(ctx, keyrouter.StreamName(proj, topic))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(keyrouter.KeyedFilter(proj, topic)))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != len(keys) {
		t.Fatalf("%d keyed subjects stored for %d keys", len(info.State.Subjects), len(keys))
	}
	consumerOf := map[string]string{} // consumer name -> the one subject it may filter on
	for _, k := range keys {
		subj := keyrouter.KeyedSubject(proj, topic, k)
		if got := info.State.Subjects[subj]; got != uint64(n) {
			t.Fatalf("key %.40q: %d messages on %.80s, want %d", k, got, subj, n)
		}
		if strings.Count(subj, ".") != 10 || strings.ContainsAny(subj, "*> \t\r\n\x00") {
			t.Fatalf("key %.40q: subject %q is not eleven literal tokens", k, subj)
		}
		for _, s := range subs {
			consumerOf[keyrouter.KeyConsumer(proj, s, keyrouter.KeyToken(k))] = subj
		}
	}
	perKey := 0
	for c := range stream.ListConsumers(ctx).Info() {
		for _, s := range subs {
			if !strings.HasPrefix(c.Name, keyrouter.KeyConsumerPrefix(proj, s)) {
				continue
			}
			perKey++
			want, ok := consumerOf[c.Name]
			if !ok || c.Config.FilterSubject != want || len(c.Config.FilterSubjects) > 0 {
				t.Fatalf("per-key consumer %s filters on %q %q, want %q", c.Name, c.Config.FilterSubject, c.Config.FilterSubjects, want)
			}
		}
	}
	t.Logf("%d per-key consumers checked", perKey)
}

// The library: every key of trickyKeys on one topic, published interleaved
// with unkeyed messages, reaches an ordered and an unordered subscription
// exactly once each, in order, with its own key; JetStream holds each key
// on its own literal subject. The keys of refusedKeys are refused with
// the key's error and store nothing.
func TestInjectionKeysLibrary(t *testing.T) {
	e := newEnv(t)
	const topicID, per = "inj-keys", 3
	topic := e.createTopic(topicID)
	defer topic.Stop()
	ordered := newKeyReader("inj-keys-ordered", true, sameKey)
	plain := newKeyReader("inj-keys-plain", false, sameKey)
	for _, r := range []*keyReader{ordered, plain} {
		e.createSub(r.sub, adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: r.ordered, AckDeadline: time.Minute})
	}
	ctx := context.Background()

	for key, want := range refusedKeys() {
		_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("x"), OrderingKey: key}).Get(ctx)
		if !errors.Is(err, want) {
			t.Fatalf("Publish with key %.40q: %v, want %v", key, err, want)
		}
	}

	keys := trickyKeys()
	var results []*adapter.PublishResult
	for i := range per {
		for _, k := range append(keys, "") {
			results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(k, i), OrderingKey: k}))
			ordered.published(k, k, i)
			plain.published(k, k, i)
		}
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	receiveInto(t, e.client, ordered)
	receiveInto(t, e.client, plain)
	assertReaders(t, ordered, plain)
	js := jetstreamOf(t, e)
	assertSubjects(t, js, project, topicID, keys, per, ordered.sub)
	assertStored(t, js, project, topicID, per*(len(keys)+1))
}

// assertStored fails unless a topic holds exactly n messages: what was
// refused stored nothing.
func assertStored(t *testing.T, js jetstream.JetStream, proj, topic string, n int) {
	t.Helper()
	stream, err := js.Stream(context.Background(), keyrouter.StreamName(proj, topic))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(n) {
		t.Fatalf("topic %s/%s holds %d messages, want %d: something refused was stored", proj, topic, info.State.Msgs, n)
	}
}

// trickyName is one (project, topic, key) and the subscription reading it.
type trickyName struct{ project, topic, key, sub string }

func (n trickyName) label() string { return n.project + "/" + n.topic + "/" + n.key }

// trickyNames are the topics of trickyTopics in the test project, plus one topic
// id in projects whose ids differ only in '.', '_', '-', ':' and '~'. Each
// subscription id is the topic id with a prefix, so subscriptions differ
// in the same characters.
func trickyNames(withProjects bool) []trickyName {
	var ns []trickyName
	for i, tk := range trickyTopics() {
		ns = append(ns, trickyName{project, tk[0], tk[1], "s" + strings.ToLower(tk[0]) + fmt.Sprint(i)})
	}
	if withProjects {
		for _, p := range []string{"test.project", "test_project", "test:project", "test~project", "test-project.x"} {
			ns = append(ns, trickyName{p, "shared.topic", "k", "shared.sub"})
		}
	}
	return ns
}

// readersByName gives each name an ordered reader that expects every
// message published to its topic, whatever the key.
func readersByName(names []trickyName) map[trickyName]*keyReader {
	readers := map[trickyName]*keyReader{}
	for _, n := range names {
		prefix := n.project + "/" + n.topic + "/"
		name := n.sub
		if n.project != project {
			name = n.project + "/" + n.sub
		}
		readers[n] = newKeyReader(name, true, func(label, key string) bool { return label == prefix+key })
	}
	return readers
}

// markPublished records message i of n with every reader of n's topic.
func markPublished(readers map[trickyName]*keyReader, n trickyName, i int) {
	for reader, r := range readers {
		if reader.project == n.project && reader.topic == n.topic {
			r.published(n.label(), n.key, i)
		}
	}
}

func mapValues[K comparable, V any](m map[K]V) []V {
	vs := make([]V, 0, len(m))
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

// The library: topics, subscriptions and projects whose names differ only
// in characters a naive mapping merges are separate streams and consumers:
// each subscription gets exactly its topic's messages, in order. Invalid
// names are refused with a clear error and create nothing.
func TestInjectionNamesLibrary(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	js := jetstreamOf(t, e)
	streamsBefore := streamCount(t, js)

	for _, id := range refusedTopics {
		if _, err := e.client.CreateTopic(ctx, id); !errors.Is(err, keyrouter.ErrInvalidTopicID) {
			t.Fatalf("CreateTopic(%q): %v, want ErrInvalidTopicID", id, err)
		}
		if _, err := e.client.Topic(id).Publish(ctx, &adapter.Message{Data: []byte("x")}).Get(ctx); !errors.Is(err, keyrouter.ErrInvalidTopicID) {
			t.Fatalf("Publish to %q: %v, want ErrInvalidTopicID", id, err)
		}
	}
	for _, p := range []string{"a b", "a.*", "a>", "", "-a", "a\x00", "a\xff", "a/b", strings.Repeat("p", 101)} {
		if _, err := adapter.NewClient(e.nc, p); !errors.Is(err, keyrouter.ErrInvalidProjectID) {
			t.Fatalf("NewClient(%q): %v, want ErrInvalidProjectID", p, err)
		}
	}
	if got := streamCount(t, js); got != streamsBefore {
		t.Fatalf("%d streams after refused names, %d before", got, streamsBefore)
	}

	clients := map[string]*adapter.Client{project: e.client}
	topics := map[string]*adapter.Topic{}
	names := trickyNames(true)
	for _, n := range names {
		c := clients[n.project]
		if c == nil {
			var err error
			if c, err = adapter.NewClient(e.nc, n.project); err != nil {
				t.Fatalf("NewClient(%q): %v", n.project, err)
			}
			clients[n.project] = c
		}
		tp := topics[n.project+"/"+n.topic]
		if tp == nil {
			var err error
			if tp, err = c.CreateTopic(ctx, n.topic); err != nil {
				t.Fatalf("CreateTopic(%s/%s): %v", n.project, n.topic, err)
			}
			defer tp.Stop()
			topics[n.project+"/"+n.topic] = tp
		}
		if _, err := c.CreateSubscription(ctx, n.sub, withTestDelivery(adapter.SubscriptionConfig{Topic: tp, EnableMessageOrdering: true, AckDeadline: time.Minute})); err != nil {
			t.Fatalf("CreateSubscription(%s/%s): %v", n.project, n.sub, err)
		}
	}

	const per = 3
	readers := readersByName(names)
	var results []*adapter.PublishResult
	for i := range per {
		for _, n := range names {
			results = append(results, topics[n.project+"/"+n.topic].Publish(ctx, &adapter.Message{Data: ordercheck.Encode(n.label(), i), OrderingKey: n.key}))
			markPublished(readers, n, i)
		}
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	for n, r := range readers {
		startReceive(t, clients[n.project].Subscription(n.sub), func(_ context.Context, m *adapter.Message) {
			r.deliver(m.Data, m.OrderingKey, m.DeliveryAttempt)()
			m.Ack()
		})
	}
	assertReaders(t, mapValues(readers)...)
	if got := streamCount(t, js); got != streamsBefore+len(topics) {
		t.Fatalf("%d streams for %d topics", got-streamsBefore, len(topics))
	}
}

// streamCount counts the topic streams (the KV buckets' streams are
// KV_...).
func streamCount(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	n := 0
	names := js.StreamNames(context.Background())
	for name := range names.Name() {
		if strings.HasPrefix(name, "JO_") {
			n++
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// The sidecar: every key of trickyKeys reaches an ordered and an unordered
// subscription exactly once, in order, through StreamingPull, published in
// rounds alternately through the gRPC and the HTTP API (so both map a key
// to the same subject). Keys the APIs refuse store nothing, including JSON
// escapes that encoding/json would have turned into U+FFFD, merging keys.
func TestInjectionKeysSidecar(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	pubc, subc := sc.RawClients()
	ctx := context.Background()
	const topicID, per = "inj-keys", 4
	if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath(topicID)}); err != nil {
		t.Fatal(err)
	}
	ordered := newKeyReader("inj-keys-ordered", true, sameKey)
	plain := newKeyReader("inj-keys-plain", false, sameKey)
	for _, r := range []*keyReader{ordered, plain} {
		if _, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath(r.sub), Topic: topicPath(topicID), EnableMessageOrdering: r.ordered, AckDeadlineSeconds: 60}); err != nil {
			t.Fatal(err)
		}
	}

	long := strings.Repeat("k", keyrouter.MaxKeyBytes+1)
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath(topicID), Messages: []*pb.PubsubMessage{{Data: []byte("x"), OrderingKey: long}}}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), keyrouter.ErrOrderingKeyTooLong.Error()) {
		t.Fatalf("gRPC publish with a %d-byte key: %v", len(long), err)
	}
	publishURL := "http://" + sc.HTTP + "/v1/projects/" + project + "/topics/" + topicID + ":publish"
	for _, tc := range []struct{ body, want string }{
		{`{"messages":[{"data":"eA==","orderingKey":"\ud800"}]}`, `invalid JSON at byte 43: \ud800 is half of a UTF-16 surrogate pair, not a character`},
		{`{"messages":[{"data":"eA==","orderingKey":"a\udfff"}]}`, `invalid JSON at byte 44: \udfff is half of a UTF-16 surrogate pair, not a character`},
		{`{"messages":[{"data":"eA==","orderingKey":"\udbff\u0041"}]}`, `invalid JSON at byte 43: \udbff is half of a UTF-16 surrogate pair, not a character`},
		{`{"messages":[{"data":"eA==","orderingKey":"ok"},{"data":"eA==","orderingKey":"\ud83d"}]}`, `\ud83d is half of a UTF-16 surrogate pair`},
		{`{"messages":[{"data":"eA==","orderingKey":"` + long + `"}]}`, keyrouter.ErrOrderingKeyTooLong.Error()},
		{"{\"messages\":[{\"data\":\"eA==\",\"orderingKey\":\"\xff\"}]}", "invalid JSON: the body is not UTF-8"},
		{`{"messages":[{"data":"eA==","orderingKey":""}]}`, keyrouter.ErrEmptyOrderingKey.Error()},
	} {
		code, msg := postJSON(t, publishURL, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("HTTP publish %.80s: %d %q, want 400 %q", tc.body, code, msg, tc.want)
		}
	}

	keys := trickyKeys()
	for i := range per {
		var msgs []*pb.PubsubMessage
		var jsonMsgs []string
		for _, k := range append(keys, "") {
			data := ordercheck.Encode(k, i)
			ordered.published(k, k, i)
			plain.published(k, k, i)
			msgs = append(msgs, &pb.PubsubMessage{Data: data, OrderingKey: k})
			jm := fmt.Sprintf(`{"data":%q`, b64(data))
			if k != "" {
				jm += `,"orderingKey":` + jsonString(k)
			}
			jsonMsgs = append(jsonMsgs, jm+"}")
		}
		if i%2 == 0 {
			if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath(topicID), Messages: msgs}); err != nil {
				t.Fatalf("gRPC publish round %d: %v", i, err)
			}
		} else if code, msg := postJSON(t, publishURL, `{"messages":[`+strings.Join(jsonMsgs, ",")+`]}`); code != http.StatusOK {
			t.Fatalf("HTTP publish round %d: %d %s", i, code, msg)
		}
	}
	receiveRawInto(t, subc, ordered)
	receiveRawInto(t, subc, plain)
	assertReaders(t, ordered, plain)
	assertSubjects(t, js, project, topicID, keys, per, ordered.sub)
	assertStored(t, js, project, topicID, per*(len(keys)+1))
}

// The sidecar: the topics of trickyTopics, with subscriptions whose names
// differ the same way, through the gRPC API: each subscription gets
// exactly its topic's messages in order; invalid names are refused with
// INVALID_ARGUMENT and create nothing.
func TestInjectionNamesSidecar(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	pubc, subc := sc.RawClients()
	ctx := context.Background()
	streamsBefore := streamCount(t, js)

	for _, id := range refusedTopics {
		if strings.Contains(id, "\xff") {
			continue // a proto string must be UTF-8: hostile_test sends that one as raw bytes
		}
		_, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath(id)})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "invalid topic name") {
			t.Fatalf("CreateTopic(%q): %v, want INVALID_ARGUMENT invalid topic name", id, err)
		}
		_, err = subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath(id), Topic: topicPath("top.ic")})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "invalid subscription name") {
			t.Fatalf("CreateSubscription(%q): %v, want INVALID_ARGUMENT invalid subscription name", id, err)
		}
	}
	for _, name := range []string{"projects/a b/topics/top.ic", "projects/a.*/topics/top.ic", "projects/test-project/topics/top.ic/x",
		"projects/test-project/topics/", "projects//topics/top.ic", "projects/test-project/subscriptions/top.ic", "projects/test-project/topics/top.ic\x00",
		"Projects/test-project/topics/top.ic", "projects/test-project/topics/top.ic "} {
		if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: name}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("CreateTopic(%q): %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if got := streamCount(t, js); got != streamsBefore {
		t.Fatalf("%d streams after refused names, %d before", got, streamsBefore)
	}

	names := trickyNames(false)
	created := map[string]bool{}
	for _, n := range names {
		if !created[n.topic] {
			if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath(n.topic)}); err != nil {
				t.Fatalf("CreateTopic(%s): %v", n.topic, err)
			}
			created[n.topic] = true
		}
		if _, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath(n.sub), Topic: topicPath(n.topic), EnableMessageOrdering: true, AckDeadlineSeconds: 60}); err != nil {
			t.Fatalf("CreateSubscription(%s): %v", n.sub, err)
		}
	}
	const per = 3
	readers := readersByName(names)
	for i := range per {
		for _, n := range names {
			if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath(n.topic), Messages: []*pb.PubsubMessage{{Data: ordercheck.Encode(n.label(), i), OrderingKey: n.key}}}); err != nil {
				t.Fatalf("publish to %s: %v", n.topic, err)
			}
			markPublished(readers, n, i)
		}
	}
	for _, r := range readers {
		receiveRawInto(t, subc, r)
	}
	assertReaders(t, mapValues(readers)...)
	if got := streamCount(t, js); got != streamsBefore+len(created) {
		t.Fatalf("%d streams for %d topics", got-streamsBefore, len(created))
	}
}

// postJSON posts body and returns the status and the error message, if
// any.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, errorMessage(t, resp)
}

// jsonString writes s as a JSON string, every byte outside printable
// ASCII as a \u escape of its rune, so control bytes travel escaped.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// errorMessage is the message of the API's JSON error body ("" for a
// success).
func errorMessage(t *testing.T, resp *http.Response) string {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	var eb struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error.Code != resp.StatusCode {
		t.Fatalf("status %d with body %q: not a JSON error of that code (%v)", resp.StatusCode, body, err)
	}
	return eb.Error.Message
}

func b64(data []byte) string { return base64.StdEncoding.EncodeToString(data) }
