package cloudevents

import (
	"errors"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
)

// FuzzDecode checks the CloudEvents NATS binding both ways:
//   - an event Encode accepts, in either mode, survives the NATS header
//     wire and decodes to the same event (plus the stamped sequence);
//     Encode refuses others with ErrInvalidEvent;
//   - Decode of that message with one header added or replaced (any name,
//     any value) and any payload either fails with ErrInvalidEvent or
//     yields a valid event with a non-empty sequence and a readable
//     recordedtime, which encodes again and decodes to itself.
func FuzzDecode(f *testing.F) {
	when := time.Date(2026, 11, 21, 10, 11, 12, 123456789, time.UTC).UnixNano()
	f.Add("order-7-paid", "/payments", "com.example.order.paid", "order 7", "partitionkey", "order-7", "text/plain", []byte("paid in full"), when, false,
		"ce-sequence", "00000000000000000042", []byte("paid in full"))
	f.Add("id-ü-1", "https://example.com/users/日本", "t", `a "quoted" 100% subject`, "note", "tab\there, %41 😀", "application/octet-stream",
		[]byte{0, 1, 0xff, '\r', '\n'}, int64(0), true, "content-type", "application/cloudevents+json", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t"}`))
	f.Add("1", "/s", "t", "", "sequence", "", "", []byte(nil), int64(-1), false, "ce-specversion", "0.3", []byte(nil))
	f.Add("1", "/s", "t", "", "recordedtime", "yesterday", "application/json", []byte(`{"a":1}`), int64(1), true, "Ce-Time", "2024-01-01T00:00:00Z", []byte(`{`))
	f.Add("1", "/s", "t", "", "x", "50%", "", []byte("x"), int64(0), false, "ce-x", "50%", []byte("x"))
	f.Fuzz(func(t *testing.T, id, source, typ, subject, extName, extValue, contentType string, data []byte, timeNanos int64, structured bool,
		name, value string, payload []byte) {
		e := NewEvent()
		e.SetID(id)
		e.SetSource(source)
		e.SetType(typ)
		if subject != "" {
			e.SetSubject(subject)
		}
		if timeNanos != 0 {
			e.SetTime(time.Unix(0, timeNanos))
		}
		e.SetExtension(extName, extValue)
		if len(data) > 0 || contentType != "" {
			if err := e.SetData(contentType, data); err != nil {
				return
			}
		}
		mode := Binary
		if structured {
			mode = Structured
		}
		m, err := Encode(e, mode)
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Encode refused %v with %v, not ErrInvalidEvent", e, err)
			}
			return
		}
		h := testutil.NATSWire(t, m.Header)
		got, err := Decode(&adapter.Message{Header: h, Data: m.Data, StreamSequence: 7})
		if err != nil {
			t.Fatalf("encoded event does not decode: %v\nheaders %v\ndata %q", err, m.Header, m.Data)
		}
		want := e.Clone()
		if _, ok := want.Extensions()[ExtSequence]; !ok {
			want.SetExtension(ExtSequence, "00000000000000000007")
		}
		if mode == Structured && len(want.Data()) == 0 {
			want.DataEncoded = nil // JSON has no empty data
		}
		sameEvent(t, *got, want)

		// Another writer's header and payload.
		h[name] = []string{value}
		dec, err := Decode(&adapter.Message{Header: h, Data: payload, StreamSequence: 9})
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Decode with %s: %q refused with %v, not ErrInvalidEvent", name, value, err)
			}
			return
		}
		if err := dec.Validate(); err != nil {
			t.Fatalf("Decode with %s: %q yields an invalid event: %v", name, value, err)
		}
		if seq, ok := Sequence(*dec); !ok || seq == "" {
			t.Fatalf("Decode with %s: %q yields no sequence", name, value)
		}
		if _, _, _, err := RecordedTime(*dec); err != nil {
			t.Fatalf("Decode with %s: %q yields an unreadable recordedtime: %v", name, value, err)
		}
		again, err := Encode(*dec, Binary)
		if err != nil {
			t.Fatalf("decoded event %v does not encode again: %v", dec, err)
		}
		back, err := Decode(&adapter.Message{Header: testutil.NATSWire(t, again.Header), Data: again.Data, StreamSequence: 11})
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		wantBack := dec.Clone()
		if _, ok := wantBack.Extensions()[ExtRecordedTime]; !ok {
			wantBack.SetExtension(ExtRecordedTime, back.Extensions()[ExtRecordedTime]) // Encode stamps one
		}
		sameEvent(t, *back, wantBack)
	})
}
