package didcomm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jetorder/jetorder/adapter"
)

const (
	// storeRetryDelay is how long Receive holds a message whose tracking
	// failed on the store before handing it back, so that a store outage
	// does not turn into a redelivery loop.
	storeRetryDelay = time.Second
	// releaseTimeout bounds Delivery.Ack's release, which loads the
	// thread's state when it is no longer in memory.
	releaseTimeout = 5 * time.Second
)

// Handler handles one message delivered by Receive.
type Handler func(ctx context.Context, d *Delivery)

// Delivery is a message Receive hands to a Handler, with what the tracker
// made of it.
type Delivery struct {
	// Message is the delivered message. Settle it with the Delivery's Ack
	// or Nack, not the Message's: Ack tells the tracker the copy was
	// handled.
	Message *adapter.Message
	// Headers are the message's sequencing headers; zero when it is not a
	// DIDComm message.
	Headers Headers
	// Tracked: the tracker observed the message (it is sequenced and its
	// headers are valid).
	Tracked bool
	// Events the tracker noticed on this message: a gap opened or filled,
	// an out-of-order arrival, gaps given up.
	Events []Event
	// Err is why a message with sequencing headers is not tracked: a header
	// error (ErrInvalidSenderOrder, ErrMissingSender, ...),
	// ErrTooManySenders or ErrStateTooLarge. The message is handed over all
	// the same; the handler decides what to do with it.
	Err error

	t       *Tracker
	settled sync.Once
}

// Ack acknowledges the message. For a tracked message it first tells the
// tracker (Tracker.Release): a copy delivered again after the ack is then
// a duplicate. The first of Ack and Nack wins.
func (d *Delivery) Ack() {
	d.settled.Do(func() {
		if d.Tracked {
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			if err := d.t.Release(ctx, d.Headers, d.Message.StreamSequence); err != nil {
				// The claim stays: only a redelivery of this very copy, if
				// the ack below is lost, would be handed over again.
				d.t.cfg.logger.Warn("didcomm: release not saved", "thread", d.Headers.ThreadID(), "err", err)
			}
			cancel()
		}
		d.Message.Ack()
	})
}

// Nack hands the message back for redelivery; the redelivered copy is
// handed over again, not dropped as a duplicate. The first of Ack and Nack
// wins.
func (d *Delivery) Nack() {
	d.settled.Do(d.Message.Nack)
}

// ReceivedOrders returns the gap view of the message's thread as the
// tracker has it now, ready for a received_orders header.
func (d *Delivery) ReceivedOrders(ctx context.Context) ([]ReceivedOrder, error) {
	if d.Headers.ThreadID() == "" {
		return nil, fmt.Errorf("%w: the message has no thread", ErrMissingID)
	}
	return d.t.ReceivedOrders(ctx, d.Headers.ThreadID())
}

// Receive runs sub.Receive with t observing every delivered DIDComm
// message (read with Read):
//   - a copy of a message already handed over (same thread, sender and
//     sender_order, whatever its sent_count) is acked and dropped before f;
//   - everything else reaches f, with the tracker's events and its headers;
//     messages that are not DIDComm, or carry no sender_order, untracked.
//
// Give every Receive on one subscription a tracker with the subscription's
// store (OpenSubscriptionTracker) and they share one view: a copy handled
// by one process is dropped by the others, and a restarted process goes on
// where its predecessor stopped. When the store cannot be reached, the
// message is handed back after a second and redelivered.
func Receive(ctx context.Context, sub *adapter.Subscription, t *Tracker, f Handler) error {
	if t == nil || f == nil {
		return fmt.Errorf("%w: didcomm.Receive needs a tracker and a handler", adapter.ErrInvalidConfig)
	}
	if t.boundTo != "" {
		store, err := SubscriptionStore(ctx, sub)
		if err != nil {
			return err
		}
		if store.prefix != t.boundTo {
			return fmt.Errorf("%w: the tracker was opened for another subscription, or for %s before it was deleted and created again", adapter.ErrInvalidConfig, sub)
		}
	}
	return sub.Receive(ctx, func(ctx context.Context, m *adapter.Message) {
		d := &Delivery{Message: m, t: t}
		h, err := Read(m)
		switch {
		case errors.Is(err, ErrNotDIDComm):
		case err != nil:
			d.Err = err
		case !h.Sequenced():
			d.Headers = h
		default:
			d.Headers = h
			obs, err := t.Observe(ctx, h, m.StreamSequence)
			switch {
			case errors.Is(err, ErrMissingID) || errors.Is(err, ErrMissingSender) || errors.Is(err, ErrTooManySenders) || errors.Is(err, ErrStateTooLarge):
				d.Err = err
			case err != nil:
				t.cfg.logger.Warn("didcomm: tracking failed; the message is handed back", "thread", h.ThreadID(), "err", err)
				select {
				case <-time.After(storeRetryDelay):
				case <-ctx.Done():
				}
				m.Nack()
				return
			case obs.Duplicate:
				m.Ack()
				return
			default:
				d.Tracked, d.Events = true, obs.Events
			}
		}
		f(ctx, d)
	})
}

// OpenSubscriptionTracker returns a tracker whose state is kept in the
// subscription's store (SubscriptionStore), for Receive on sub. Receive
// refuses it for any other subscription, and for sub once it was deleted
// and created again.
func OpenSubscriptionTracker(ctx context.Context, sub *adapter.Subscription, opts ...Option) (*Tracker, error) {
	store, err := SubscriptionStore(ctx, sub)
	if err != nil {
		return nil, err
	}
	t, err := NewTracker(append(opts, WithStore(store))...)
	if err != nil {
		return nil, err
	}
	t.boundTo = store.prefix
	return t, nil
}
