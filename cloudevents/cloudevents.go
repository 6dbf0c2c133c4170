// Package cloudevents publishes CloudEvents through jetorder topics and
// reads delivered messages back as CloudEvents (github.com/cloudevents/sdk-go/v2
// events), following the CloudEvents NATS protocol binding.
//
// Binary mode (the default) puts each attribute and extension in a
// ce-<name> header, percent-encoded as the binding says, datacontenttype in
// content-type (as it is: a media type needs no escaping), and the data as
// the payload. Structured mode puts the JSON
// event in the payload with content-type application/cloudevents+json.
// Decoding also accepts what sdk-go's own NATS JetStream bindings write:
// ce- headers that are not percent-encoded, and structured JSON without a
// content-type.
//
// Two extensions get special care:
//   - sequence: kept as the producer wrote it; when it is missing, Decode
//     stamps the message's position in its topic (20 digits, zero-padded),
//     which orders every event of the topic, whatever its source or
//     publisher.
//   - recordedtime: stamped once, by the producer (NewEvent, SetRecordedTime,
//     or Encode when it is missing), and carried as the exact string written.
package cloudevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
)

// Mode is how an event is laid out in a message.
type Mode int

const (
	// Binary puts attributes in ce- headers and the data in the payload.
	Binary Mode = iota
	// Structured puts the whole event, as JSON, in the payload.
	Structured
)

// Header names and the structured content type (docs/WIRE.md).
const (
	headerPrefix      = "ce-"
	headerContentType = "content-type"
	// StructuredContentType marks a structured-mode message.
	StructuredContentType = "application/cloudevents+json"
)

// ErrInvalidEvent is the error of every event that cannot be encoded or
// decoded; the message names the attribute at fault.
var ErrInvalidEvent = errors.New("invalid CloudEvent")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidEvent}, args...)...)
}

// NewEvent returns a CloudEvents 1.0 event with recordedtime set to now: the
// moment the producer creates it.
func NewEvent() event.Event {
	e := event.New()
	SetRecordedTime(&e, time.Now())
	return e
}

// Encode validates e and lays it out as a message in mode. A missing
// recordedtime is stamped now. The message carries no ordering key: Publish
// sets one.
func Encode(e event.Event, mode Mode) (*adapter.Message, error) {
	e = e.Clone()
	if err := checkExtensions(&e); err != nil {
		return nil, err
	}
	if _, ok := e.Extensions()[ExtRecordedTime]; !ok {
		SetRecordedTime(&e, time.Now())
	}
	if err := e.Validate(); err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkUTF8(e); err != nil {
		return nil, err
	}
	if mode == Structured {
		data, err := json.Marshal(e)
		if err != nil {
			return nil, invalid("%v", err)
		}
		return &adapter.Message{Data: data, Header: nats.Header{headerContentType: {StructuredContentType}}}, nil
	}
	h := nats.Header{}
	set := func(name, value string) { h[headerPrefix+name] = []string{PercentEncode(value)} }
	set("specversion", e.SpecVersion())
	set("id", e.ID())
	set("source", e.Source())
	set("type", e.Type())
	if v := e.Subject(); v != "" {
		set("subject", v)
	}
	if v := e.DataSchema(); v != "" {
		set("dataschema", v)
	}
	if t := e.Time(); !t.IsZero() {
		set("time", types.FormatTime(t))
	}
	if v := e.DataContentType(); v != "" {
		h[headerContentType] = []string{encodeContentType(v)}
	}
	for name, v := range e.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, invalid("extension %s: %v", name, err)
		}
		set(name, s)
	}
	return &adapter.Message{Data: e.Data(), Header: h}, nil
}

// checkUTF8 refuses attribute values that are not UTF-8: CloudEvents
// strings are Unicode, and Decode refuses them, so an event carrying one
// could be published but never read.
func checkUTF8(e event.Event) error {
	attrs := map[string]string{"id": e.ID(), "source": e.Source(), "type": e.Type(), "subject": e.Subject(),
		"dataschema": e.DataSchema(), "datacontenttype": e.DataContentType()}
	for name, v := range e.Extensions() {
		if s, err := types.Format(v); err == nil {
			attrs[name] = s
		}
	}
	for name, v := range attrs {
		if !utf8.ValidString(v) {
			return invalid("%s %q is not UTF-8", name, v)
		}
	}
	return nil
}

// Decode reads a delivered message as an event. A message without a
// sequence extension gets its position in the topic as one.
func Decode(m *adapter.Message) (*event.Event, error) {
	e, err := decode(m.Header, m.Data)
	if err != nil {
		return nil, err
	}
	if _, ok := e.Extensions()[ExtSequence]; !ok && m.StreamSequence > 0 {
		e.SetExtension(ExtSequence, fmt.Sprintf("%020d", m.StreamSequence))
	}
	return e, nil
}

func decode(h nats.Header, data []byte) (*event.Event, error) {
	contentType, binary := "", false
	for name, vals := range h {
		lower := strings.ToLower(name)
		switch {
		case lower == headerContentType && len(vals) > 0:
			ct, err := decodeContentType(vals[0])
			if err != nil {
				return nil, invalid("content-type: %v", err)
			}
			contentType = ct
		case lower == headerPrefix+"specversion":
			binary = true
		}
	}
	switch mt := mediaType(contentType); {
	case strings.HasPrefix(mt, "application/cloudevents"):
		if mt != StructuredContentType {
			return nil, invalid("content-type %q: only the JSON event format is supported", contentType)
		}
		return decodeStructured(data)
	case binary:
		return decodeBinary(h, contentType, data)
	case contentType == "":
		// sdk-go's NATS bindings write structured JSON without a
		// content-type.
		return decodeStructured(data)
	}
	return nil, invalid("content-type %q without a ce-specversion header: not a CloudEvent", contentType)
}

func decodeStructured(data []byte) (*event.Event, error) {
	// JSON text is UTF-8 (RFC 8259); sdk-go would keep invalid bytes in
	// string attributes, making an event that cannot be encoded again.
	if !utf8.Valid(data) {
		return nil, invalid("structured payload is not valid UTF-8")
	}
	e := event.New()
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, invalid("structured payload is not a JSON event: %v", err)
	}
	if err := checkExtensions(&e); err != nil {
		return nil, err
	}
	if err := e.Validate(); err != nil {
		return nil, invalid("%v", err)
	}
	return &e, nil
}

func decodeBinary(h nats.Header, contentType string, data []byte) (*event.Event, error) {
	attrs := map[string]string{}
	for name, vals := range h {
		lower := strings.ToLower(name)
		if !strings.HasPrefix(lower, headerPrefix) || len(vals) == 0 {
			continue
		}
		attr := lower[len(headerPrefix):]
		v, err := percentDecode(vals[0])
		if err != nil {
			return nil, invalid("header %s: %v", name, err)
		}
		attrs[attr] = v
	}
	version := attrs["specversion"]
	if version != event.CloudEventsVersionV1 && version != event.CloudEventsVersionV03 {
		return nil, invalid("specversion %q is not 1.0 or 0.3", version)
	}
	e := event.New(version)
	for attr, v := range attrs {
		switch attr {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "dataschema":
			e.SetDataSchema(v)
		case "datacontenttype":
			e.SetDataContentType(v)
		case "time":
			t, err := types.ParseTime(v)
			if err != nil {
				return nil, invalid("time %q is not an RFC 3339 timestamp", v)
			}
			e.SetTime(t)
		default:
			e.SetExtension(attr, v)
		}
	}
	if contentType != "" {
		e.SetDataContentType(contentType)
	}
	if len(data) > 0 {
		e.DataEncoded = data
	}
	if err := checkExtensions(&e); err != nil {
		return nil, err
	}
	if err := e.Validate(); err != nil {
		return nil, invalid("%v", err)
	}
	return &e, nil
}

// PublishOption changes how Publish writes an event.
type PublishOption func(*publishConfig)

type publishConfig struct {
	mode Mode
	key  *string
}

// WithMode chooses binary (the default) or structured mode.
func WithMode(m Mode) PublishOption { return func(c *publishConfig) { c.mode = m } }

// WithOrderingKey sets the ordering key; without it, the event's
// partitionkey extension, if any, is the key.
func WithOrderingKey(key string) PublishOption { return func(c *publishConfig) { c.key = &key } }

// Publish encodes e and publishes it to t. The ordering key is the one given
// by WithOrderingKey, else the partitionkey extension, else none.
func Publish(ctx context.Context, t *adapter.Topic, e event.Event, opts ...PublishOption) *adapter.PublishResult {
	cfg := publishConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	key := orderingKey(e, cfg)
	m, err := Encode(e, cfg.mode)
	if err != nil {
		return t.Refuse(key, err) // a keyed event pauses its key
	}
	m.OrderingKey = key
	return t.Publish(ctx, m)
}

func orderingKey(e event.Event, cfg publishConfig) string {
	if cfg.key != nil {
		return *cfg.key
	}
	if v, ok := e.Extensions()[ExtPartitionKey]; ok {
		if s, err := types.Format(v); err == nil {
			return s
		}
	}
	return ""
}

// Handler gets each delivered message as an event, or, when the message is
// not a valid CloudEvent, a nil event and the error. It acks or nacks m as
// any Receive handler does.
type Handler func(ctx context.Context, e *event.Event, m *adapter.Message, err error)

// Receive runs sub.Receive and decodes each message for h. A message that
// cannot be decoded is acked after h returns, unless h settled it: decoding
// it again would fail again, so it is never redelivered. To keep it, h can
// publish it to a dead-letter topic first.
func Receive(ctx context.Context, sub *adapter.Subscription, h Handler) error {
	return sub.Receive(ctx, func(ctx context.Context, m *adapter.Message) {
		e, err := Decode(m)
		h(ctx, e, m, err)
		if err != nil {
			m.Ack()
		}
	})
}
