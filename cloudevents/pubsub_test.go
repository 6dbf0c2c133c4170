package cloudevents

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
)

// An event published in the Google Pub/Sub binding, in either mode, is
// stored so that Decode reads it as the event sent, and Pub/Sub clients
// get back the attributes sent (plus content-type when it was spelt
// otherwise). Values are plain in that binding: a literal "%41" stays
// "%41".
func TestFromPubSub(t *testing.T) {
	want := minimalEvent()
	want.SetSubject(`sujet é 100% "quoted" %41`)
	want.SetExtension("exstring", "with spaces, %41")
	want.SetExtension(ExtRecordedTime, "2026-11-21T10:00:00.123+01:00")
	if err := want.SetData("text/plain; charset=utf-8", []byte("data")); err != nil {
		t.Fatal(err)
	}
	binary := map[string]string{
		"ce-specversion": "1.0", "ce-id": want.ID(), "ce-source": want.Source(), "ce-type": want.Type(),
		"ce-subject": want.Subject(), "ce-exstring": "with spaces, %41", "ce-recordedtime": "2026-11-21T10:00:00.123+01:00",
	}
	with := func(attrs map[string]string, kv ...string) map[string]string {
		attrs = maps.Clone(attrs)
		for i := 0; i < len(kv); i += 2 {
			attrs[kv[i]] = kv[i+1]
		}
		return attrs
	}
	structured, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		attrs     map[string]string
		data      []byte
		delivered map[string]string // the attributes Pub/Sub clients get; nil: as sent
	}{
		{"binary", with(binary, "content-type", "text/plain; charset=utf-8", "origin", "web"), []byte("data"), nil},
		{"binary, Content-Type as sdk-go writes it", with(binary, "Content-Type", "text/plain; charset=utf-8"), []byte("data"),
			with(binary, "Content-Type", "text/plain; charset=utf-8", "content-type", "text/plain; charset=utf-8")},
		{"structured", map[string]string{"content-type": "application/cloudevents+json; charset=UTF-8"}, structured, nil},
		{"structured, with binary attributes too", with(binary, "content-type", "application/cloudevents+json"), structured, nil},
		{"structured, in another case", map[string]string{"Content-Type": "Application/CloudEvents+JSON"}, structured,
			map[string]string{"Content-Type": "Application/CloudEvents+JSON", "content-type": "Application/CloudEvents+JSON"}},
	} {
		sent := maps.Clone(tt.attrs)
		m := &adapter.Message{Data: tt.data, Attributes: tt.attrs}
		FromPubSub(m)
		if !maps.Equal(tt.attrs, sent) {
			t.Errorf("%s: the publisher's attributes were changed to %v", tt.name, tt.attrs)
		}
		stored := &adapter.Message{Data: m.Data, Attributes: m.Attributes, Header: testutil.NATSWire(t, m.Header)}
		got, err := Decode(stored)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		sameEvent(t, *got, want)
		delivered := tt.delivered
		if delivered == nil {
			delivered = sent
		}
		if attrs := stored.PubSubAttributes(); !maps.Equal(attrs, delivered) {
			t.Errorf("%s: delivered attributes\n %q\nwant\n %q", tt.name, attrs, delivered)
		}
	}

	for _, attrs := range []map[string]string{
		{"origin": "web"},
		{"content-type": "text/plain", "ce-id": "no specversion"},
	} {
		m := &adapter.Message{Data: []byte("x"), Attributes: attrs}
		FromPubSub(m)
		if m.Header != nil || !maps.Equal(m.Attributes, attrs) {
			t.Errorf("not a CloudEvent %v: rewritten to attributes %v, headers %v", attrs, m.Attributes, m.Header)
		}
	}
	// Headers already there are kept.
	m := &adapter.Message{Attributes: with(binary), Header: nats.Header{"X-Trace": {"1"}}}
	FromPubSub(m)
	if m.Header.Get("X-Trace") != "1" || m.Header.Get("ce-id") != PercentEncode(want.ID()) {
		t.Errorf("headers %v", m.Header)
	}
}
