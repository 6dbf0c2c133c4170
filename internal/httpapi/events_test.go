package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/keyrouter"
)

const batchContentType = "application/cloudevents-batch+json"

// postBatch sends a batch and returns the response's messageIds; it fails
// the test on any other answer than 200.
func postBatch(t *testing.T, url, contentType string, body []byte) []string {
	t.Helper()
	resp := do(t, http.MethodPost, url, http.Header{"Content-Type": {contentType}}, bytes.NewReader(body))
	if resp.code != http.StatusOK {
		t.Fatalf("post batch: %d %s", resp.code, resp.body)
	}
	var br struct {
		MessageIDs []string `json:"messageIds"`
	}
	if err := json.Unmarshal(resp.body, &br); err != nil || br.MessageIDs == nil {
		t.Fatalf("batch response %s: %v", resp.body, err)
	}
	return br.MessageIDs
}

// structuredEvent is one event in the JSON format.
func structuredEvent(id, key, data string) string {
	pk := ""
	if key != "" {
		pk = fmt.Sprintf(`, "partitionkey": %q`, key)
	}
	return fmt.Sprintf(`{"specversion": "1.0", "id": %q, "source": "/batch", "type": "com.example.batched"%s, "datacontenttype": "text/plain", "data": %q}`, id, pk, data)
}

// A batch is stored whole, in one request: messageIds in batch order,
// every event stored as its single structured-mode request would be, and
// each key's events delivered in batch order.
func TestCloudEventsBatch(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "batched")
	url := e.srv.URL + "/v1/projects/" + project + "/topics/batched/events"

	type sent struct{ id, key, data string }
	var batch []sent
	var parts []string
	for i := range 12 {
		key := []string{"order 1", "order.2>", "", "order 1"}[i%4]
		s := sent{id: fmt.Sprintf("ev-%d", i), key: key, data: fmt.Sprintf("%s|%d", key, i)}
		batch = append(batch, s)
		parts = append(parts, structuredEvent(s.id, s.key, s.data))
	}
	// Media type parameters are allowed, as in structured mode.
	ids := postBatch(t, url, batchContentType+"; charset=utf-8", []byte("[\n"+strings.Join(parts, ",\n")+"\n]"))
	if len(ids) != len(batch) {
		t.Fatalf("%d message ids for %d events", len(ids), len(batch))
	}
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}

	perKey := map[string][]int{}
	for range batch {
		m := next(t, msgs)
		i, ok := index[m.ID]
		if !ok {
			t.Fatalf("unexpected or repeated message %s", m.ID)
		}
		delete(index, m.ID)
		w := batch[i]
		ev, err := cloudevents.Decode(m)
		if err != nil {
			t.Fatalf("decode %s: %v", w.id, err)
		}
		key, _ := ev.Extensions()[cloudevents.ExtPartitionKey].(string)
		if ev.ID() != w.id || string(ev.Data()) != w.data || key != w.key || m.OrderingKey != w.key || m.Header.Get("ce-specversion") != "1.0" {
			t.Errorf("message %d: event %s data %q partitionkey %q ordering key %q, want %+v stored in binary mode", i, ev.ID(), ev.Data(), key, m.OrderingKey, w)
		}
		if w.key != "" {
			perKey[w.key] = append(perKey[w.key], i)
		}
	}
	for key, got := range perKey {
		if !slices.IsSorted(got) {
			t.Errorf("key %q delivered as events %v, want batch order", key, got)
		}
	}

	// What sdk-go's NewHTTPRequestFromEvents sends: the events JSON-encoded
	// as an array, Content-Type exactly the batch media type. Different
	// datacontenttypes, data_base64, no partitionkey; the default project's
	// route.
	var sdkEvents []event.Event
	for i, ct := range []string{"application/json", "application/octet-stream"} {
		ev := event.New()
		ev.SetID(fmt.Sprintf("sdk-%d", i))
		ev.SetSource("/sdk-go")
		ev.SetType("com.example.sdk")
		if ct == "application/json" {
			_ = ev.SetData(ct, map[string]int{"n": i})
		} else {
			_ = ev.SetData(ct, []byte{0, 1, byte(i)})
		}
		sdkEvents = append(sdkEvents, ev)
	}
	body, err := json.Marshal(sdkEvents)
	if err != nil {
		t.Fatal(err)
	}
	ids = postBatch(t, e.srv.URL+"/v1/topics/batched/events", batchContentType, body)
	if len(ids) != 2 {
		t.Fatalf("sdk-go batch: %d ids", len(ids))
	}
	for range ids {
		m := next(t, msgs)
		i := slices.Index(ids, m.ID)
		if i < 0 {
			t.Fatalf("unexpected message %s", m.ID)
		}
		ev, err := cloudevents.Decode(m)
		if err != nil || ev.ID() != sdkEvents[i].ID() || !bytes.Equal(ev.Data(), sdkEvents[i].Data()) || ev.DataContentType() != sdkEvents[i].DataContentType() {
			t.Errorf("sdk-go event %d stored as %v (%v), want %v", i, ev, err, sdkEvents[i])
		}
	}

	// An empty batch is a batch (JSON batch format): nothing stored, no
	// ids, but the topic must exist.
	resp := do(t, http.MethodPost, url, http.Header{"Content-Type": {batchContentType}}, strings.NewReader(" [ ] "))
	if resp.code != http.StatusOK || strings.TrimSpace(string(resp.body)) != `{"messageIds":[]}` {
		t.Errorf("empty batch: %d %s", resp.code, resp.body)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/projects/"+project+"/topics/no-such-topic/events", http.Header{"Content-Type": {batchContentType}}, strings.NewReader("[]"))
	if resp.code != http.StatusNotFound || !strings.Contains(resp.apiError(t).Error.Message, "topic not found") {
		t.Errorf("empty batch to a missing topic: %d %s", resp.code, resp.body)
	}
}

// A batch with one bad event stores none: the error names the event, and
// the topic is still empty afterwards.
func TestCloudEventsBatchRefused(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	const target = "batch-target"
	msgs := e.subscribe(t, target)
	path := "/v1/projects/" + project + "/topics/" + target + "/events"
	small := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b, MaxBodyBytes: 1024}))
	t.Cleanup(small.Close)
	big := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b, MaxBodyBytes: 2 * embedded.MaxPayload}))
	t.Cleanup(big.Close)

	good := func(i int) string { return structuredEvent(fmt.Sprintf("ok-%d", i), "k", "x") }
	batchOf := func(events ...string) string { return "[" + strings.Join(events, ",") + "]" }
	many := make([]string, 1001)
	for i := range many {
		many[i] = good(i)
	}
	huge := structuredEvent("huge", "k", strings.Repeat("x", embedded.MaxPayload))

	tests := []struct {
		name        string
		srv         *httptest.Server
		path        string
		contentType string
		body        string
		code        int
		msg         string
		exact       bool
	}{
		{name: "event without id", body: batchOf(good(0), good(1), good(2), `{"specversion":"1.0","source":"/s","type":"t"}`),
			code: 400, msg: "events[3]: invalid CloudEvent: id: MUST be a non-empty string", exact: true},
		{name: "empty partitionkey", body: batchOf(good(0), `{"specversion":"1.0","id":"1","source":"/s","type":"t","partitionkey":""}`),
			code: 400, msg: "events[1]: Ordering key cannot be empty", exact: true},
		{name: "partitionkey too long", body: batchOf(structuredEvent("1", strings.Repeat("k", keyrouter.MaxKeyBytes+1), "x")),
			code: 400, msg: "events[0]: Ordering key exceeds maximum length of 1024 bytes", exact: true},
		{name: "not an object", body: batchOf(good(0), `"an event"`),
			code: 400, msg: "events[1]: invalid CloudEvent: not a JSON object"},
		{name: "null event", body: batchOf(`null`),
			code: 400, msg: "events[0]: invalid CloudEvent: not a JSON object"},
		{name: "mixed specversions", body: batchOf(good(0), `{"specversion":"0.3","id":"1","source":"/s","type":"t"}`),
			code: 400, msg: `events[1]: invalid CloudEvent: specversion "0.3" is not events[0]'s "1.0"`},
		{name: "unsupported specversion", body: batchOf(`{"specversion":"2.0","id":"1","source":"/s","type":"t"}`),
			code: 400, msg: "events[0]: invalid CloudEvent:"},
		{name: "bad time", body: batchOf(good(0), `{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday"}`),
			code: 400, msg: "events[1]: invalid CloudEvent:"},
		{name: "half a surrogate pair", body: batchOf(good(0), `{"specversion":"1.0","id":"\ud800","source":"/s","type":"t"}`),
			code: 400, msg: `events[1]: invalid JSON at byte 27: \ud800 is half of a UTF-16 surrogate pair`},
		{name: "too many events", body: batchOf(many...),
			code: 400, msg: "1001 events in one batch, at most 1000", exact: true},
		{name: "an object, not an array", body: good(0),
			code: 400, msg: "invalid JSON: the request must be an array, not object", exact: true},
		{name: "null batch", body: "null",
			code: 400, msg: "a batch must be an array of events, not null"},
		{name: "malformed JSON", body: `[` + good(0) + `,`,
			code: 400, msg: "invalid JSON"},
		{name: "empty body", body: "",
			code: 400, msg: "request body is empty", exact: true},
		{name: "body over the limit", srv: small, body: batchOf(good(0), good(1), good(2), good(3), good(4), good(5), good(6), good(7), good(8), good(9)),
			code: 413, msg: "exceeds the limit of 1024 bytes"},
		{name: "event over the message limit", srv: big, body: batchOf(good(0), huge),
			code: 400, msg: "events[1]: invalid message: message of "},
		{name: "another batch format", contentType: "application/cloudevents-batch+avro", body: "[]",
			code: 415, msg: "only structured event format"},
		{name: "unknown topic", path: "/v1/projects/" + project + "/topics/no-such-topic/events", body: batchOf(good(0)),
			code: 404, msg: "topic not found"},
		{name: "bad topic name", path: "/v1/projects/" + project + "/topics/ab/events", body: batchOf(good(0)),
			code: 400, msg: `invalid topic id "ab"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, p, ct := tc.srv, tc.path, tc.contentType
			if srv == nil {
				srv = e.srv
			}
			if p == "" {
				p = path
			}
			if ct == "" {
				ct = batchContentType
			}
			resp := do(t, http.MethodPost, srv.URL+p, http.Header{"Content-Type": {ct}}, strings.NewReader(tc.body))
			if resp.code != tc.code {
				t.Fatalf("status %d, want %d (body %.300s)", resp.code, tc.code, resp.body)
			}
			eb := resp.apiError(t)
			if got := eb.Error.Message; tc.exact && got != tc.msg || !strings.Contains(got, tc.msg) {
				t.Errorf("message %q, want %q", got, tc.msg)
			}
			if eb.Error.Code != tc.code || eb.Error.Status != "INVALID_ARGUMENT" && tc.code != 404 {
				t.Errorf("error body %.300s: code and status do not match %d", resp.body, tc.code)
			}
		})
	}

	e.wantEmpty(t, target, "refused batches")
	postBatch(t, e.srv.URL+path, batchContentType, []byte(batchOf(structuredEvent("sentinel", "k", "sentinel"))))
	m := next(t, msgs)
	if ev, err := cloudevents.Decode(m); err != nil || ev.ID() != "sentinel" || m.StreamSequence != 1 {
		t.Fatalf("first message received: %v (%v) at position %d, want the sentinel at 1", ev, err, m.StreamSequence)
	}
}

// Binary-mode header values are percent-decoded leniently: what sdk-go
// sends unencoded arrives as sent, escapes are decoded once, and a result
// that is not UTF-8 is refused.
func TestCloudEventsLenientPercentDecoding(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "lenient")
	url := e.srv.URL + "/v1/topics/lenient/events"
	binary := func(id, value string) http.Header {
		return http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {id}, "Ce-Source": {"/s"}, "Ce-Type": {"t"},
			"Ce-Subject": {value}, "Ce-Partitionkey": {value}, "Content-Type": {"text/plain"}}
	}
	tests := []struct {
		name, value string
		want        string // "" when refused
	}{
		{"sdk-go unencoded", `50% "off" today`, `50% "off" today`},
		{"percent at the end", "100%", "100%"},
		{"percent and one hex digit", "a%2", "a%2"},
		{"percent and no hex", "%zz%", "%zz%"},
		{"escaped percent", "50%25%20off", "50% off"},
		{"one round only", "%2541", "%41"},
		{"lower-case hex", "caf%c3%a9", "café"},
		{"upper-case hex", "caf%C3%A9%20%E2%82%AC", "café €"},
		{"unencoded UTF-8", "café €", "café €"},
		{"overlong encoding", "%C0%A0", ""},
		{"not UTF-8", "%FF", ""},
		{"a literal percent before two hex digits", "100%AB", ""}, // cannot be told from an escape
	}
	want := map[string]string{}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("v%d", i)
			resp := do(t, http.MethodPost, url, binary(id, tc.value), strings.NewReader("x"))
			if tc.want == "" {
				if resp.code != http.StatusBadRequest || !strings.Contains(resp.apiError(t).Error.Message, "value is not UTF-8 once percent-decoded") {
					t.Errorf("%q: %d %s, want 400 naming UTF-8", tc.value, resp.code, resp.body)
				}
				return
			}
			if resp.code != http.StatusOK {
				t.Fatalf("%q: %d %s", tc.value, resp.code, resp.body)
			}
			want[id] = tc.want
		})
	}
	for range want {
		m := next(t, msgs)
		ev, err := cloudevents.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[ev.ID()]
		if !ok {
			t.Fatalf("unexpected event %s", ev.ID())
		}
		if key, _ := ev.Extensions()[cloudevents.ExtPartitionKey].(string); ev.Subject() != w || key != w || m.OrderingKey != w {
			t.Errorf("event %s: subject %q, partitionkey %q, ordering key %q; want %q", ev.ID(), ev.Subject(), key, m.OrderingKey, w)
		}
	}
}

// The same event sent in structured mode, in binary mode as sdk-go 2.16
// writes it (values unencoded) and in binary mode percent-encoded as the
// binding says is stored the same: the same ce-* headers, content-type,
// data and ordering key.
func TestCloudEventsModesStoreTheSame(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project})
	msgs := e.subscribe(t, "modes")
	url := e.srv.URL + "/v1/topics/modes/events"
	const value = `50% "off" today, café`
	const recorded = "2026-01-02T03:04:05.678Z" // else each is stamped on arrival
	structured := fmt.Sprintf(`{"specversion": "1.0", "id": "same", "source": "/shop", "type": "com.example.sale",
		"subject": %q, "partitionkey": %q, "recordedtime": %q, "comexamplenote": %q, "datacontenttype": "text/plain", "data": "on sale"}`,
		value, value, recorded, value)
	postEvent(t, url, http.Header{"Content-Type": {"application/cloudevents+json"}}, structured)
	binary := func(enc func(string) string) http.Header {
		return http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"same"}, "Ce-Source": {"/shop"}, "Ce-Type": {"com.example.sale"},
			"Ce-Subject": {enc(value)}, "Ce-Partitionkey": {enc(value)}, "Ce-Recordedtime": {recorded}, "Ce-Comexamplenote": {enc(value)},
			"Content-Type": {"text/plain"}}
	}
	postEvent(t, url, binary(func(s string) string { return s }), "on sale")
	postEvent(t, url, binary(cloudevents.PercentEncode), "on sale")

	type stored struct {
		header      map[string]string
		data, key   string
		contentType string
	}
	var got []stored
	for range 3 {
		m := next(t, msgs)
		s := stored{header: map[string]string{}, data: string(m.Data), key: m.OrderingKey, contentType: m.Header.Get("content-type")}
		for name, vals := range m.Header {
			if lower := strings.ToLower(name); strings.HasPrefix(lower, "ce-") {
				s.header[lower] = strings.Join(vals, "\n")
			}
		}
		got = append(got, s)
	}
	if got[0].header["ce-subject"] == "" || got[0].key != value {
		t.Fatalf("structured event stored as %+v", got[0])
	}
	for i, name := range []string{"binary as sdk-go sends it", "binary percent-encoded"} {
		g := got[i+1]
		if !maps.Equal(g.header, got[0].header) || g.data != got[0].data || g.key != got[0].key || g.contentType != got[0].contentType {
			t.Errorf("%s stored as %+v,\nstructured as %+v", name, g, got[0])
		}
	}
}

// The CloudEvents webhook validation handshake: OPTIONS with
// WebHook-Request-Origin on the /events routes.
func TestCloudEventsWebhookValidation(t *testing.T) {
	e := newEnv(t, httpapi.Config{DefaultProject: project}) // every origin, no rate limit
	if _, err := e.client.CreateTopic(t.Context(), "hooked"); err != nil {
		t.Fatal(err)
	}
	limited := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b, DefaultProject: project,
		WebhookAllowedOrigins: []string{"EventEmitter.example.com", "*.example.org"}, WebhookAllowedRate: 120}))
	t.Cleanup(limited.Close)
	noDefault := httptest.NewServer(httpapi.New(httpapi.Config{Broker: e.b}))
	t.Cleanup(noDefault.Close)
	var callbacks atomic.Int32
	callback := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { callbacks.Add(1) }))
	t.Cleanup(callback.Close)

	path := "/v1/projects/" + project + "/topics/hooked/events"
	tests := []struct {
		name   string
		srv    *httptest.Server // default: e.srv
		method string           // default: OPTIONS
		path   string           // default: path
		header map[string]string

		code          int
		allowedOrigin string // "": must be absent
		allowedRate   string // "": must be absent
		allow         string
		msg           string // in the JSON error
		status        string // its status
	}{
		{name: "every origin by default", header: map[string]string{"WebHook-Request-Origin": "eventemitter.example.com"},
			code: 200, allowedOrigin: "*", allowedRate: "*", allow: "POST, OPTIONS"},
		{name: "asking for a rate", header: map[string]string{"WebHook-Request-Origin": "eventemitter.example.com", "WebHook-Request-Rate": "120"},
			code: 200, allowedOrigin: "*", allowedRate: "*", allow: "POST, OPTIONS"},
		{name: "default project's route", path: "/v1/topics/hooked/events", header: map[string]string{"WebHook-Request-Origin": "x.example.net"},
			code: 200, allowedOrigin: "*", allowedRate: "*", allow: "POST, OPTIONS"},
		{name: "callback not called, granted at once", header: map[string]string{"WebHook-Request-Origin": "eventemitter.example.com", "WebHook-Request-Callback": callback.URL + "/confirm?id=1"},
			code: 200, allowedOrigin: "*", allowedRate: "*", allow: "POST, OPTIONS"},
		{name: "listed origin", srv: limited, header: map[string]string{"WebHook-Request-Origin": "eventemitter.example.com"},
			code: 200, allowedOrigin: "eventemitter.example.com", allowedRate: "120", allow: "POST, OPTIONS"},
		{name: "listed origin in other case", srv: limited, header: map[string]string{"WebHook-Request-Origin": "EVENTEMITTER.example.COM", "WebHook-Request-Rate": "1000"},
			code: 200, allowedOrigin: "EVENTEMITTER.example.COM", allowedRate: "120", allow: "POST, OPTIONS"},
		{name: "subdomain of a pattern", srv: limited, header: map[string]string{"WebHook-Request-Origin": "hooks.eu.example.org"},
			code: 200, allowedOrigin: "hooks.eu.example.org", allowedRate: "120", allow: "POST, OPTIONS"},
		{name: "the pattern's own domain", srv: limited, header: map[string]string{"WebHook-Request-Origin": "example.org"},
			code: 403, msg: `origin "example.org" may not deliver events here`, status: "PERMISSION_DENIED"},
		{name: "origin not listed", srv: limited, header: map[string]string{"WebHook-Request-Origin": "evil.example.com", "WebHook-Request-Rate": "10"},
			code: 403, msg: `origin "evil.example.com" may not deliver events here`, status: "PERMISSION_DENIED"},
		{name: "suffix that is not a subdomain", srv: limited, header: map[string]string{"WebHook-Request-Origin": "notexample.org"},
			code: 403, msg: "may not deliver events here", status: "PERMISSION_DENIED"},
		{name: "empty origin", header: map[string]string{"WebHook-Request-Origin": ""},
			code: 400, msg: "header WebHook-Request-Origin is empty", status: "INVALID_ARGUMENT"},
		{name: "rate zero", header: map[string]string{"WebHook-Request-Origin": "a.example.com", "WebHook-Request-Rate": "0"},
			code: 400, msg: `header WebHook-Request-Rate "0": want one positive integer`, status: "INVALID_ARGUMENT"},
		{name: "rate not a number", header: map[string]string{"WebHook-Request-Origin": "a.example.com", "WebHook-Request-Rate": "fast"},
			code: 400, msg: `header WebHook-Request-Rate "fast"`, status: "INVALID_ARGUMENT"},
		{name: "unknown topic", path: "/v1/projects/" + project + "/topics/no-such-topic/events", header: map[string]string{"WebHook-Request-Origin": "a.example.com"},
			code: 404, msg: "topic not found", status: "NOT_FOUND"},
		{name: "bad topic name", path: "/v1/projects/" + project + "/topics/ab/events", header: map[string]string{"WebHook-Request-Origin": "a.example.com"},
			code: 400, msg: `invalid topic id "ab"`, status: "INVALID_ARGUMENT"},
		{name: "no default project", srv: noDefault, path: "/v1/topics/hooked/events", header: map[string]string{"WebHook-Request-Origin": "a.example.com"},
			code: 404, msg: "no default project is configured", status: "NOT_FOUND"},
		{name: "OPTIONS without an origin", header: nil,
			code: 405, allow: "POST", msg: "only as the CloudEvents webhook validation request, with a WebHook-Request-Origin header", status: "UNIMPLEMENTED"},
		{name: "another method", method: http.MethodPut, header: map[string]string{"WebHook-Request-Origin": "a.example.com"},
			code: 405, allow: "POST, OPTIONS", msg: "method PUT is not allowed", status: "UNIMPLEMENTED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, method, p := tc.srv, tc.method, tc.path
			if srv == nil {
				srv = e.srv
			}
			if method == "" {
				method = http.MethodOptions
			}
			if p == "" {
				p = path
			}
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			resp := do(t, method, srv.URL+p, h, nil)
			if resp.code != tc.code {
				t.Fatalf("status %d, want %d (body %s)", resp.code, tc.code, resp.body)
			}
			if got := resp.header.Get("WebHook-Allowed-Origin"); got != tc.allowedOrigin {
				t.Errorf("WebHook-Allowed-Origin %q, want %q", got, tc.allowedOrigin)
			}
			if got := resp.header.Get("WebHook-Allowed-Rate"); got != tc.allowedRate {
				t.Errorf("WebHook-Allowed-Rate %q, want %q", got, tc.allowedRate)
			}
			if got := resp.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			if tc.code == http.StatusOK {
				if len(resp.body) != 0 {
					t.Errorf("body %q, want none", resp.body)
				}
				return
			}
			eb := resp.apiError(t)
			if !strings.Contains(eb.Error.Message, tc.msg) || eb.Error.Code != tc.code || eb.Error.Status != tc.status {
				t.Errorf("error %+v, want %d %s with %q", eb.Error, tc.code, tc.status, tc.msg)
			}
		})
	}
	if n := callbacks.Load(); n != 0 {
		t.Errorf("the callback was called %d times", n)
	}

	// The answer's header names are spelt as in the specification.
	wire := rawResponseHead(t, e.srv, "OPTIONS "+path+" HTTP/1.1\r\nHost: x\r\nWebHook-Request-Origin: a.example.com\r\nConnection: close\r\n\r\n")
	for _, want := range []string{"\r\nWebHook-Allowed-Origin: *\r\n", "\r\nWebHook-Allowed-Rate: *\r\n"} {
		if !strings.Contains(wire, want) {
			t.Errorf("response head %q lacks %q", wire, want)
		}
	}

	// The list guards the handshake only: publishing needs no origin, and
	// a POST naming another one is not refused.
	postEvent(t, limited.URL+path, http.Header{"WebHook-Request-Origin": {"evil.example.com"}, "Content-Type": {"application/cloudevents+json"}},
		`{"specversion": "1.0", "id": "1", "source": "/s", "type": "t"}`)
}

// rawResponseHead sends req on a new connection and returns the response
// up to the blank line, as the server wrote it.
func rawResponseHead(t *testing.T, srv *httptest.Server, req string) string {
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
		t.Fatal(err)
	}
	var head strings.Builder
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		head.WriteString(line)
		if err != nil || line == "\r\n" {
			return head.String()
		}
	}
}
