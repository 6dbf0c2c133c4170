package cloudevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
)

// fullEvent has every attribute, an extension of every CloudEvents type,
// binary data and text that needs escaping.
func fullEvent(t *testing.T) event.Event {
	t.Helper()
	e := NewEvent()
	e.SetID("id-ü-1")
	e.SetSource("https://example.com/users/日本")
	e.SetType("com.example.user.updated")
	e.SetSubject(`a "quoted" 100% subject, with spaces\ and ünïcödé`)
	e.SetDataSchema("https://example.com/schema")
	e.SetTime(time.Date(2026, 11, 21, 10, 11, 12, 123456789, time.UTC))
	if err := e.SetData("application/octet-stream", []byte{0, 1, 2, 0xff, '\r', '\n'}); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("https://example.com/x?y=1")
	ref, _ := url.Parse("/relative/ref")
	e.SetExtension("flag", true)
	e.SetExtension("count", int32(-42))
	e.SetExtension("blob", []byte("bin\x00ary"))
	e.SetExtension("link", types.URI{URL: *u})
	e.SetExtension("ref", types.URIRef{URL: *ref})
	e.SetExtension("when", types.Timestamp{Time: time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)})
	e.SetExtension("note", "tab\there, percent %41, 😀")
	e.SetExtension(ExtSequence, "00000000000000000007")
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	return e
}

// sameEvent compares two events attribute by attribute, extensions by their
// canonical string (binary mode carries every extension as a string).
func sameEvent(t *testing.T, got, want event.Event) {
	t.Helper()
	if got.SpecVersion() != want.SpecVersion() || got.ID() != want.ID() || got.Source() != want.Source() ||
		got.Type() != want.Type() || got.Subject() != want.Subject() || got.DataSchema() != want.DataSchema() ||
		got.DataContentType() != want.DataContentType() || !got.Time().Equal(want.Time()) {
		t.Fatalf("attributes differ:\n got %v\nwant %v", got, want)
	}
	if !bytes.Equal(got.Data(), want.Data()) {
		t.Fatalf("data %q, want %q", got.Data(), want.Data())
	}
	if len(got.Extensions()) != len(want.Extensions()) {
		t.Fatalf("extensions %v, want %v", got.Extensions(), want.Extensions())
	}
	for name, wv := range want.Extensions() {
		ws, _ := types.Format(wv)
		gs, err := types.Format(got.Extensions()[name])
		if err != nil || gs != ws {
			t.Fatalf("extension %s = %q (%v), want %q", name, gs, err, ws)
		}
	}
}

func TestRoundTripBothModes(t *testing.T) {
	for _, mode := range []Mode{Binary, Structured} {
		want := fullEvent(t)
		m, err := Encode(want, mode)
		if err != nil {
			t.Fatal(err)
		}
		// What a subscriber gets: the stored headers and payload.
		got, err := Decode(&adapter.Message{Data: m.Data, Header: m.Header})
		if err != nil {
			t.Fatalf("mode %d: %v", mode, err)
		}
		sameEvent(t, *got, want)
	}
}

func TestBinaryHeadersArePercentEncoded(t *testing.T) {
	m, err := Encode(fullEvent(t), Binary)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get("ce-subject"); got != "a%20%22quoted%22%20100%25%20subject,%20with%20spaces\\%20and%20%C3%BCn%C3%AFc%C3%B6d%C3%A9" {
		t.Fatalf("ce-subject: %s", got)
	}
	if got := m.Header.Get("content-type"); got != "application/octet-stream" {
		t.Fatalf("content-type: %s", got)
	}
	for name, vals := range m.Header {
		for i := 0; i < len(vals[0]); i++ {
			if c := vals[0][i]; c <= ' ' || c >= 0x7f {
				t.Fatalf("header %s holds byte %#x", name, c)
			}
		}
	}
	s, err := Encode(fullEvent(t), Structured)
	if err != nil {
		t.Fatal(err)
	}
	if s.Header.Get("content-type") != StructuredContentType || !json.Valid(s.Data) {
		t.Fatalf("structured: header %v, payload %s", s.Header, s.Data)
	}
}

// What sdk-go's NATS JetStream bindings write: structured JSON with no
// content-type (v2), and binary ce- headers that are not percent-encoded,
// times in RFC3339Nano, content-type in lower case (v3).
func TestDecodesSDKGoEncodings(t *testing.T) {
	want := event.New()
	want.SetID("sdk-1")
	want.SetSource("/sdk")
	want.SetType("t")
	want.SetSubject("ünïcödé subject")
	want.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC))
	want.SetExtension(ExtRecordedTime, "2026-01-02T03:04:05.000006Z")
	if err := want.SetData("application/json", map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}

	structured, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(&adapter.Message{Data: structured})
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, *got, want)

	h := nats.Header{}
	h.Set("ce-specversion", want.SpecVersion())
	h.Set("ce-id", want.ID())
	h.Set("ce-source", want.Source())
	h.Set("ce-type", want.Type())
	h.Set("ce-subject", want.Subject())
	h.Set("ce-time", want.Time().Format(time.RFC3339Nano))
	h.Set("ce-recordedtime", "2026-01-02T03:04:05.000006Z")
	h.Set("content-type", "application/json")
	got, err = Decode(&adapter.Message{Data: want.Data(), Header: h})
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, *got, want)
}

// minimalEvent has only the required attributes (and no recordedtime).
func minimalEvent() event.Event {
	e := event.New()
	e.SetID("1")
	e.SetSource("/s")
	e.SetType("t")
	return e
}

func TestSequenceStampedFromStreamPositionWhenMissing(t *testing.T) {
	e := minimalEvent()
	stamped := func(pos uint64) string {
		t.Helper()
		m, err := Encode(e, Binary)
		if err != nil {
			t.Fatal(err)
		}
		m.StreamSequence = pos
		got, err := Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		seq, ok := Sequence(*got)
		if !ok || len(seq) != 20 {
			t.Fatalf("position %d: sequence %q", pos, seq)
		}
		return seq
	}
	if seq := stamped(42); seq != "00000000000000000042" {
		t.Fatalf("sequence %q", seq)
	}
	// 20 digits hold every uint64, so string order is number order up to
	// the last position.
	if a, b := stamped(9), stamped(math.MaxUint64); a >= b {
		t.Fatalf("%q sorts after %q", a, b)
	}

	// A producer's own sequence is kept.
	if err := SetSequence(&e, "b-0001"); err != nil {
		t.Fatal(err)
	}
	m, _ := Encode(e, Structured)
	m.StreamSequence = 42
	got, err := Decode(m)
	if err != nil {
		t.Fatal(err)
	}
	if seq, _ := Sequence(*got); seq != "b-0001" {
		t.Fatalf("producer sequence became %q", seq)
	}
}

func TestRecordedTimeKeepsTheProducersText(t *testing.T) {
	e := minimalEvent()
	const text = "2026-11-21T10:00:00.123+01:00" // not how sdk-go would write it
	e.SetExtension(ExtRecordedTime, text)
	for _, mode := range []Mode{Binary, Structured} {
		m, err := Encode(e, mode)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		tm, s, ok, err := RecordedTime(*got)
		if err != nil || !ok || s != text || !tm.Equal(time.Date(2026, 11, 21, 9, 0, 0, 123e6, time.UTC)) {
			t.Fatalf("mode %d: recordedtime %v %q %v %v", mode, tm, s, ok, err)
		}
	}
	// Encode stamps a missing one, with microseconds, in UTC.
	m, err := Encode(minimalEvent(), Binary)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.Header.Get("ce-recordedtime"); len(v) != len("2006-01-02T15:04:05.000000Z") || !strings.HasSuffix(v, "Z") {
		t.Fatalf("stamped recordedtime %q", v)
	}
}

func TestBadInputNamesTheAttribute(t *testing.T) {
	valid := minimalEvent
	noSource := valid()
	noSource.SetSource("")
	badRecorded := valid()
	badRecorded.SetExtension(ExtRecordedTime, "yesterday")
	emptySeq := valid()
	emptySeq.SetExtension(ExtSequence, "")
	for _, tt := range []struct {
		name string
		e    event.Event
		want string
	}{
		{"missing source", noSource, "source"},
		{"invalid recordedtime", badRecorded, "recordedtime"},
		{"empty sequence", emptySeq, "sequence"},
	} {
		_, err := Encode(tt.e, Binary)
		if !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an ErrInvalidEvent naming %s", tt.name, err, tt.want)
		}
	}
	if err := SetSequence(new(event.Event), ""); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("SetSequence(\"\"): %v", err)
	}

	good, _ := Encode(valid(), Binary)
	header := func(name, value string) nats.Header {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = v
		}
		h.Set(name, value)
		return h
	}
	for _, tt := range []struct {
		name string
		m    *adapter.Message
		want string
	}{
		{"bad percent-encoding", &adapter.Message{Header: header("ce-subject", "50%zz")}, "ce-subject"},
		{"truncated escape", &adapter.Message{Header: header("ce-type", "t%4")}, "ce-type"},
		{"escape that is not UTF-8", &adapter.Message{Header: header("ce-subject", "%FF")}, "ce-subject"},
		{"bad time", &adapter.Message{Header: header("ce-time", "noon")}, "time"},
		{"bad recordedtime", &adapter.Message{Header: header("ce-recordedtime", "noon")}, "recordedtime"},
		{"empty sequence", &adapter.Message{Header: header("ce-sequence", "")}, "sequence"},
		{"missing id", &adapter.Message{Header: header("ce-id", "")}, "id"},
		{"structured, not JSON", &adapter.Message{Data: []byte("{not json"), Header: nats.Header{"content-type": {StructuredContentType}}}, "JSON"},
		{"no headers, not JSON", &adapter.Message{Data: []byte("plain text")}, "JSON"},
		{"other format", &adapter.Message{Data: []byte("x"), Header: nats.Header{"content-type": {"application/cloudevents+avro"}}}, "format"},
		{"not a CloudEvent", &adapter.Message{Data: []byte("x"), Header: nats.Header{"content-type": {"text/plain"}}}, "ce-specversion"},
		{"unknown specversion", &adapter.Message{Header: header("ce-specversion", "2.0")}, "specversion"},
	} {
		_, err := Decode(tt.m)
		if !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an ErrInvalidEvent naming %s", tt.name, err, tt.want)
		}
	}
}

func TestPercentEncoding(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain", "": "", " ": "%20", "a\"b": "a%22b", "100%": "100%25",
		"ü": "%C3%BC", "tab\t": "tab%09", "~!": "~!",
	} {
		if got := PercentEncode(in); got != want {
			t.Errorf("PercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
	for _, s := range []string{"", "plain", "a b", `"%"`, "ü日本😀", "\x01\x7f", "%41"} {
		got, err := percentDecode(PercentEncode(s))
		if err != nil || got != s {
			t.Errorf("round trip of %q: %q, %v", s, got, err)
		}
	}
	if got, err := percentDecode("ünescaped is kept"); err != nil || got != "ünescaped is kept" {
		t.Errorf("unescaped UTF-8: %q, %v", got, err)
	}
}

// content-type carries a media type verbatim, as HTTP does and as sdk-go's
// NATS bindings read it (they decode nothing); only what is not a plain
// media type is percent-encoded, and every form reads back exactly, the
// same through Decode and through PubSubAttributes.
func TestContentTypeHeader(t *testing.T) {
	for _, tt := range []struct {
		name, contentType, header string
	}{
		{"parameters", "text/plain; charset=utf-8", "text/plain; charset=utf-8"},
		{"quoted parameter", `text/plain; charset="utf-8"`, `text/plain; charset="utf-8"`},
		{"a percent sign", "application/x; name=100%41", "application/x;%20name=100%2541"},
		{"not ASCII", `text/plain; title="é"`, "text/plain;%20title=%22%C3%A9%22"},
	} {
		e := minimalEvent()
		if err := e.SetData(tt.contentType, []byte("x")); err != nil {
			t.Fatal(err)
		}
		m, err := Encode(e, Binary)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := m.Header.Get(headerContentType); got != tt.header {
			t.Errorf("%s: content-type header %q, want %q", tt.name, got, tt.header)
		}
		m.Header = testutil.NATSWire(t, m.Header)
		got, err := Decode(m)
		if err != nil || got.DataContentType() != tt.contentType {
			t.Errorf("%s: decoded content type %q (%v), want %q", tt.name, got.DataContentType(), err, tt.contentType)
		}
		if attr := m.PubSubAttributes()[headerContentType]; attr != tt.contentType {
			t.Errorf("%s: content-type attribute %q, want %q", tt.name, attr, tt.contentType)
		}
	}

	if got := encodeContentType(" text/plain\t"); got != "%20text/plain%09" {
		t.Errorf("space around a content type, which a header loses: %q", got)
	}

	// What others wrote: earlier versions escaped every space; sdk-go
	// writes any value as it is, so one that does not decode is taken as
	// it is.
	good, err := Encode(minimalEvent(), Binary)
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]string{
		"text/plain;%20charset=utf-8": "text/plain; charset=utf-8",
		"text/plain; name=50%":        "text/plain; name=50%",
		"text/plain; name=%FF":        "text/plain; name=%FF",
	} {
		m := &adapter.Message{Header: nats.Header{}, Data: []byte("x")}
		for k, v := range good.Header {
			m.Header[k] = v
		}
		m.Header.Set(headerContentType, header)
		got, err := Decode(m)
		if err != nil || got.DataContentType() != want {
			t.Errorf("content-type %q: decoded %q (%v), want %q", header, got.DataContentType(), err, want)
		}
		if attr := m.PubSubAttributes()[headerContentType]; attr != want {
			t.Errorf("content-type %q: attribute %q, want %q", header, attr, want)
		}
	}
	m := &adapter.Message{Header: nats.Header{}}
	for k, v := range good.Header {
		m.Header[k] = v
	}
	m.Header.Set(headerContentType, "text/plain; name=\xff")
	if _, err := Decode(m); !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), "content-type") {
		t.Errorf("content-type not UTF-8: %v, want an ErrInvalidEvent naming content-type", err)
	}
}

// Media types are case-insensitive: a structured message is one whatever
// the case of its content type.
func TestStructuredContentTypeInAnyCase(t *testing.T) {
	want := minimalEvent()
	data, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range []string{"Application/CloudEvents+JSON", "application/cloudevents+json ; charset=UTF-8"} {
		got, err := Decode(&adapter.Message{Data: data, Header: nats.Header{headerContentType: {ct}}})
		if err != nil || got.ID() != want.ID() {
			t.Errorf("content-type %q: %v, %v", ct, got, err)
		}
	}
	for _, ct := range []string{"application/cloudevents+jsonx", "APPLICATION/CLOUDEVENTS-BATCH+JSON"} {
		if _, err := Decode(&adapter.Message{Data: data, Header: nats.Header{headerContentType: {ct}}}); !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), "format") {
			t.Errorf("content-type %q: %v, want an ErrInvalidEvent naming the format", ct, err)
		}
	}
}
