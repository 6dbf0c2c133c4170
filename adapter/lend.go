package adapter

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/adapterx/link"
)

// What this package lends the repository's own packages (through
// internal/adapterx, which documents each) and keeps from its users.
func init() {
	link.Refuse = func(t *Topic, orderingKey string, err error) *PublishResult {
		return t.publisher().refuse(orderingKey, err)
	}
	link.Validate = func(t *Topic, msg *Message) error {
		_, err := t.encode(msg)
		return err
	}
	link.State = func(ctx context.Context, s *Subscription) (jetstream.KeyValue, string, error) { return s.state(ctx) }
	link.Superseded = func(m *Message) <-chan struct{} {
		if m.d == nil {
			return nil
		}
		return m.d.r.superseded
	}
	link.HandOver = func(m *Message) {
		if m.d == nil {
			return
		}
		if p, ok := m.d.home.(*partition); ok && p.g.window > 1 {
			p.handOver(m.d)
		}
	}
	link.FromStored = func(data []byte, h nats.Header) *Message {
		m := &Message{Data: data, Header: h}
		readHeaders(h, m)
		return m
	}
	link.Revoked = func(m *Message) <-chan struct{} {
		if m.d == nil {
			return nil
		}
		return m.d.revokedC
	}
}
