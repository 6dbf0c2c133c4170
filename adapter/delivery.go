package adapter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

type ackKind int

const (
	ackAck ackKind = iota
	ackNak
	ackProgress
	ackTerminate
)

var ackPayload = [...][]byte{ackAck: []byte("+ACK"), ackNak: []byte("-NAK"), ackProgress: []byte("+WPI"), ackTerminate: []byte("+TERM")}

// handBackPayload is the nack of a message handed back (Release), and of
// every message handed back as Receive ends. A plain -NAK only queues the
// message for redelivery in the consumer leader's memory, which a server
// restart or a new consumer leader forgets: the message then waits out its
// ack deadline, and with ordering so do the later messages of its key (of
// its partition, until the new owner's fence clears). A nack with a delay,
// even of 0, makes the server move the message's deadline to now in the
// consumer's stored (and replicated) state, and redeliver it from there.
var handBackPayload = []byte(`-NAK {"delay":0}`)

// heldKey names one message of one consumer: redeliveries of a message this
// process still holds have the same heldKey.
type heldKey struct {
	consumer string
	seq      uint64
}

// holder keeps the deliveries of one source that this process holds, under
// a lock of its own: the receiver keeps the pushed messages (the shared
// consumer's and per-key consumers'), each partition its own. Its methods
// are safe for concurrent use and do not block on the network.
type holder interface {
	// current is the delivery of d's message held now (d, a redelivery of
	// it, or nil).
	current(d *delivery) *delivery
	// release forgets d: its deadline is no longer extended, and what was
	// waiting behind it may start. settled says the server has its ack or
	// terminate; otherwise the message comes back.
	release(d *delivery, settled bool)
	// confirmsAcks reports whether d's ack must be confirmed by the server
	// before d is released (a partitioned key's next message starts only
	// then).
	confirmsAcks() bool
	// ackSending records that d's ack is on its way (AckWithResult sends
	// it): the take-over fence stops counting d as unacked.
	ackSending(d *delivery)
	// confirmLater sends d's ack (d.acked) and releases d once a round
	// trip to the server shows the server has it, sending it again until
	// it does. With pipelined ordering the ack waits for the acks of the
	// earlier messages of its key, and is not sent at all if one of them
	// is nacked first (the message comes back after it).
	confirmLater(d *delivery)
	// handOver records that d's handler is done with it. With strict
	// ordering a message not acked by then comes back after its deadline;
	// with pipelined ordering it stays held (acked or nacked later) and the
	// next message of its key may start.
	handOver(d *delivery)
	// pipelines reports whether handOver keeps a delivery held while the
	// next message of its key starts (pipelined ordering): only then may a
	// layer above hand a message over before its handler returns
	// (Message.HandOver).
	pipelines() bool
}

// delivery is one message this process holds, from its arrival until it is
// acked, nacked or its handler returns without either.
type delivery struct {
	r       *receiver
	home    holder
	key     heldKey
	subject string
	reply   string
	msg     *Message
	arrived time.Time
	// lastExtend is when the deadline was last extended (Unix nanos).
	lastExtend atomic.Int64
	once       sync.Once
	// outcome is what the first of Ack, Nack, Release, AckWithResult (or
	// Receive) decided; read it only after once.Do has returned.
	outcome ackKind
	// ackState follows an ack to the server's confirmation
	// (AckWithResult).
	ackState atomic.Int32

	// revokedC is closed when a pipelined key hands d back before its
	// handler is done with it (an earlier message of the key was nacked);
	// nil unless the receiver pipelines.
	revokedC chan struct{}

	// Partitioned deliveries, guarded by their partition's lock.
	dseq       uint64  // the consumer's latest delivery sequence of it
	acked      ackKind // the ack or terminate being confirmed
	ackSent    bool    // its ack or terminate was sent
	ackMade    bool    // acked by the application; the ack may wait for earlier ones (pipelined)
	handedOver bool    // its handler is done with it (pipelined: the key's next may start)
	revoked    bool    // handed back with an earlier message of its key (pipelined)
}

// ackState is where a delivery's ack is on its way to the server.
const (
	ackNotSent   int32 = iota // or sent by Ack, which does not say
	ackSent                   // sent by AckWithResult, not confirmed
	ackConfirmed              // the server answered the ack: it has it
	ackRefused                // nobody took it, or it was not valid to send: the message comes back
)

// finish is the one place a delivery's outcome is decided: the first call
// wins, later ones do nothing.
func (d *delivery) finish(kind ackKind) { d.finishWith(kind, ackPayload[kind]) }

// finishWith is finish with the payload sent to the server (a nack with a
// delay).
func (d *delivery) finishWith(kind ackKind, payload []byte) {
	d.once.Do(func() {
		if kind == ackNak && d.r.isSuperseded() {
			// The subscription was sought: a message of the old epoch is
			// not delivered again by it (the new epoch delivers it if the
			// seek says so).
			kind, payload = ackAck, ackPayload[ackAck]
		} else if kind == ackNak && bytes.Equal(payload, ackPayload[ackNak]) && d.r.ending() {
			payload = handBackPayload
		}
		d.outcome = kind
		// An ack its holder confirms is counted as sent before it can reach
		// the server (a fence never counts it as unacked after the server
		// has it); everything else is forgotten at once (for a nack, before
		// it is sent: its redelivery may come at once, and must not be
		// taken for a copy of this one).
		if d.home.confirmsAcks() && (kind == ackAck || kind == ackTerminate) {
			// The holder sends it, in its order after a reconnect
			// (partitionedMode.confirmAcks), and again until confirmed.
			d.acked = kind
			d.home.confirmLater(d)
			return
		}
		if _, perKey := d.r.mode.(*perKeyMode); perKey {
			if kind == ackAck || kind == ackTerminate {
				d.r.noteAck(d)
			}
			d.r.traceFinished(d, payload)
		}
		d.home.release(d, false)
		if err := d.r.c.nc.Publish(d.reply, payload); err != nil {
			d.r.ackWarn.warn(d.r.c.cfg.logger, "ack not sent; the message will be redelivered", "subscription", d.r.sub.id, "err", err)
		}
	})
}

// ackConfirmed is finish(ackAck) that waits for the server to confirm the
// ack (AckWithResult): the ack goes as a request on the message's reply
// subject, which JetStream answers once it has applied the ack (a double
// ack; in a cluster, once the consumer's replicas have it).
//
// Until the answer the delivery stays held, its deadline extended, so a
// redelivery meanwhile is taken for a copy; the answer releases it, and a
// partitioned key's next message starts only then. An ack that went
// unanswered is, for a partitioned key, confirmed as Ack's are (sent until
// the server has it, and the key waits); elsewhere the delivery stays held
// until its handler returns, and if the ack was lost the message comes
// back after its deadline. A later call sends the ack again: acking twice
// is harmless. Under pipelined ordering it acks as Ack does, in its key's
// order, without waiting for the confirmation.
func (d *delivery) ackConfirmed(ctx context.Context) error {
	r := d.r
	if r.pipelined && d.home.confirmsAcks() {
		// Its ack may have to wait for the key's earlier ones: it goes in
		// their order, as Ack's (PipelinedOrdering).
		d.finish(ackAck)
		if d.outcome != ackAck {
			return fmt.Errorf("%w: it was handed back first", ErrAckInvalid)
		}
		select {
		case <-d.revokedC:
			// Revoked (an earlier message of its key was nacked) before its
			// ack could go: the partition nacks it instead.
			return fmt.Errorf("%w: it was handed back first", ErrAckInvalid)
		default:
		}
		return nil
	}
	first := false
	d.once.Do(func() {
		first = true
		d.outcome = ackAck
		// A delivery its handler returned from without an ack may still be
		// acked until the server's deadline for it passes; after that, or
		// once a newer delivery of it is held, the server has redelivered
		// it and the ack would take a message that is someone else's.
		cur := d.home.current(d)
		valid := cur == d || (cur == nil && time.Since(time.Unix(0, d.lastExtend.Load())) < r.rec.ackDeadline())
		if !valid {
			d.ackState.Store(ackRefused)
			return
		}
		d.ackState.Store(ackSent)
		d.home.ackSending(d) // as in finishWith: a fence never counts it unacked after the server has it
	})
	if d.outcome != ackAck {
		return fmt.Errorf("%w: it was handed back first", ErrAckInvalid)
	}
	switch d.ackState.Load() { // ackNotSent here: an Ack went first, without confirmation
	case ackConfirmed:
		return nil
	case ackRefused:
		return fmt.Errorf("%w: its deadline passed or it was delivered again", ErrAckInvalid)
	}
	cctx, cancel := r.c.withTimeout(ctx)
	defer cancel()
	_, err := r.c.nc.RequestWithContext(cctx, d.reply, ackPayload[ackAck])
	switch {
	case err == nil:
		d.ackState.Store(ackConfirmed)
		d.home.release(d, true)
		return nil
	case errors.Is(err, nats.ErrNoResponders):
		// Nobody received it, so the server does not have it: the
		// message is unacked there, as after a nack.
		d.ackState.Store(ackRefused)
		d.home.release(d, false)
		return fmt.Errorf("%w: nobody took the ack (its consumer is gone): %w", ErrAckInvalid, err)
	}
	if first && d.home.confirmsAcks() {
		d.acked = ackAck
		d.home.confirmLater(d)
	}
	return fmt.Errorf("%w: %w", ErrAckTimeout, err)
}

// abandon stops extending the deadline of a message whose handler returned
// without acking it: it is redelivered when its deadline passes, unless the
// application acks it first.
func (d *delivery) abandon() { d.home.release(d, false) }
