package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The CloudEvents HTTP side through the sidecar: batches over several
// partitionkeys, events as sdk-go 2.16 sends them (binary mode with values
// not percent-encoded, and batches), all read back with Google's Go
// client in order per key; and the webhook validation handshake with the
// sidecar's allowed origins and rate.

const (
	batchTopic = "ce-batched"
	batchSub   = "ce-batched-sub"
	// oddKey is what sdk-go sends unencoded and the sidecar used to
	// refuse in binary mode.
	oddKey = `50% "off" today`
)

func TestCloudEventsBatchThroughSidecar(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{WebhookAllowedOrigins: []string{"eventemitter.example.com"}, WebhookAllowedRate: 120})
	c := sc.GoClient()
	mustCreateTopic(t, c, batchTopic)
	mustCreateSub(t, c, &pb.Subscription{Name: subPath(batchSub), Topic: topicPath(batchTopic), EnableMessageOrdering: true})
	eventsURL := "http://" + sc.HTTP + "/v1/projects/" + project + "/topics/" + batchTopic + "/events"

	chk := ordercheck.New()
	var mu sync.Mutex
	oddAttrs := map[int]map[string]string{} // the Pub/Sub attributes of oddKey's messages, by index
	receiveGo(t, c.Subscriber(batchSub), func(_ context.Context, m *pubsub.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("undecodable delivery %q (ordering key %q): %v", m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		chk.Delivered(batchSub, key, idx)
		if key == oddKey {
			mu.Lock()
			oddAttrs[idx] = m.Attributes
			mu.Unlock()
		}
		chk.Acked(batchSub, key, idx)
		m.Ack()
	})

	nextIndex := map[string]int{} // each key's next index
	newEvent := func(key string) event.Event {
		i := nextIndex[key]
		nextIndex[key]++
		ev := event.New()
		ev.SetID(fmt.Sprintf("%s/%d", key, i))
		ev.SetSource("/ce-batch-test")
		ev.SetType("com.example.batched")
		ev.SetSubject(key)
		if key != "" {
			ev.SetExtension("partitionkey", key)
		}
		if err := ev.SetData("text/plain", ordercheck.Encode(key, i)); err != nil {
			t.Fatal(err)
		}
		chk.Published(key, i)
		return ev
	}
	keys := []string{"order-1", "order 2", "order.3>", "", oddKey}

	// Batches as structured JSON written by hand, several keys interleaved.
	for b := range 4 {
		var parts []string
		for i := range 50 {
			ev := newEvent(keys[(b+i)%len(keys)])
			j, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, string(j))
		}
		ids := postEvents(t, eventsURL, http.Header{"Content-Type": {"application/cloudevents-batch+json; charset=UTF-8"}}, []byte("["+strings.Join(parts, ",\n")+"]"))
		if len(ids) != 50 {
			t.Fatalf("batch %d: %d message ids", b, len(ids))
		}
	}
	// As sdk-go 2.16 sends single events: binary mode, values unencoded.
	for range 3 {
		req := sdkGoBinaryRequest(t, eventsURL, newEvent(oddKey))
		if ids := doEvents(t, req); len(ids) != 1 {
			t.Fatalf("sdk-go binary event: %d ids", len(ids))
		}
	}
	// As sdk-go's NewHTTPRequestFromEvents sends a batch: the events
	// JSON-encoded, Content-Type exactly the batch media type.
	var batch []event.Event
	for i := range 9 {
		batch = append(batch, newEvent(keys[i%len(keys)]))
	}
	body, err := json.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	if ids := postEvents(t, eventsURL, http.Header{"Content-Type": {event.ApplicationCloudEventsBatchJSON}}, body); len(ids) != len(batch) {
		t.Fatalf("sdk-go batch: %d ids for %d events", len(ids), len(batch))
	}

	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete(batchSub) || len(chk.Violations()) > 0 },
		"not everything acked: %s", func() string { return chk.Missing(batchSub) })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	// oddKey's events, whichever way they came, carry the value as
	// sent: the Pub/Sub binding's attributes are not percent-encoded.
	mu.Lock()
	defer mu.Unlock()
	if len(oddAttrs) != nextIndex[oddKey] {
		t.Fatalf("%d messages of key %q seen, %d sent", len(oddAttrs), oddKey, nextIndex[oddKey])
	}
	for i, attrs := range oddAttrs {
		if attrs["ce-subject"] != oddKey || attrs["ce-partitionkey"] != oddKey {
			t.Errorf("message %d of key %q: attributes %v", i, oddKey, attrs)
		}
	}

	// The webhook validation handshake, with the sidecar's settings.
	for _, tc := range []struct {
		name          string
		header        http.Header
		code          int
		allowedOrigin string
		allowedRate   string
	}{
		{"allowed origin", http.Header{"WebHook-Request-Origin": {"EventEmitter.example.com"}, "WebHook-Request-Rate": {"600"}}, 200, "EventEmitter.example.com", "120"},
		{"other origin", http.Header{"WebHook-Request-Origin": {"elsewhere.example.com"}}, 403, "", ""},
		{"no origin", http.Header{}, 405, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodOptions, eventsURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tc.header
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || resp.Header.Get("WebHook-Allowed-Origin") != tc.allowedOrigin || resp.Header.Get("WebHook-Allowed-Rate") != tc.allowedRate {
				t.Errorf("OPTIONS: %d, WebHook-Allowed-Origin %q, WebHook-Allowed-Rate %q (%s); want %d, %q, %q",
					resp.StatusCode, resp.Header.Get("WebHook-Allowed-Origin"), resp.Header.Get("WebHook-Allowed-Rate"), b, tc.code, tc.allowedOrigin, tc.allowedRate)
			}
			if tc.code == 200 && !strings.Contains(resp.Header.Get("Allow"), "POST") {
				t.Errorf("Allow %q does not permit POST", resp.Header.Get("Allow"))
			}
		})
	}
}

// postEvents POSTs body and returns the message ids of the answer.
func postEvents(t *testing.T, url string, h http.Header, body []byte) []string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	return doEvents(t, req)
}

// doEvents sends req and returns the message ids of the answer: messageIds
// of a batch, or the one messageId of a single event.
func doEvents(t *testing.T, req *http.Request) []string {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", req.Method, req.URL, resp.StatusCode, b)
	}
	var r struct {
		MessageIDs []string `json:"messageIds"`
		MessageID  string   `json:"messageId"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	if r.MessageID != "" {
		return []string{r.MessageID}
	}
	return r.MessageIDs
}

// sdkGoBinaryRequest is the request sdk-go 2.16's HTTP client sends for ev
// in binary mode, its default. Its protocol/http package cannot be
// imported here (it brings go.uber.org/zap into the module), so its
// request writer (write_request.go, headers.go) is copied: each attribute
// in a header named by textproto.CanonicalMIMEHeaderKey("ce-"+name),
// datacontenttype as Content-Type, an extension in "Ce-" and its name with
// the first letter upper-cased, values as types.Format writes them and not
// percent-encoded, the data as the body.
func sdkGoBinaryRequest(t *testing.T, url string, ev event.Event) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := binding.Write(t.Context(), (*binding.EventMessage)(&ev), nil, (*sdkGoRequestWriter)(req)); err != nil {
		t.Fatal(err)
	}
	return req
}

type sdkGoRequestWriter http.Request

var _ binding.BinaryWriter = (*sdkGoRequestWriter)(nil)

func (w *sdkGoRequestWriter) Start(context.Context) error { return nil }
func (w *sdkGoRequestWriter) End(context.Context) error   { return nil }

func (w *sdkGoRequestWriter) SetData(data io.Reader) error {
	b, err := io.ReadAll(data)
	if err != nil {
		return err
	}
	w.Body, w.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	return nil
}

func (w *sdkGoRequestWriter) SetAttribute(a spec.Attribute, v any) error {
	name := textproto.CanonicalMIMEHeaderKey("ce-" + a.Name())
	if a.Kind() == spec.DataContentType {
		name = "Content-Type"
	}
	s, err := types.Format(v)
	if err != nil {
		return err
	}
	w.Header[name] = append(w.Header[name], s)
	return nil
}

func (w *sdkGoRequestWriter) SetExtension(name string, v any) error {
	s, err := types.Format(v)
	if err != nil {
		return err
	}
	w.Header["Ce-"+string(unicode.ToUpper(rune(name[0])))+name[1:]] = []string{s}
	return nil
}
