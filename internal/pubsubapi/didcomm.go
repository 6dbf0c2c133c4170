package pubsubapi

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
)

// Attributes the sidecar adds to each DIDComm message it delivers on a
// tracked subscription (docs/SIDECAR.md).
const (
	attrDIDCommThread         = "jetorder-didcomm-thread"
	attrDIDCommSender         = "jetorder-didcomm-sender"
	attrDIDCommSenderOrder    = "jetorder-didcomm-sender-order"
	attrDIDCommEvents         = "jetorder-didcomm-events"
	attrDIDCommReceivedOrders = "jetorder-didcomm-received-orders"
	attrDIDCommError          = "jetorder-didcomm-error"
)

// didcommRetryDelay is how long a message whose tracking failed on the
// store waits before it is handed back, so that a store outage does not
// turn into a redelivery loop (as didcomm.Receive does).
const didcommRetryDelay = time.Second

// didcommEvent is one tracker event as the events attribute lists it.
type didcommEvent struct {
	Event  string `json:"event"`
	Sender string `json:"sender"`
	// Order: out_of_order and gap_filled.
	Order uint64 `json:"order,omitempty"`
	// First and Last: gap_opened and gap_given_up; Orders: gap_given_up.
	First  uint64 `json:"first,omitempty"`
	Last   uint64 `json:"last,omitempty"`
	Orders uint64 `json:"orders,omitempty"`
}

// didcommTracking is a dispatcher's DIDComm tracker, opened on the first
// message of a tracked subscription.
type didcommTracking struct {
	sub *adapter.Subscription

	mu sync.Mutex
	t  *didcomm.Tracker
}

// tracker returns the subscription's shared tracker (its state in KV, as
// didcomm.Receive's), opening it on first use.
func (dt *didcommTracking) tracker(ctx context.Context) (*didcomm.Tracker, error) {
	dt.mu.Lock()
	defer dt.mu.Unlock()
	if dt.t != nil {
		return dt.t, nil
	}
	t, err := didcomm.OpenSubscriptionTracker(ctx, dt.sub)
	if err != nil {
		return nil, err
	}
	dt.t = t
	return t, nil
}

// opened is the tracker when it is open, or nil.
func (dt *didcommTracking) opened() *didcomm.Tracker {
	dt.mu.Lock()
	defer dt.mu.Unlock()
	return dt.t
}

// tracked is what the tracker made of a message to deliver.
type tracked struct {
	attrs   map[string]string // added to the delivered message
	t       *didcomm.Tracker  // nil: not tracked, nothing to release
	headers didcomm.Headers
	pos     uint64
}

// release tells the tracker the client acked the message: a later copy of
// it is dropped. It does no I/O while the thread is in memory.
func (tr *tracked) release(d *dispatcher) {
	if tr == nil || tr.t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.t.Release(ctx, tr.headers, tr.pos); err != nil {
		// The claim stays: only a redelivery of this very copy, if the ack
		// is lost, would be delivered again.
		d.s.log.Warn("didcomm: release not saved", "subscription", d.name, "thread", tr.headers.ThreadID(), "err", err)
	}
}

// observeDIDComm runs the subscription's tracker over m, on a tracked
// subscription. It returns nil and false when m is not to be delivered: a
// copy of a message already handled (acked here) or a message whose
// tracking failed on the store (handed back after a pause).
func (d *dispatcher) observeDIDComm(ctx context.Context, m *adapter.Message) (*tracked, bool) {
	h, err := didcomm.Read(m)
	switch {
	case errors.Is(err, didcomm.ErrNotDIDComm):
		return nil, true
	case err != nil:
		return &tracked{attrs: map[string]string{attrDIDCommError: err.Error()}}, true
	case !h.Sequenced():
		return nil, true
	}
	t, err := d.didcomm.tracker(ctx)
	var obs didcomm.Observation
	if err == nil {
		obs, err = t.Observe(ctx, h, m.StreamSequence)
	}
	switch {
	case errors.Is(err, didcomm.ErrMissingID) || errors.Is(err, didcomm.ErrMissingSender) ||
		errors.Is(err, didcomm.ErrTooManySenders) || errors.Is(err, didcomm.ErrStateTooLarge):
		return &tracked{attrs: map[string]string{attrDIDCommError: err.Error()}}, true
	case err != nil:
		d.s.log.Warn("didcomm: tracking failed; the message is handed back", "subscription", d.name, "thread", h.ThreadID(), "err", err)
		select {
		case <-time.After(didcommRetryDelay):
		case <-ctx.Done():
		}
		m.Nack()
		return nil, false
	case obs.Duplicate:
		d.s.b.Metrics.DIDComm(d.name, 0, 0, 0, 1)
		m.Ack()
		return nil, false
	}
	events := make([]didcommEvent, 0, len(obs.Events))
	mt := d.s.b.Metrics
	for _, e := range obs.Events {
		switch e.Kind {
		case didcomm.GapOpened:
			events = append(events, didcommEvent{Event: "gap_opened", Sender: e.Sender, First: e.Gap.First, Last: e.Gap.Last})
			mt.DIDComm(d.name, e.Gap.Len(), 0, 0, 0)
		case didcomm.GapFilled:
			events = append(events, didcommEvent{Event: "gap_filled", Sender: e.Sender, Order: e.Order})
			mt.DIDComm(d.name, 0, 1, 0, 0)
		case didcomm.OutOfOrder:
			events = append(events, didcommEvent{Event: "out_of_order", Sender: e.Sender, Order: e.Order})
		case didcomm.GapAbandoned:
			events = append(events, didcommEvent{Event: "gap_given_up", Sender: e.Sender, First: e.Gap.First, Last: e.Gap.Last, Orders: e.Gap.Len()})
			mt.DIDComm(d.name, 0, 0, e.Gap.Len(), 0)
		}
	}
	return &tracked{
		attrs: map[string]string{
			attrDIDCommThread:         h.ThreadID(),
			attrDIDCommSender:         h.From,
			attrDIDCommSenderOrder:    strconv.FormatUint(h.SenderOrder, 10),
			attrDIDCommEvents:         plainJSON(events),
			attrDIDCommReceivedOrders: plainJSON(obs.ReceivedOrders),
		},
		t: t, headers: h, pos: m.StreamSequence,
	}, true
}

// plainJSON is v in JSON, without escaping <, > and & (ids are copied
// as they are).
func plainJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // of the types above: cannot fail
	return strings.TrimSuffix(b.String(), "\n")
}
