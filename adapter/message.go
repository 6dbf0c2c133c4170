package adapter

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/keyrouter"
)

// Message is one Pub/Sub message, an RSB event, as the application sees
// it: the value it fills in (Data, Attributes, OrderingKey, Header,
// CreateTime and the RSB user fields) and passes to Topic.Publish, and the
// value Receive hands its handler, with the fields marked "delivery only"
// read back from the stored message and its delivery. A delivered Message
// is also the handle to settle that delivery: exactly one of Ack,
// AckWithResult, Nack or Release counts; it is safe for concurrent use.
type Message struct {
	// ID is set by Publish (its result) and on delivery.
	ID string
	// Data is the payload.
	Data []byte
	// Attributes are string key/value pairs carried beside the payload.
	Attributes map[string]string
	// OrderingKey, when not empty, orders this message after every earlier
	// message with the same key, on every subscription with ordering enabled.
	OrderingKey string

	// Header holds extra NATS headers, written as they are: the way
	// protocol bindings such as CloudEvents' (ce-* headers) reach NATS
	// consumers that do not know jetorder. Names starting with Jetorder- or
	// Nats- are reserved. On delivery it holds every header of the stored
	// message, the adapter's own included.
	Header nats.Header

	// PublishTime is when the server stored the message (delivery only).
	PublishTime time.Time
	// StreamSequence is the message's position in its topic: one total
	// order of everything published to the topic (delivery only).
	StreamSequence uint64
	// DeliveryAttempt counts deliveries of this message to the subscription,
	// starting at 1 (delivery only).
	DeliveryAttempt int

	// The RSB event model (docs/WIRE.md). Publish does not modify the
	// message: it fills these in on the wire, and delivery reads them back.

	// SenderID is the publisher's id (delivery only).
	SenderID uuid.UUID
	// SequenceNumber is the publisher's 32-bit sequence number of the
	// message; ID is derived from it and SenderID (delivery only).
	SequenceNumber uint32
	// CreateTime is when the application created the message; Publish uses
	// the time of the Publish call when it is zero.
	CreateTime time.Time
	// SendTime is when the publisher sent the message (delivery only).
	SendTime time.Time
	// ReceiveTime is when the receiving process got the message, and
	// DeliverTime when it was handed to the handler (delivery only).
	ReceiveTime, DeliverTime time.Time
	// UserTimes and UserInfos are the application's own timestamps and
	// key/value options; Causes are the ids of the messages that caused
	// this one.
	UserTimes map[string]time.Time
	UserInfos map[string]string
	Causes    []uuid.UUID

	d *delivery
}

// Ack acknowledges the message: it is not delivered again, and the next
// message of its ordering key may be delivered. Ack and Nack after the first
// of them do nothing.
func (m *Message) Ack() {
	if m.d != nil {
		m.d.finish(ackAck)
	}
}

// AckWithResult acks the message and waits until the server confirms that
// it has the ack, or ctx ends (without a deadline, the client's API timeout
// applies). It costs a round trip to the server, where Ack costs none.
//
// It returns nil once the server has the ack: the message is not delivered
// to the subscription again. It returns an ErrAckInvalid error when the ack
// cannot take effect, and the message is (or will be) delivered again: it
// was nacked or handed back first, its deadline passed after its handler
// returned without an ack, a newer delivery of it is held, or its consumer
// is gone. It returns an ErrAckTimeout error when no confirmation came in
// time: the server may or may not have the ack, and calling AckWithResult
// again sends it again. With ordering, the next message of the key starts
// only once the ack is confirmed (after a timeout, a partitioned
// subscription keeps sending the ack until it is).
//
// It is safe for concurrent use; Ack, Nack and Release after it do nothing,
// and after Ack it confirms that ack. For a message Receive did not deliver
// it returns nil.
func (m *Message) AckWithResult(ctx context.Context) error {
	if m.d == nil {
		return nil
	}
	return m.d.ackConfirmed(ctx)
}

// Nack hands the message back: it is redelivered, before any later message
// of its ordering key, after the subscription's retry policy's backoff (at
// once without one).
func (m *Message) Nack() {
	if m.d != nil {
		m.d.finishWith(ackNak, m.d.r.nakPayload(m.DeliveryAttempt))
	}
}

// Release hands the message back for redelivery at once, whatever the retry
// policy: for a message the handler never passed on (a layer above that is
// shutting down, say), which is no failed attempt. The server records the
// hand-back in the consumer's stored state: a server restart before the
// redelivery does not make the message wait for its ack deadline.
func (m *Message) Release() {
	if m.d != nil {
		m.d.finishWith(ackNak, handBackPayload)
	}
}

// A layer that passes delivered messages on to consumers of its own, as
// the sidecar leases them to streaming-pull clients, learns from the three
// methods below when to pass a message on and when to stop. Each is safe
// for concurrent use and does not block.

// HandOver tells Receive that the application is done with the message as
// its handler would be by returning, though the handler goes on (waiting
// for the message's outcome from a consumer of its own, say): under
// PipelinedOrdering the next message of its key may start, and this one
// stays held until it is acked or nacked. The sidecar calls it once a
// client stream has the message, so that a key's messages follow each
// other on the stream without waiting for each one's ack. Where keys are
// delivered with StrictOrdering (PipelinedOrdering says when they are),
// for a message without ordering key, or for a message Receive did not
// deliver, it does nothing. Calling it again, or returning
// from the handler after it, is harmless.
func (m *Message) HandOver() {
	if m.d != nil && m.d.home.pipelines() {
		m.d.home.handOver(m.d)
	}
}

// Revoked returns a channel that is closed when Receive hands the message
// back on its own under PipelinedOrdering: an earlier message of its key
// was nacked, and this one comes again after it. Its outcome no longer
// counts (an Ack of it is not sent): a layer should not pass it on, and
// should forget it if it has; its handler may return. The channel is nil,
// never ready, without pipelining or for a message Receive did not
// deliver.
func (m *Message) Revoked() <-chan struct{} {
	if m.d == nil {
		return nil
	}
	return m.d.revokedC
}

// Superseded returns a channel that is closed once the subscription is
// sought (SeekToTime, SeekToSequence) after the message was delivered:
// the seek decides whether the subscription delivers it again, and
// handing it back acks it. A layer that has not yet passed the message on
// should not, and should Release it instead. The channel is nil, never
// ready, for a message Receive did not deliver.
func (m *Message) Superseded() <-chan struct{} {
	if m.d == nil {
		return nil
	}
	return m.d.r.superseded
}

// ReadMessage reads a message as a topic's stream stores it (the data and
// NATS headers a JetStream consumer or a direct get of the stream
// keyrouter.StreamName names returns) the way Receive reads it: its
// ordering key, attributes, ID and RSB event fields, with h as its Header.
// A header it cannot decode is ignored, as Receive ignores it. The fields
// that come from a delivery (PublishTime, StreamSequence, DeliveryAttempt,
// ReceiveTime) are left zero, and Ack and the other methods that settle a
// delivery do nothing.
func ReadMessage(data []byte, h nats.Header) *Message {
	m := &Message{Data: data, Header: h}
	readHeaders(h, m)
	return m
}

// PubSubAttributes returns the message's attributes as a Pub/Sub client
// of the sidecar sees them, and as subscription filters match them: the
// Attributes, plus every other header of the stored message that is not
// jetorder's or NATS' own (such as the ce-* and content-type headers that
// protocol bindings write), its name lower-cased, unless an attribute has
// that name. CloudEvents headers are percent-encoded by the NATS binding
// (ce-* values, and content-type beside ce-specversion); they are decoded,
// since the Pub/Sub binding carries plain values. m is not modified.
func (m *Message) PubSubAttributes() map[string]string {
	attrs, copied := m.Attributes, false
	event := false
	for name := range m.Header {
		if strings.EqualFold(name, "ce-specversion") {
			event = true
		}
	}
	for name, vals := range m.Header {
		lower := strings.ToLower(name)
		if len(vals) == 0 || strings.HasPrefix(lower, "jetorder-") || strings.HasPrefix(lower, "nats-") {
			continue
		}
		if _, ok := attrs[lower]; ok {
			continue
		}
		if !copied { // m.Attributes is the application's: never write to it
			attrs, copied = maps.Clone(m.Attributes), true
			if attrs == nil {
				attrs = make(map[string]string, len(m.Header))
			}
		}
		v := vals[0]
		if strings.HasPrefix(lower, "ce-") || event && lower == "content-type" {
			if d, err := keyrouter.DecodeKey(v); err == nil && utf8.ValidString(d) {
				v = d
			}
		}
		attrs[lower] = v
	}
	return attrs
}

// Limits on attributes, as Google Pub/Sub has them.
const (
	maxAttributes      = 100
	maxAttrKeyBytes    = 256
	maxAttrValueBytes  = 1024
	headerOrderingKey  = "Jetorder-Ordering-Key"
	headerAttrPrefix   = "Jetorder-Attr-"
	headerNatsMsgID    = "Nats-Msg-Id"
	googReservedPrefix = "goog"
)

func validateAttributes(attrs map[string]string) error {
	if len(attrs) > maxAttributes {
		return fmt.Errorf("%w: %d attributes, at most %d", ErrInvalidMessage, len(attrs), maxAttributes)
	}
	for k, v := range attrs {
		switch {
		case k == "":
			return fmt.Errorf("%w: empty attribute key", ErrInvalidMessage)
		case len(k) > maxAttrKeyBytes:
			return fmt.Errorf("%w: attribute key %.32q... longer than %d bytes", ErrInvalidMessage, k, maxAttrKeyBytes)
		case len(v) > maxAttrValueBytes:
			return fmt.Errorf("%w: attribute %q value longer than %d bytes", ErrInvalidMessage, k, maxAttrValueBytes)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return fmt.Errorf("%w: attribute %q is not valid UTF-8", ErrInvalidMessage, k)
		case strings.HasPrefix(k, googReservedPrefix):
			return fmt.Errorf("%w: attribute key %q: the prefix %q is reserved", ErrInvalidMessage, k, googReservedPrefix)
		}
	}
	return nil
}

// validateHeader checks the application's extra headers.
func validateHeader(h nats.Header) error {
	for name, vals := range h {
		lower := strings.ToLower(name)
		switch {
		case name == "" || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == ':' || r >= 0x7f }):
			return fmt.Errorf("%w: header name %q is not a token", ErrInvalidMessage, name)
		case strings.HasPrefix(lower, "jetorder-") || strings.HasPrefix(lower, "nats-"):
			return fmt.Errorf("%w: header %q: the prefixes Jetorder- and Nats- are reserved", ErrInvalidMessage, name)
		}
		for _, v := range vals {
			if strings.ContainsAny(v, "\r\n") {
				return fmt.Errorf("%w: header %q: value holds a line break", ErrInvalidMessage, name)
			}
		}
	}
	return nil
}

// writeHeaders puts the ordering key and attributes into h. Both are
// percent-encoded (docs/WIRE.md), so any UTF-8 survives NATS headers.
func writeHeaders(h nats.Header, msg *Message) {
	if msg.OrderingKey != "" {
		h[headerOrderingKey] = []string{keyrouter.EncodeKey(msg.OrderingKey)}
	}
	for k, v := range msg.Attributes {
		h[headerAttrPrefix+encodeHeaderName(k)] = []string{keyrouter.EncodeKey(v)}
	}
}

// readHeaders is the inverse of writeHeaders. A header this adapter did not
// write, or cannot decode, is ignored: it cannot be a key or attribute.
func readHeaders(h nats.Header, m *Message) {
	if v := h.Get(headerOrderingKey); v != "" {
		if k, err := keyrouter.DecodeKey(v); err == nil {
			m.OrderingKey = k
		}
	}
	m.ID = h.Get(headerNatsMsgID)
	readMetadata(h, m)
	for name, vals := range h {
		if !strings.HasPrefix(name, headerAttrPrefix) || len(vals) == 0 {
			continue
		}
		k, err1 := keyrouter.DecodeKey(name[len(headerAttrPrefix):])
		v, err2 := keyrouter.DecodeKey(vals[0])
		if err1 != nil || err2 != nil {
			continue
		}
		if m.Attributes == nil {
			m.Attributes = make(map[string]string)
		}
		m.Attributes[k] = v
	}
}

// encodeHeaderName keeps [A-Za-z0-9-_] and writes every other byte as %XX:
// a header name may not hold ':' or whitespace.
func encodeHeaderName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func sortByID[T any](s []T, id func(T) string) {
	sort.Slice(s, func(i, j int) bool { return id(s[i]) < id(s[j]) })
}
