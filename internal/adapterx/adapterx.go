// Package adapterx is what package adapter offers this repository's own
// packages (the sidecar, cloudevents, didcomm) and keeps from its users:
// hooks for layers built on the library.
package adapterx

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/adapterx/link"
)

// Refuse fails a message that a layer above the topic could not encode (an
// invalid CloudEvent, say) exactly as Publish fails one it refuses: the
// result holds err, and a message with an ordering key pauses that key.
func Refuse(t *adapter.Topic, orderingKey string, err error) *adapter.PublishResult {
	return link.Refuse.(func(*adapter.Topic, string, error) *adapter.PublishResult)(t, orderingKey, err)
}

// Validate checks msg as Publish does before queueing it, without
// publishing: layers that take several messages in one request check them
// all first, so that a request with one bad message stores none.
func Validate(t *adapter.Topic, msg *adapter.Message) error {
	return link.Validate.(func(*adapter.Topic, *adapter.Message) error)(t, msg)
}

// State returns the KV bucket where layers above the adapter keep state of
// their own for the subscription (didcomm keeps its gap tracking there),
// and the key prefix that belongs to it. Keys under prefix+"." are the
// caller's; Delete removes them with the subscription. The prefix names
// this incarnation of the subscription, so a subscription deleted and
// created again with the same id starts with no state.
func State(ctx context.Context, s *adapter.Subscription) (kv jetstream.KeyValue, prefix string, err error) {
	return link.State.(func(context.Context, *adapter.Subscription) (jetstream.KeyValue, string, error))(ctx, s)
}

// Superseded is closed when m's subscription was sought after m was
// delivered: a layer above that has not yet passed m on should hand it
// back (Message.Release) instead. Nil for a message Receive did not
// deliver.
func Superseded(m *adapter.Message) <-chan struct{} {
	return link.Superseded.(func(*adapter.Message) <-chan struct{})(m)
}

// HandOver tells Receive that the layer above is done with m as a handler
// would be by returning, though its handler still waits for m's outcome:
// with pipelined ordering the next message of m's key may start. (The
// sidecar hands a message over once a client stream has it.) Without
// pipelining (or for a message without ordering key) it does nothing.
func HandOver(m *adapter.Message) { link.HandOver.(func(*adapter.Message))(m) }

// Revoked is closed when a pipelined key hands m back on its own (an
// earlier message of the key was nacked, and m comes again after it): a
// layer above should not pass m on, and its handler may return. Nil
// (never closed) without pipelining, or for a message Receive did not
// deliver.
func Revoked(m *adapter.Message) <-chan struct{} {
	return link.Revoked.(func(*adapter.Message) <-chan struct{})(m)
}

// FromStored reads a message as the topic stream holds it (its data and
// NATS headers) the way Receive would: ordering key, attributes, id and
// metadata, with h as its Header.
func FromStored(data []byte, h nats.Header) *adapter.Message {
	return link.FromStored.(func([]byte, nats.Header) *adapter.Message)(data, h)
}
