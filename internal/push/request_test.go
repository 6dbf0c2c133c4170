package push

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

var testMsg = Message{
	Data:        []byte("hello <world>"),
	Attributes:  map[string]string{"b": "2", "a": "1"},
	ID:          "1234",
	OrderingKey: "key-1",
	PublishTime: time.Date(2021, 2, 26, 19, 13, 55, 749_000_000, time.FixedZone("x", 3600)),
	Topic:       "projects/p/topics/t",
}

const testSub = "projects/p/subscriptions/s"

func readBody(t *testing.T, r *http.Request) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNewRequestWrapper(t *testing.T) {
	for _, c := range []struct {
		name    string
		attempt int
		want    string
	}{
		{"no dead-letter policy", 0, `{"message":{"attributes":{"a":"1","b":"2"},"data":"aGVsbG8gPHdvcmxkPg==","messageId":"1234","message_id":"1234","orderingKey":"key-1","publishTime":"2021-02-26T18:13:55.749Z","publish_time":"2021-02-26T18:13:55.749Z"},"subscription":"projects/p/subscriptions/s"}`},
		{"with delivery attempt", 3, `{"message":{"attributes":{"a":"1","b":"2"},"data":"aGVsbG8gPHdvcmxkPg==","messageId":"1234","message_id":"1234","orderingKey":"key-1","publishTime":"2021-02-26T18:13:55.749Z","publish_time":"2021-02-26T18:13:55.749Z"},"subscription":"projects/p/subscriptions/s","deliveryAttempt":3}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := testMsg
			m.DeliveryAttempt = c.attempt
			req, err := NewRequest(t.Context(), "http://localhost/push", Wrapper, testSub, m)
			if err != nil {
				t.Fatal(err)
			}
			if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
				t.Errorf("method %s, content-type %q", req.Method, req.Header.Get("Content-Type"))
			}
			if got := readBody(t, req); got != c.want {
				t.Errorf("body\n got %s\nwant %s", got, c.want)
			}
			if req.GetBody == nil {
				t.Error("GetBody is nil: the request cannot be replayed")
			}
		})
	}
	// A message with neither attributes, data nor ordering key, published at
	// a whole second.
	req, err := NewRequest(t.Context(), "http://localhost/", Wrapper, testSub, Message{ID: "1", PublishTime: time.Unix(10, 0)})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"message":{"messageId":"1","message_id":"1","publishTime":"1970-01-01T00:00:10Z","publish_time":"1970-01-01T00:00:10Z"},"subscription":"projects/p/subscriptions/s"}`
	if got := readBody(t, req); got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
}

func TestFormatTime(t *testing.T) {
	for ns, want := range map[int]string{
		0: "2000-01-02T03:04:05Z", 5_000_000: "2000-01-02T03:04:05.005Z",
		5_000: "2000-01-02T03:04:05.000005Z", 5: "2000-01-02T03:04:05.000000005Z",
	} {
		if got := formatTime(time.Date(2000, 1, 2, 3, 4, 5, ns, time.UTC)); got != want {
			t.Errorf("formatTime(%d ns) = %s, want %s", ns, got, want)
		}
	}
}

func TestNewRequestNoWrapper(t *testing.T) {
	req, err := NewRequest(t.Context(), "http://localhost/", NoWrapper, testSub, testMsg)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, req); got != "hello <world>" {
		t.Errorf("body %q", got)
	}
	for k := range req.Header {
		if k != "User-Agent" {
			t.Errorf("unexpected header %s without write_metadata", k)
		}
	}

	m := testMsg
	m.DeliveryAttempt = 2
	req, err = NewRequest(t.Context(), "http://localhost/", NoWrapperWithMetadata, testSub, m)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, req); got != "hello <world>" {
		t.Errorf("body %q", got)
	}
	want := map[string]string{
		"a": "1", "b": "2",
		HeaderSubscription:    testSub,
		HeaderMessageID:       "1234",
		HeaderPublishTime:     "2021-02-26T18:13:55.749Z",
		HeaderOrderingKey:     "key-1",
		HeaderDeliveryAttempt: "2",
		"User-Agent":          userAgent,
	}
	for k, v := range want {
		if got := req.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if len(req.Header) != len(want) {
		t.Errorf("headers %v, want exactly %v", req.Header, want)
	}
}

func TestNewRequestNoWrapperUnencodable(t *testing.T) {
	for name, attrs := range map[string]map[string]string{
		"bad name":       {"a b": "1"},
		"newline value":  {"a": "1\r\nX-Injected: yes"},
		"framing header": {"content-length": "1"},
		"host header":    {"Host": "evil.com"},
	} {
		t.Run(name, func(t *testing.T) {
			m := testMsg
			m.Attributes = attrs
			_, err := NewRequest(t.Context(), "http://localhost/", NoWrapperWithMetadata, testSub, m)
			if !errors.Is(err, ErrUnencodable) {
				t.Fatalf("err = %v, want ErrUnencodable", err)
			}
		})
	}
	// Without write_metadata attributes are not sent, so they cannot fail.
	m := testMsg
	m.Attributes = map[string]string{"a b": "\n"}
	if _, err := NewRequest(t.Context(), "http://localhost/", NoWrapper, testSub, m); err != nil {
		t.Fatal(err)
	}
}

func TestNewRequestCloudEventsEnvelope(t *testing.T) {
	req, err := NewRequest(t.Context(), "http://localhost/", CloudEvents, testSub, testMsg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce-specversion": "1.0",
		"ce-id":          "1234",
		"ce-source":      "//pubsub.googleapis.com/projects/p/topics/t",
		"ce-type":        "google.cloud.pubsub.topic.v1.messagePublished",
		"ce-time":        "2021-02-26T18:13:55.749Z",
		"Content-Type":   "application/json",
	}
	for k, v := range want {
		if got := req.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	wrapped, err := NewRequest(t.Context(), "http://localhost/", Wrapper, testSub, testMsg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readBody(t, req), readBody(t, wrapped); got != want {
		t.Errorf("body %s, want the wrapper %s", got, want)
	}
}

func TestNewRequestCloudEventsBinding(t *testing.T) {
	m := Message{
		Data: []byte(`{"x":1}`),
		ID:   "99",
		Attributes: map[string]string{
			"ce-specversion": "1.0",
			"ce-id":          "evt-1",
			"ce-source":      "/orders",
			"ce-type":        "order.created",
			"ce-subject":     `50% "off" café`,
			"content-type":   "application/json",
			"other":          "dropped",
		},
	}
	req, err := NewRequest(t.Context(), "http://localhost/", CloudEvents, testSub, m)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Ce-Specversion": "1.0",
		"Ce-Id":          "evt-1",
		"Ce-Source":      "/orders",
		"Ce-Type":        "order.created",
		"Ce-Subject":     "50%25%20%22off%22%20caf%C3%A9",
		"Content-Type":   "application/json",
		"User-Agent":     userAgent,
		// The message's Pub/Sub metadata: the event has no message id.
		HeaderSubscription: testSub,
		HeaderMessageID:    "99",
	}
	for k, v := range want {
		if got := req.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if len(req.Header) != len(want) {
		t.Errorf("headers %v, want exactly %v", req.Header, want)
	}
	if got := readBody(t, req); got != `{"x":1}` {
		t.Errorf("body %q", got)
	}
}

// A message holding a structured-mode event is pushed as that event.
func TestNewRequestCloudEventsStructured(t *testing.T) {
	event := `{"specversion":"1.0","id":"e1","source":"/s","type":"t","data":{"x":1}}`
	m := Message{Data: []byte(event), ID: "7", OrderingKey: "k",
		Attributes: map[string]string{"Content-Type": "application/cloudevents+json; charset=utf-8", "other": "dropped"}}
	req, err := NewRequest(t.Context(), "http://localhost/", CloudEvents, testSub, m)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Content-Type"); got != "application/cloudevents+json; charset=utf-8" {
		t.Errorf("Content-Type %q", got)
	}
	if req.Header.Get("Ce-Id") != "" || req.Header.Get("Other") != "" {
		t.Errorf("binary-mode or attribute headers on a structured event: %v", req.Header)
	}
	if req.Header.Get(HeaderOrderingKey) != "k" || req.Header.Get(HeaderMessageID) != "7" {
		t.Errorf("metadata headers %v", req.Header)
	}
	if got := readBody(t, req); got != event {
		t.Errorf("body %q, want the event", got)
	}
}

func TestParseFormat(t *testing.T) {
	cases := []struct {
		label           string
		noWrapper, meta bool
		want            Format
		err             bool
	}{
		{"", false, false, Wrapper, false},
		{"", true, false, NoWrapper, false},
		{"", true, true, NoWrapperWithMetadata, false},
		{"cloudevents", false, false, CloudEvents, false},
		{"cloudevents", true, false, 0, true},
		{"structured", false, false, 0, true},
	}
	for _, c := range cases {
		got, err := ParseFormat(c.label, c.noWrapper, c.meta)
		if c.err {
			if !errors.Is(err, ErrInvalidPushConfig) {
				t.Errorf("ParseFormat(%q, %v, %v) err = %v, want ErrInvalidPushConfig", c.label, c.noWrapper, c.meta, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseFormat(%q, %v, %v) = %v, %v, want %v", c.label, c.noWrapper, c.meta, got, err, c.want)
		}
	}
}

func TestCheckPushAttributes(t *testing.T) {
	for _, v := range []map[string]string{nil, {"x-goog-version": "v1"}, {"x-goog-version": "v1beta2"}, {"other": "x"}} {
		if err := CheckPushAttributes(v); err != nil {
			t.Errorf("CheckPushAttributes(%v): %v", v, err)
		}
	}
	for _, v := range []map[string]string{{"x-goog-version": "v1beta1"}, {"x-goog-version": "v2"}} {
		if err := CheckPushAttributes(v); !errors.Is(err, ErrInvalidPushConfig) {
			t.Errorf("CheckPushAttributes(%v) = %v, want ErrInvalidPushConfig", v, err)
		}
	}
}
