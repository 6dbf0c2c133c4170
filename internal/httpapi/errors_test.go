package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/keyrouter"
)

func TestStatusOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("publish to projects/p/topics/t: %w", err) }
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"api error", errorf(http.StatusUnsupportedMediaType, "no"), 415},
		{"body too large", &http.MaxBytesError{Limit: 1}, 413},
		{"invalid project", keyrouter.ValidateProjectID("-"), 400},
		{"invalid topic", keyrouter.ValidateTopicID("x"), 400},
		{"empty key", keyrouter.ErrEmptyOrderingKey, 400},
		{"key too long", wrap(keyrouter.ErrOrderingKeyTooLong), 400},
		{"key not UTF-8", keyrouter.ErrOrderingKeyNotUTF8, 400},
		{"invalid message", wrap(adapter.ErrInvalidMessage), 400},
		{"invalid event", wrap(cloudevents.ErrInvalidEvent), 400},
		{"topic not found", wrap(adapter.ErrTopicNotFound), 404},
		// Another request's failure paused the key: whatever its cause,
		// this request may simply retry.
		{"paused key", fmt.Errorf("%w %q: %w", adapter.ErrPublishingPaused, "k", adapter.ErrInvalidMessage), 503},
		{"flow control", wrap(adapter.ErrFlowControlLimit), 503},
		{"topic stopped", adapter.ErrTopicStopped, 503},
		{"broker closed", adapter.ErrClosed, 503},
		{"deadline", wrap(context.DeadlineExceeded), 503},
		{"client gone", context.Canceled, 503},
		{"no responders", wrap(nats.ErrNoResponders), 503},
		{"connection closed", wrap(nats.ErrConnectionClosed), 503},
		{"reconnecting", nats.ErrConnectionReconnecting, 503},
		{"nats timeout", wrap(nats.ErrTimeout), 503},
		{"async publish timeout", jetstream.ErrAsyncPublishTimeout, 503},
		{"JetStream 503", wrap(&jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "JetStream system temporarily unavailable"}), 503},
		{"JetStream 500", &jetstream.APIError{Code: 500, Description: "something broke"}, 500},
		{"anything else", errors.New("disk on fire"), 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := statusOf(tc.err); got != tc.want {
				t.Errorf("statusOf(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// A handler that panics is answered 500, not with a dropped connection.
func TestPanicIsAnswered(t *testing.T) {
	h := New(Config{Broker: broker.New(nil, nil, nil)}).(*api)
	h.mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/boom", nil))
	var eb errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || rec.Code != 500 || eb.Error.Status != "INTERNAL" || !strings.Contains(eb.Error.Message, "boom") {
		t.Fatalf("%d %s (%v)", rec.Code, rec.Body, err)
	}
}

// FuzzReadEvent feeds arbitrary headers and bodies to the CloudEvents
// reader: it may refuse them, never panic.
func FuzzReadEvent(f *testing.F) {
	f.Add("Ce-Partitionkey", "k", "", "hi")
	f.Add("Ce-", "x", "text/plain", "")
	f.Add("Ce-Time", "2024-01-01T00:00:00Z", "application/cloudevents+json", `{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"aGk="}`)
	f.Add("Ce-Specversion", "0.3", "application/json", `{}`)
	f.Add("Ce-Datacontentencoding", "base64", "", "aGk=")
	f.Fuzz(func(t *testing.T, name, value, contentType, body string) {
		h := http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"/s"}, "Ce-Type": {"t"}}
		h[http.CanonicalHeaderKey(name)] = []string{value}
		if contentType != "" {
			h.Set("Content-Type", contentType)
		}
		m, err := newHTTPMessage(h)
		if err != nil {
			return
		}
		m.body = []byte(body)
		e, err := m.toEvent()
		if err != nil {
			return
		}
		if _, err := partitionKey(e); err != nil {
			return
		}
		_, _ = cloudevents.Encode(*e, cloudevents.Binary)
	})
}

// FuzzDecodeJSON: the publish request decoder refuses bad JSON, never
// panics.
func FuzzDecodeJSON(f *testing.F) {
	f.Add(`{"messages":[{"data":"aGk=","attributes":{"a":"b"},"orderingKey":"k"}]}`)
	f.Add(`{"messages":[{"data":1}]}`)
	f.Add(`{"messages":{"attributes":[]}}`)
	f.Fuzz(func(t *testing.T, body string) {
		var req publishRequest
		if err := decodeJSON([]byte(body), &req); err != nil && statusOf(err) != http.StatusBadRequest {
			t.Fatalf("decodeJSON(%q): status %d for %v", body, statusOf(err), err)
		}
		for _, m := range req.Messages {
			if m.Data != nil {
				_, _ = decodeBase64(*m.Data)
			}
		}
	})
}
