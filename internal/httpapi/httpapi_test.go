package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

const project = "test-project"

// env is a nats-server, a broker over it and the API served over HTTP.
type env struct {
	nc     *nats.Conn
	b      *broker.Broker
	client *adapter.Client
	srv    *httptest.Server
}

// wantEmpty fails the test unless topic holds no message: after what, a
// refused request, nothing was stored.
func (e *env) wantEmpty(t *testing.T, topic, after string) {
	t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), keyrouter.StreamName(project, topic))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Info(t.Context()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("topic holds %d messages after %s (err %v), want 0", info.State.Msgs, after, err)
	}
}

// newBroker is a broker over a fresh nats-server, closed when the test
// ends.
func newBroker(t *testing.T) (*nats.Conn, *broker.Broker) {
	t.Helper()
	nc := testutil.Connect(t, testutil.Server(t).ClientURL())
	b := broker.New(nc, nil, nil)
	t.Cleanup(b.Close)
	return nc, b
}

// newEnv serves httpapi.New(cfg) with cfg.Broker set to a fresh broker.
func newEnv(t *testing.T, cfg httpapi.Config) *env {
	t.Helper()
	nc, b := newBroker(t)
	client, err := b.Client(project)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	cfg.Broker = b
	srv := httptest.NewServer(httpapi.New(cfg))
	t.Cleanup(srv.Close)
	return &env{nc: nc, b: b, client: client, srv: srv}
}

// subscribe creates topic id with an ordered subscription and receives
// from it until the test ends. Each message is handed over before it is
// acked, so a key's messages arrive on the channel in delivery order.
func (e *env) subscribe(t *testing.T, id string) <-chan *adapter.Message {
	t.Helper()
	ctx := t.Context()
	topic, err := e.client.CreateTopic(ctx, id)
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	sub, err := e.client.CreateSubscription(ctx, id+"-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	ch := make(chan *adapter.Message, 100)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sub.Receive(rctx, func(ctx context.Context, m *adapter.Message) {
			select {
			case ch <- m:
				m.Ack()
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
	return ch
}

// next is the next message received, or fails the test after 10s.
func next(t *testing.T, ch <-chan *adapter.Message) *adapter.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message received within 10s")
		return nil
	}
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

// errorBody is the API's error in Google's REST shape.
type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Status  string `json:"status"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r response) apiError(t *testing.T) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(r.body, &eb); err != nil {
		t.Fatalf("error body %q is not JSON: %v", r.body, err)
	}
	return eb
}

func do(t *testing.T, method, url string, header http.Header, body io.Reader) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func postJSON(t *testing.T, url, body string) response {
	t.Helper()
	return do(t, http.MethodPost, url, http.Header{"Content-Type": {"application/json"}}, strings.NewReader(body))
}

// raw sends a request written out by hand, then closes the sending side,
// and reads the response.
func raw(t *testing.T, srv *httptest.Server, req string) response {
	t.Helper()
	return exchange(t, srv, req, true)
}

// exchange writes req on a new connection, closing its sending side after
// it when closeWrite, and reads the response.
func exchange(t *testing.T, srv *httptest.Server, req string, closeWrite bool) response {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write request: %v", err)
	}
	if closeWrite {
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestPublish(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "orders")

	const oddKey = "user 1.*>"
	body := fmt.Sprintf(`{"messages": [
		{"data": %q, "attributes": {"kind": "login", "n": "1"}, "orderingKey": %q},
		{"data": %q, "orderingKey": %q},
		{"data": %q, "attributes": {"kind": "plain"}},
		{"data": %q},
		{"attributes": {"only": "attributes"}, "orderingKey": null}
	]}`, b64("first"), oddKey, b64("second"), oddKey, b64("unkeyed"),
		base64.RawURLEncoding.EncodeToString([]byte("url-safe?>")))
	resp := postJSON(t, e.srv.URL+"/v1/projects/"+project+"/topics/orders:publish", body)
	if resp.code != http.StatusOK {
		t.Fatalf("publish: %d %s", resp.code, resp.body)
	}
	if ct := resp.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	var pr struct {
		MessageIDs []string `json:"messageIds"`
	}
	if err := json.Unmarshal(resp.body, &pr); err != nil || len(pr.MessageIDs) != 5 {
		t.Fatalf("response %s: %v", resp.body, err)
	}

	// The default project's route.
	resp = postJSON(t, e.srv.URL+"/v1/topics/orders:publish", fmt.Sprintf(`{"messages": [{"data": %q, "orderingKey": %q}]}`, b64("third"), oddKey))
	if resp.code != http.StatusOK {
		t.Fatalf("publish in default project: %d %s", resp.code, resp.body)
	}
	var pr2 struct {
		MessageIDs []string `json:"messageIds"`
	}
	if err := json.Unmarshal(resp.body, &pr2); err != nil || len(pr2.MessageIDs) != 1 {
		t.Fatalf("response %s: %v", resp.body, err)
	}
	ids := append(pr.MessageIDs, pr2.MessageIDs...)

	type want struct {
		data  string
		attrs map[string]string
		key   string
	}
	wants := map[string]want{
		ids[0]: {"first", map[string]string{"kind": "login", "n": "1"}, oddKey},
		ids[1]: {"second", nil, oddKey},
		ids[2]: {"unkeyed", map[string]string{"kind": "plain"}, ""},
		ids[3]: {"url-safe?>", nil, ""},
		ids[4]: {"", map[string]string{"only": "attributes"}, ""},
		ids[5]: {"third", nil, oddKey},
	}
	var keyed []string
	for n := len(wants); n > 0; n-- {
		m := next(t, msgs)
		w, ok := wants[m.ID]
		if !ok {
			t.Fatalf("unexpected or repeated message %s (%q)", m.ID, m.Data)
		}
		delete(wants, m.ID)
		if string(m.Data) != w.data || m.OrderingKey != w.key || !maps.Equal(m.Attributes, w.attrs) {
			t.Errorf("message %s: data %q key %q attributes %v, want %q %q %v", m.ID, m.Data, m.OrderingKey, m.Attributes, w.data, w.key, w.attrs)
		}
		if m.OrderingKey == oddKey {
			keyed = append(keyed, string(m.Data))
		}
	}
	if got := strings.Join(keyed, ","); got != "first,second,third" {
		t.Errorf("key %q delivered as %s, want first,second,third", oddKey, got)
	}
}

// postEvent publishes an event and returns the message id from the response.
func postEvent(t *testing.T, url string, header http.Header, body string) string {
	t.Helper()
	resp := do(t, http.MethodPost, url, header, strings.NewReader(body))
	if resp.code != http.StatusOK {
		t.Fatalf("post event: %d %s", resp.code, resp.body)
	}
	var er struct {
		MessageID string `json:"messageId"`
	}
	if err := json.Unmarshal(resp.body, &er); err != nil || er.MessageID == "" {
		t.Fatalf("response %s: %v", resp.body, err)
	}
	return er.MessageID
}

func TestCloudEvents(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "events")
	url := e.srv.URL + "/v1/projects/" + project + "/topics/events/events"

	type want struct {
		id, source, typ, data, key, contentType string
	}
	wants := map[string]want{}

	// Binary mode: attributes in ce- headers, percent-encoded as the HTTP
	// binding says.
	id := postEvent(t, url, http.Header{
		"Ce-Specversion":  {"1.0"},
		"Ce-Id":           {"order-42-shipped"},
		"Ce-Source":       {"/orders"},
		"Ce-Type":         {"com.example.order.shipped"},
		"Ce-Partitionkey": {"order%2042"},
		"Ce-Subject":      {"42"},
		"Content-Type":    {"application/json"},
	}, `{"carrier":"ups"}`)
	wants[id] = want{"order-42-shipped", "/orders", "com.example.order.shipped", `{"carrier":"ups"}`, "order 42", "application/json"}

	// Structured mode.
	id = postEvent(t, url, http.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}, `{
		"specversion": "1.0", "id": "order-7-paid", "source": "/payments", "type": "com.example.order.paid",
		"partitionkey": "order-7", "datacontenttype": "text/plain", "data": "paid in full"}`)
	wants[id] = want{"order-7-paid", "/payments", "com.example.order.paid", "paid in full", "order-7", "text/plain"}

	// Structured, base64 data, no partitionkey, default project's route.
	id = postEvent(t, e.srv.URL+"/v1/topics/events/events", http.Header{"Content-Type": {"application/cloudevents+json"}}, fmt.Sprintf(`{
		"specversion": "1.0", "id": "blob-1", "source": "/blobs", "type": "com.example.blob",
		"datacontenttype": "application/octet-stream", "data_base64": %q}`, b64("\x00\x01binary")))
	wants[id] = want{"blob-1", "/blobs", "com.example.blob", "\x00\x01binary", "", "application/octet-stream"}

	for range 3 {
		m := next(t, msgs)
		w, ok := wants[m.ID]
		if !ok {
			t.Fatalf("unexpected or repeated message %s", m.ID)
		}
		delete(wants, m.ID)
		if got := m.Header.Get("ce-specversion"); got != "1.0" {
			t.Errorf("%s: stored with ce-specversion %q, want binary mode on NATS", w.id, got)
		}
		ev, err := cloudevents.Decode(m)
		if err != nil {
			t.Fatalf("decode %s: %v", w.id, err)
		}
		key, _ := ev.Extensions()[cloudevents.ExtPartitionKey].(string)
		if ev.ID() != w.id || ev.Source() != w.source || ev.Type() != w.typ || string(ev.Data()) != w.data ||
			key != w.key || m.OrderingKey != w.key || ev.DataContentType() != w.contentType {
			t.Errorf("event %s/%s/%s data %q partitionkey %q (ordering key %q) content type %q, want %+v",
				ev.ID(), ev.Source(), ev.Type(), ev.Data(), key, m.OrderingKey, ev.DataContentType(), w)
		}
		if _, _, ok, err := cloudevents.RecordedTime(*ev); !ok || err != nil {
			t.Errorf("%s: recordedtime not stamped: %v", w.id, err)
		}
	}
}

// The data's content type is stored in the content-type header as sent, in
// both modes: NATS readers of the binding (sdk-go's) take it verbatim, so
// an escaped space would reach them as "%20".
func TestCloudEventContentTypeStoredAsSent(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "types")
	url := e.srv.URL + "/v1/topics/types/events"
	const contentType = `text/plain; charset="utf-8"`
	postEvent(t, url, http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"binary"}, "Ce-Source": {"/s"}, "Ce-Type": {"t"},
		"Content-Type": {contentType}}, "text")
	postEvent(t, url, http.Header{"Content-Type": {"application/cloudevents+json"}},
		`{"specversion": "1.0", "id": "structured", "source": "/s", "type": "t", "datacontenttype": "text/plain; charset=\"utf-8\"", "data": "text"}`)
	for range 2 {
		m := next(t, msgs)
		if got := m.Header.Get("content-type"); got != contentType {
			t.Errorf("%s: stored content-type %q, want %q", m.ID, got, contentType)
		}
		ev, err := cloudevents.Decode(m)
		if err != nil || ev.DataContentType() != contentType || string(ev.Data()) != "text" {
			t.Errorf("%s: decoded %v, %v", m.ID, ev, err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	const target = "bad-target"
	msgs := e.subscribe(t, target)
	small := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b, MaxBodyBytes: 1024}))
	// Bodies above the NATS server's max_payload, which the default body
	// limit keeps under it.
	big := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b, MaxBodyBytes: 2 * embedded.MaxPayload}))
	t.Cleanup(big.Close)
	t.Cleanup(small.Close)
	noDefault := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b}))
	t.Cleanup(noDefault.Close)

	pub := "/v1/projects/" + project + "/topics/" + target + ":publish"
	ev := "/v1/projects/" + project + "/topics/" + target + "/events"
	msg := func(extra string) string { return `{"messages":[{"data":"aGk="` + extra + `}]}` }
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	structured := http.Header{"Content-Type": {"application/cloudevents+json"}}
	binary := func(kv ...string) http.Header {
		h := http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"/s"}, "Ce-Type": {"t"}, "Content-Type": {"text/plain"}}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<delete>" {
				h.Del(kv[i])
				continue
			}
			h[kv[i]] = []string{kv[i+1]}
		}
		return h
	}
	longKey := strings.Repeat("k", keyrouter.MaxKeyBytes+1)

	tests := []struct {
		name   string
		srv    *httptest.Server // default: e.srv
		method string           // default: POST
		path   string
		header http.Header
		body   io.Reader
		raw    string // a hand-written request, instead of the fields above

		code  int
		msg   string // expected in the error message
		exact bool   // the message is msg exactly
	}{
		{name: "explicit empty ordering key", path: pub, header: jsonCT, body: strings.NewReader(msg(`,"orderingKey":""`)),
			code: 400, msg: "Ordering key cannot be empty", exact: true},
		{name: "ordering key too long", path: pub, header: jsonCT, body: strings.NewReader(msg(`,"orderingKey":"` + longKey + `"`)),
			code: 400, msg: "Ordering key exceeds maximum length of 1024 bytes", exact: true},
		{name: "bad base64", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[{"data":"not base64!"}]}`),
			code: 400, msg: "messages[0].data is not base64"},
		{name: "bad base64 in a later message", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[{"data":"aGk="},{"data":"%%%"}]}`),
			code: 400, msg: "messages[1].data is not base64"},
		{name: "malformed JSON", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[{"data":}]}`),
			code: 400, msg: "invalid JSON at byte"},
		{name: "truncated JSON", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[{"data":"aGk="`),
			code: 400, msg: "invalid JSON: unexpected end of input", exact: true},
		{name: "truncated body", raw: "POST " + pub + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + msg(""),
			code: 400, msg: "request body truncated"},
		{name: "unknown field", path: pub, header: jsonCT, body: strings.NewReader(msg(`,"colour":"red"`)),
			code: 400, msg: `unknown field "colour"`},
		{name: "wrong JSON type", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":{"data":"aGk="}}`),
			code: 400, msg: "must be an array, not object"},
		{name: "data after the object", path: pub, header: jsonCT, body: strings.NewReader(msg("") + ` {}`),
			code: 400, msg: "data after the request object"},
		{name: "body not UTF-8", path: pub, header: jsonCT, body: strings.NewReader(msg(`,"orderingKey":"k` + "\xff" + `"`)),
			code: 400, msg: "invalid JSON: the body is not UTF-8", exact: true},
		{name: "empty body", path: pub, header: jsonCT, body: strings.NewReader(""),
			code: 400, msg: "request body is empty", exact: true},
		{name: "no messages", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[]}`),
			code: 400, msg: "messages must not be empty", exact: true},
		{name: "empty message", path: pub, header: jsonCT, body: strings.NewReader(`{"messages":[{"data":"aGk="},{"orderingKey":"k"}]}`),
			code: 400, msg: "messages[1] is empty"},
		{name: "reserved attribute in a later message", path: pub, header: jsonCT,
			body: strings.NewReader(`{"messages":[{"data":"aGk="},{"data":"aGk=","attributes":{"googleish":"x"}}]}`),
			code: 400, msg: `messages[1]: invalid message: attribute key "googleish": the prefix "goog" is reserved`, exact: true},
		{name: "unknown topic", path: "/v1/projects/" + project + "/topics/no-such-topic:publish", header: jsonCT, body: strings.NewReader(msg("")),
			code: 404, msg: "topic not found"},
		{name: "bad topic name", path: "/v1/projects/" + project + "/topics/ab:publish", header: jsonCT, body: strings.NewReader(msg("")),
			code: 400, msg: `invalid topic id "ab"`},
		{name: "bad project name", path: "/v1/projects/-x/topics/" + target + ":publish", header: jsonCT, body: strings.NewReader(msg("")),
			code: 400, msg: `invalid project id "-x"`},
		{name: "unknown topic method", path: "/v1/projects/" + project + "/topics/" + target + ":delete", header: jsonCT, body: strings.NewReader(msg("")),
			code: 404, msg: "no route for POST"},
		{name: "unknown path", path: "/v2/anything", code: 404, msg: "no route for POST /v2/anything"},
		{name: "no default project", srv: noDefault, path: "/v1/topics/" + target + ":publish", header: jsonCT, body: strings.NewReader(msg("")),
			code: 404, msg: "no default project is configured"},
		{name: "wrong method", method: http.MethodGet, path: pub,
			code: 405, msg: "method GET is not allowed"},
		{name: "body over the limit by Content-Length", raw: fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", pub, httpapi.DefaultMaxBodyBytes+1),
			code: 413, msg: fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", httpapi.DefaultMaxBodyBytes+1, httpapi.DefaultMaxBodyBytes), exact: true},
		{name: "body over the limit while reading", srv: small, path: pub, header: jsonCT,
			body: io.MultiReader(strings.NewReader(`{"messages":[{"data":"` + strings.Repeat("A", 2000) + `"}]}`)), // chunked: no length
			code: 413, msg: "request body exceeds the limit of 1024 bytes", exact: true},
		{name: "publish as text", path: pub, header: http.Header{"Content-Type": {"text/plain"}}, body: strings.NewReader(msg("")),
			code: 415, msg: `Content-Type "text/plain" is not supported`},

		{name: "event: batch in another format", path: ev, header: http.Header{"Content-Type": {"application/cloudevents-batch+avro"}}, body: strings.NewReader(`[]`),
			code: 415, msg: "only structured event format"},
		{name: "event: other event format", path: ev, header: http.Header{"Content-Type": {"application/cloudevents+avro"}}, body: strings.NewReader(`x`),
			code: 415, msg: "only structured event format"},
		{name: "event: empty ce-partitionkey", path: ev, header: binary("Ce-Partitionkey", ""), body: strings.NewReader("hi"),
			code: 400, msg: "Ordering key cannot be empty", exact: true},
		{name: "event: empty structured partitionkey", path: ev, header: structured,
			body: strings.NewReader(`{"specversion":"1.0","id":"1","source":"/s","type":"t","partitionkey":""}`),
			code: 400, msg: "Ordering key cannot be empty", exact: true},
		{name: "event: partitionkey too long", path: ev, header: binary("Ce-Partitionkey", longKey), body: strings.NewReader("hi"),
			code: 400, msg: "Ordering key exceeds maximum length of 1024 bytes", exact: true},
		{name: "event: no ce-id", path: ev, header: binary("Ce-Id", "<delete>"), body: strings.NewReader("hi"),
			code: 400, msg: "invalid CloudEvent: id: MUST be a non-empty string", exact: true},
		{name: "event: structured without source and type", path: ev, header: structured,
			body: strings.NewReader(`{"specversion":"1.0","id":"1"}`),
			code: 400, msg: "invalid CloudEvent: source: REQUIRED; type: MUST be a non-empty string", exact: true},
		{name: "event: structured without specversion", path: ev, header: structured,
			body: strings.NewReader(`{"id":"1","source":"/s","type":"t"}`),
			code: 400, msg: "invalid CloudEvent: specversion: no specversion", exact: true},
		{name: "event: structured malformed JSON", path: ev, header: structured, body: strings.NewReader(`{"specversion":"1.0",`),
			code: 400, msg: "invalid CloudEvent: unexpected end of JSON input", exact: true},
		{name: "event: not a CloudEvent", path: ev, header: jsonCT, body: strings.NewReader(`{"a":1}`),
			code: 400, msg: "not a CloudEvent: binary mode needs a ce-specversion header"},
		{name: "event: unsupported specversion", path: ev, header: binary("Ce-Specversion", "2.0"), body: strings.NewReader("hi"),
			code: 400, msg: `ce-specversion "2.0" is not supported`},
		{name: "event: header named Ce-", path: ev, header: binary("Ce-", "x"), body: strings.NewReader("hi"),
			code: 400, msg: `header "Ce-" names no CloudEvents attribute`, exact: true},
		{name: "event: percent-decoded value not UTF-8", path: ev, header: binary("Ce-Partitionkey", "%C0%A0"), body: strings.NewReader("hi"),
			code: 400, msg: "header Ce-Partitionkey: value is not UTF-8 once percent-decoded", exact: true},
		{name: "event: bad time", path: ev, header: binary("Ce-Time", "yesterday"), body: strings.NewReader("hi"),
			code: 400, msg: "invalid CloudEvent: ce-time:"},
		{name: "event: bad extension name", path: ev, header: binary("Ce-Foo-Bar", "x"), body: strings.NewReader("hi"),
			code: 400, msg: "invalid CloudEvent: ce-foo-bar:"},
		{name: "event: empty sequence", path: ev, header: binary("Ce-Sequence", ""), body: strings.NewReader("hi"),
			code: 400, msg: "invalid CloudEvent: sequence must be a non-empty string", exact: true},
		{name: "event: data over the message limit", srv: big, path: ev, header: binary(), body: bytes.NewReader(make([]byte, embedded.MaxPayload)),
			code: 400, msg: "invalid message: message of "},
		{name: "event: unknown topic", path: "/v1/projects/" + project + "/topics/no-such-topic/events", header: binary(), body: strings.NewReader("hi"),
			code: 404, msg: "topic not found"},
		{name: "event: wrong method", method: http.MethodPut, path: ev, header: binary(), body: strings.NewReader("hi"),
			code: 405, msg: "method PUT is not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.srv
			if srv == nil {
				srv = e.srv
			}
			var resp response
			if tc.raw != "" {
				resp = raw(t, srv, tc.raw)
			} else {
				method := tc.method
				if method == "" {
					method = http.MethodPost
				}
				resp = do(t, method, srv.URL+tc.path, tc.header, tc.body)
			}
			if resp.code != tc.code {
				t.Fatalf("status %d, want %d (body %s)", resp.code, tc.code, resp.body)
			}
			eb := resp.apiError(t)
			got := eb.Error.Message
			if tc.exact && got != tc.msg || !strings.Contains(got, tc.msg) {
				t.Errorf("message %q, want %q", got, tc.msg)
			}
			if eb.Error.Code != tc.code || eb.Error.Status == "" {
				t.Errorf("error body %s: code and status do not match %d", resp.body, tc.code)
			}
			if tc.code == http.StatusMethodNotAllowed && resp.header.Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
		})
	}

	// None of them stored anything: the topic is empty, and a message
	// published now is the topic's first and the only one received.
	e.wantEmpty(t, target, "bad requests")
	if resp := postJSON(t, e.srv.URL+pub, fmt.Sprintf(`{"messages":[{"data":%q}]}`, b64("sentinel"))); resp.code != http.StatusOK {
		t.Fatalf("sentinel: %d %s", resp.code, resp.body)
	}
	m := next(t, msgs)
	if string(m.Data) != "sentinel" || m.StreamSequence != 1 {
		t.Fatalf("first message received: %q at position %d, want the sentinel at 1", m.Data, m.StreamSequence)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	var notReady atomic.Pointer[error]
	e := newEnv(t, httpapi.Config{
		DefaultProject: project,
		Ready: func(ctx context.Context) error {
			if err := notReady.Load(); err != nil {
				return *err
			}
			return nil
		},
	})
	msgs := e.subscribe(t, "counted")
	get := func(path string) response { return do(t, http.MethodGet, e.srv.URL+path, nil, nil) }

	if r := get("/healthz"); r.code != http.StatusOK || string(r.body) != "ok\n" {
		t.Errorf("/healthz: %d %q", r.code, r.body)
	}
	if r := do(t, http.MethodPost, e.srv.URL+"/healthz", nil, nil); r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /healthz: %d, Allow %q", r.code, r.header.Get("Allow"))
	}
	if r := get("/readyz"); r.code != http.StatusOK {
		t.Errorf("/readyz when ready: %d %q", r.code, r.body)
	}
	down := errors.New("JetStream is catching up")
	notReady.Store(&down)
	if r := get("/readyz"); r.code != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "JetStream is catching up") {
		t.Errorf("/readyz when not ready: %d %q", r.code, r.body)
	}

	// Without Config.Ready, ready means the NATS connection is up.
	defaultReady := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b}))
	t.Cleanup(defaultReady.Close)
	if r := do(t, http.MethodGet, defaultReady.URL+"/readyz", nil, nil); r.code != http.StatusOK {
		t.Errorf("default /readyz: %d %q", r.code, r.body)
	}

	resp := postJSON(t, e.srv.URL+"/v1/topics/counted:publish", fmt.Sprintf(`{"messages":[{"data":%q},{"data":%q,"orderingKey":"k"}]}`, b64("a"), b64("b")))
	if resp.code != http.StatusOK {
		t.Fatalf("publish: %d %s", resp.code, resp.body)
	}
	next(t, msgs)
	next(t, msgs)
	m := testutil.Scrape(t, e.srv.URL+"/metrics")
	if v, ok := m.Value("jetorder_published_total", "topic", "projects/"+project+"/topics/counted"); v != 2 {
		t.Errorf("jetorder_published_total of the topic = %v (present %v), want 2", v, ok)
	}
	if _, ok := m.Value("go_goroutines"); !ok {
		t.Error("/metrics has no Go runtime metrics")
	}
	// Without Config.Status there is no status page.
	if r := get("/"); r.code != http.StatusNotFound {
		t.Errorf("GET / without a status: %d", r.code)
	}
}

func TestNATSUnavailable(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project}) // Ready: the connection's state
	if _, err := e.client.CreateTopic(t.Context(), "lonely"); err != nil {
		t.Fatal(err)
	}
	e.nc.Close()

	resp := postJSON(t, e.srv.URL+"/v1/topics/lonely:publish", fmt.Sprintf(`{"messages":[{"data":%q,"orderingKey":"k"}]}`, b64("x")))
	if resp.code != http.StatusServiceUnavailable || resp.header.Get("Retry-After") == "" {
		t.Fatalf("publish with NATS closed: %d, Retry-After %q, body %s", resp.code, resp.header.Get("Retry-After"), resp.body)
	}
	if eb := resp.apiError(t); eb.Error.Status != "UNAVAILABLE" || !strings.Contains(eb.Error.Message, "connection closed") {
		t.Errorf("error %+v, want UNAVAILABLE naming the closed connection", eb.Error)
	}
	if r := do(t, http.MethodGet, e.srv.URL+"/readyz", nil, nil); r.code != http.StatusServiceUnavailable || string(r.body) != "NATS connection is CLOSED\n" {
		t.Errorf("/readyz with NATS closed: %d %q", r.code, r.body)
	}
	if r := do(t, http.MethodGet, e.srv.URL+"/healthz", nil, nil); r.code != http.StatusOK {
		t.Errorf("/healthz with NATS closed: %d %q", r.code, r.body)
	}
}
