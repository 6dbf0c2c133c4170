package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/internal/testutil"
)

// encodeURIComponent is JavaScript's: every byte of the UTF-8 form but
// A-Z a-z 0-9 - _ . ! ~ * ' ( ) as %XX.
func encodeURIComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// plaintext is a DIDComm plaintext message of thread from sender, with
// sender_order order.
func plaintext(t *testing.T, thread, from string, order uint64) []byte {
	t.Helper()
	data, err := json.Marshal(map[string]any{
		"id":           fmt.Sprintf("%s-%s-%d", thread, from, order),
		"type":         "https://example.org/auction/1.0/bid",
		"thid":         thread,
		"from":         from,
		"sender_order": order,
		"body":         map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// handled is what a didcomm handler saw of one message.
type handled struct {
	thread, from string
	order        uint64
	tracked      bool
	err          error
}

// trackedSub creates topic id and its subscription id+"-sub" with the
// given labels, and runs didcomm.Receive on it with the subscription's
// tracker until the test ends, acking every message. What each handler
// saw arrives on the channel.
func (e *env) trackedSub(t *testing.T, id string, labels map[string]string) (*adapter.Topic, <-chan handled) {
	t.Helper()
	ctx := t.Context()
	topic, err := e.client.CreateTopic(ctx, id)
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	sub, err := e.client.CreateSubscription(ctx, id+"-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Labels: labels})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	tr, err := didcomm.OpenSubscriptionTracker(ctx, sub)
	if err != nil {
		t.Fatalf("open tracker: %v", err)
	}
	ch := make(chan handled, 100)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- didcomm.Receive(rctx, sub, tr, func(ctx context.Context, d *didcomm.Delivery) {
			select {
			case ch <- handled{d.Headers.ThreadID(), d.Headers.From, d.Headers.SenderOrder, d.Tracked, d.Err}:
				d.Ack()
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receive: %v", err)
		}
	})
	return topic, ch
}

// send publishes a DIDComm plaintext message on the sender's key.
func send(t *testing.T, topic *adapter.Topic, thread, from string, order uint64) {
	t.Helper()
	m := &adapter.Message{Data: plaintext(t, thread, from, order), OrderingKey: from}
	if _, err := topic.Publish(t.Context(), m).Get(t.Context()); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// awaitTracked waits for n messages to be handed over, each tracked.
func awaitTracked(t *testing.T, ch <-chan handled, n int) {
	t.Helper()
	for range n {
		select {
		case h := <-ch:
			if !h.tracked || h.err != nil {
				t.Fatalf("%s/%s/%d handed over untracked: %v", h.thread, h.from, h.order, h.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("message not handed over within 10s")
		}
	}
}

// rawGet sends GET path with the path as it is, unlike http.Client, which
// escapes what needs escaping. Unlike raw, it keeps its sending side open:
// the server cancels a request whose connection was closed.
func rawGet(t *testing.T, srv *httptest.Server, path string) response {
	t.Helper()
	return exchange(t, srv, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", false)
}

// threadBody is the thread response with received_orders as sent.
type threadBody struct {
	Thread         string          `json:"thread"`
	ReceivedOrders json.RawMessage `json:"received_orders"`
}

func getThread(t *testing.T, url string) (response, threadBody) {
	t.Helper()
	r := do(t, http.MethodGet, url, nil, nil)
	var tb threadBody
	if r.code == http.StatusOK {
		if err := json.Unmarshal(r.body, &tb); err != nil {
			t.Fatalf("body %q: %v", r.body, err)
		}
	}
	return r, tb
}

// The specification's auction, in a thread whose id needs escaping: the
// HTTP API shows what the subscription's tracker saved.
func TestDIDCommThread(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	topic, ch := e.trackedSub(t, "auction", map[string]string{broker.LabelDIDComm: broker.DIDCommTrack})
	const thread = "auction/1 100% ?#+ café"
	path := "/subscriptions/auction-sub/didcomm/threads/" + encodeURIComponent(thread)
	url := e.srv.URL + "/v1/projects/" + project + path

	r, tb := getThread(t, url)
	if r.code != http.StatusOK || tb.Thread != thread || string(tb.ReceivedOrders) != "[]" {
		t.Fatalf("thread before any message: %d %s", r.code, r.body)
	}

	send(t, topic, thread, "did:ex:bob", 1)
	send(t, topic, thread, "did:ex:bob", 2)
	send(t, topic, thread, "did:ex:alice", 1)
	send(t, topic, thread, "did:ex:alice", 4)
	const want = `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[2,3]}]`
	var last response
	testutil.Eventually(t, 10*time.Second, func() bool {
		r, tb := getThread(t, url)
		last = r
		return r.code == http.StatusOK && string(tb.ReceivedOrders) == want
	}, "GET %s: %v, want received_orders %s", url, func() string { return fmt.Sprintf("%d %s", last.code, last.body) }, want)
	awaitTracked(t, ch, 4)

	r, tb = getThread(t, e.srv.URL+"/v1"+path)
	if r.code != http.StatusOK || tb.Thread != thread || string(tb.ReceivedOrders) != want {
		t.Errorf("default-project route: %d %s", r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	r = do(t, http.MethodHead, url, nil, nil)
	if r.code != http.StatusOK || len(r.body) != 0 {
		t.Errorf("HEAD: %d %q", r.code, r.body)
	}
	r, tb = getThread(t, e.srv.URL+"/v1/projects/"+project+"/subscriptions/auction-sub/didcomm/threads/auction")
	if r.code != http.StatusOK || tb.Thread != "auction" || string(tb.ReceivedOrders) != "[]" {
		t.Errorf("unknown thread: %d %s", r.code, r.body)
	}
}

// A thread id is one path segment, percent-decoded once: each case's
// thread has its own last order, so a path that reached another thread
// would show.
func TestDIDCommThreadEscaping(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	topic, ch := e.trackedSub(t, "escaping", map[string]string{broker.LabelDIDComm: broker.DIDCommTrack})
	threads := []string{
		"a/b", "trailing/", "/leading", "100%", "%2F", "what?", "#frag", "a b", "a+b",
		"café ☃", "../x", "a/../b", "..", ".", "semi;colon&eq=", `"quoted"<tag>`,
	}
	for i, thread := range threads {
		send(t, topic, thread, "did:ex:carol", uint64(i+1))
	}
	awaitTracked(t, ch, len(threads))
	base := e.srv.URL + "/v1/projects/" + project + "/subscriptions/escaping-sub/didcomm/threads/"
	lastOf := map[string]int{}
	for i, thread := range threads {
		lastOf[thread] = i + 1
	}

	tests := []struct {
		name, segment, thread string
	}{
		{"slash", "a%2Fb", "a/b"},
		{"slash in lower-case hex", "a%2fb", "a/b"},
		{"trailing slash", "trailing%2F", "trailing/"},
		{"leading slash", "%2Fleading", "/leading"},
		{"percent", "100%25", "100%"},
		{"percent-encoded text is decoded once", "%252F", "%2F"},
		{"question mark", "what%3F", "what?"},
		{"hash", "%23frag", "#frag"},
		{"space", "a%20b", "a b"},
		{"plus is a plus", "a+b", "a+b"},
		{"encoded plus", "a%2Bb", "a+b"},
		{"non-ASCII", "caf%C3%A9%20%E2%98%83", "café ☃"},
		{"dot-dot then slash", "..%2Fx", "../x"},
		{"dot-dot between slashes", "a%2F..%2Fb", "a/../b"},
		{"dot-dot encoded", "%2E%2E", ".."},
		{"dot encoded", "%2E", "."},
		{"sub-delims", "semi%3Bcolon%26eq%3D", "semi;colon&eq="},
		{"sub-delims as they are", "semi;colon&eq=", "semi;colon&eq="},
		{"quotes and angle brackets", "%22quoted%22%3Ctag%3E", `"quoted"<tag>`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, tb := getThread(t, base+tc.segment)
			want := fmt.Sprintf(`[{"id":"did:ex:carol","last":%d,"gaps":[`, lastOf[tc.thread])
			if r.code != http.StatusOK || tb.Thread != tc.thread || !strings.HasPrefix(string(tb.ReceivedOrders), want) {
				t.Fatalf("GET threads/%s: %d %s, want thread %q with last %d", tc.segment, r.code, r.body, tc.thread, lastOf[tc.thread])
			}
		})
	}
	// encodeURIComponent gives every thread above but . and .. its
	// segment.
	for _, thread := range threads {
		if thread == "." || thread == ".." {
			continue
		}
		if r, tb := getThread(t, base+encodeURIComponent(thread)); r.code != http.StatusOK || tb.Thread != thread {
			t.Errorf("encodeURIComponent(%q): %d %s", thread, r.code, r.body)
		}
	}

	// Dot segments are removed before routing: ServeMux redirects to the
	// cleaned path, which names no thread (threads/ is an empty id, and
	// didcomm/ no route), so the ids . and .. need %2E.
	for seg, code := range map[string]int{".": http.StatusBadRequest, "..": http.StatusNotFound} {
		if r := do(t, http.MethodGet, base+seg, nil, nil); r.code != code {
			t.Errorf("GET threads/%s: %d %s, want %d", seg, r.code, r.body, code)
		}
	}

	// Requests written out by hand: what a client that does not escape
	// sends.
	for _, tc := range []struct {
		name, segment string
		code          int
		thread        string
	}{
		{"raw UTF-8", "caf\xc3\xa9 \xe2\x98\x83", http.StatusOK, "café ☃"},
		{"invalid escape", "50%zz", http.StatusBadRequest, ""},
		{"truncated escape", "50%2", http.StatusBadRequest, ""},
		{"lone percent", "100%", http.StatusBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/projects/" + project + "/subscriptions/escaping-sub/didcomm/threads/" + strings.ReplaceAll(tc.segment, " ", "%20")
			r := rawGet(t, e.srv, path)
			if r.code != tc.code {
				t.Fatalf("GET %q: %d %s, want %d", path, r.code, r.body, tc.code)
			}
			if tc.code == http.StatusOK {
				var tb threadBody
				if err := json.Unmarshal(r.body, &tb); err != nil || tb.Thread != tc.thread {
					t.Fatalf("GET %q: %s (%v), want thread %q", path, r.body, err, tc.thread)
				}
			}
		})
	}
}

func TestDIDCommThreadErrors(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	e.trackedSub(t, "tracked", map[string]string{broker.LabelDIDComm: broker.DIDCommTrack})
	if _, err := e.client.CreateSubscription(t.Context(), "untracked", adapter.SubscriptionConfig{Topic: e.client.Topic("tracked"), Labels: map[string]string{broker.LabelDIDComm: "off"}}); err != nil {
		t.Fatal(err)
	}
	noDefault := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b}))
	t.Cleanup(noDefault.Close)
	threads := func(sub string) string {
		return "/v1/projects/" + project + "/subscriptions/" + sub + "/didcomm/threads/"
	}

	tests := []struct {
		name   string
		srv    *httptest.Server // default: e.srv
		method string           // default: GET
		path   string

		code   int
		status string
		msg    string // expected in the error message
	}{
		{name: "bad project", path: "/v1/projects/-x/subscriptions/tracked-sub/didcomm/threads/t",
			code: 400, status: "INVALID_ARGUMENT", msg: `invalid project id "-x"`},
		{name: "bad subscription", path: threads("ab") + "t",
			code: 400, status: "INVALID_ARGUMENT", msg: `invalid subscription id "ab"`},
		{name: "bad subscription, default project", path: "/v1/subscriptions/goog-sub/didcomm/threads/t",
			code: 400, status: "INVALID_ARGUMENT", msg: `invalid subscription id "goog-sub"`},
		{name: "empty thread", path: threads("tracked-sub"),
			code: 400, status: "INVALID_ARGUMENT", msg: "thread id is empty"},
		{name: "empty thread, default project", path: "/v1/subscriptions/tracked-sub/didcomm/threads/",
			code: 400, status: "INVALID_ARGUMENT", msg: "thread id is empty"},
		{name: "thread not UTF-8", path: threads("tracked-sub") + "a%FFb",
			code: 400, status: "INVALID_ARGUMENT", msg: `thread id "a\xffb" is not UTF-8`},
		{name: "unknown subscription", path: threads("no-such-sub") + "t",
			code: 404, status: "NOT_FOUND", msg: "subscription not found: projects/" + project + "/subscriptions/no-such-sub"},
		{name: "untracked subscription", path: threads("untracked") + "t",
			code: 404, status: "NOT_FOUND", msg: "projects/" + project + "/subscriptions/untracked does not track DIDComm threads: give it the label jetorder-didcomm: track"},
		{name: "no default project", srv: noDefault, path: "/v1/subscriptions/tracked-sub/didcomm/threads/t",
			code: 404, status: "NOT_FOUND", msg: "no default project is configured"},
		{name: "two segments", path: threads("tracked-sub") + "a/b",
			code: 404, status: "NOT_FOUND", msg: "no route for GET"},
		{name: "POST", method: http.MethodPost, path: threads("tracked-sub") + "t",
			code: 405, status: "UNIMPLEMENTED", msg: "method POST is not allowed"},
		{name: "DELETE", method: http.MethodDelete, path: threads("tracked-sub") + "t",
			code: 405, status: "UNIMPLEMENTED", msg: "method DELETE is not allowed"},
		{name: "PUT before names are checked", method: http.MethodPut, path: threads("ab"),
			code: 405, status: "UNIMPLEMENTED", msg: "method PUT is not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, method := tc.srv, tc.method
			if srv == nil {
				srv = e.srv
			}
			if method == "" {
				method = http.MethodGet
			}
			r := do(t, method, srv.URL+tc.path, nil, nil)
			if r.code != tc.code {
				t.Fatalf("status %d, want %d (body %s)", r.code, tc.code, r.body)
			}
			eb := r.apiError(t)
			if eb.Error.Code != tc.code || eb.Error.Status != tc.status || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("error %+v, want %d %s with %q", eb.Error, tc.code, tc.status, tc.msg)
			}
			if tc.code == http.StatusMethodNotAllowed && r.header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow %q, want GET, HEAD", r.header.Get("Allow"))
			}
		})
	}
}

func TestDIDCommThreadNATSUnavailable(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	topic, err := e.client.CreateTopic(t.Context(), "gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CreateSubscription(t.Context(), "gone-sub", adapter.SubscriptionConfig{Topic: topic, Labels: map[string]string{broker.LabelDIDComm: broker.DIDCommTrack}}); err != nil {
		t.Fatal(err)
	}
	e.nc.Close()

	r := do(t, http.MethodGet, e.srv.URL+"/v1/subscriptions/gone-sub/didcomm/threads/t", nil, nil)
	if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("with NATS closed: %d, Retry-After %q, body %s", r.code, r.header.Get("Retry-After"), r.body)
	}
	if eb := r.apiError(t); eb.Error.Status != "UNAVAILABLE" {
		t.Errorf("error %+v, want UNAVAILABLE", eb.Error)
	}
}
