package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// presenceRoot is the first tokens of every receiver's presence subject.
const presenceRoot = "_jetorder.receiver."

// reconnectGrace is how long after this receiver's own connection came
// back (the NATS server it uses may have restarted, dropping every
// client) a missing presence answer proves nothing: the other receivers
// may still be reconnecting.
const reconnectGrace = 5 * time.Second

// presence is how an ordered subscription's receivers learn that another
// one is gone, for fast take-over (takeover.go, takeover_perkey.go).
// Every such receiver answers on a presence subject of its own while it
// runs. One whose subject has no responder ("no responders" from the
// server) has no connection to NATS: it cannot ack, nack or extend
// anything, and whatever it held comes back at its ack deadline unless
// another receiver hands it back sooner.
type presence struct {
	nc  *nats.Conn
	id  string
	sub *nats.Subscription

	// the connection's reconnect count when last looked at, and when it
	// last changed (reconnectedLately)
	mu            sync.Mutex
	reconnects    uint64
	reconnectedAt time.Time
}

func newPresence(nc *nats.Conn) *presence {
	return &presence{nc: nc, id: nuid.Next(), reconnects: nc.Stats().Reconnects}
}

// start answers on the presence subject: an empty request is a ping,
// answered empty; any other is given to answer (nil: pings only).
func (p *presence) start(answer func(req []byte) []byte) error {
	sub, err := p.nc.Subscribe(presenceRoot+p.id, func(msg *nats.Msg) {
		var reply []byte
		if len(msg.Data) > 0 && answer != nil {
			reply = answer(msg.Data)
		}
		_ = msg.Respond(reply)
	})
	if err != nil {
		return fmt.Errorf("presence: %w", err)
	}
	p.sub = sub
	return nil
}

// stop stops answering: from now on this receiver counts as gone.
func (p *presence) stop() {
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
	}
}

// gone reports whether the receiver id is certainly gone: the server has
// no subscription for its presence subject, and this receiver's own
// connection has not come back lately. Any other outcome, a timeout
// included, says it may be alive.
func (p *presence) gone(ctx context.Context, id string) bool {
	if id == p.id || p.reconnectedLately() {
		return false
	}
	return errors.Is(p.ping(ctx, id), nats.ErrNoResponders)
}

// ping asks the receiver id whether it is there, whatever this receiver's
// own connection did lately (which its caller weighs): nil when it
// answered, nats.ErrNoResponders when the server has no subscription for
// its presence subject, and any other error when neither could be told (a
// timeout, this connection down).
func (p *presence) ping(ctx context.Context, id string) error {
	if id == p.id {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err := p.nc.RequestWithContext(ctx, presenceRoot+id, nil)
	return err
}

// ask sends req to the receiver id and returns its answer; gone is true
// when nobody answers on its subject (see gone).
func (p *presence) ask(ctx context.Context, id string, req []byte) (answer []byte, gone bool, err error) {
	msg, err := p.nc.RequestWithContext(ctx, presenceRoot+id, req)
	if errors.Is(err, nats.ErrNoResponders) && !p.reconnectedLately() {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	return msg.Data, false, nil
}

// reconnectedLately reports whether the connection reconnected within
// reconnectGrace.
func (p *presence) reconnectedLately() bool {
	n := p.nc.Stats().Reconnects
	p.mu.Lock()
	defer p.mu.Unlock()
	if n != p.reconnects {
		p.reconnects, p.reconnectedAt = n, time.Now()
	}
	return !p.reconnectedAt.IsZero() && time.Since(p.reconnectedAt) < reconnectGrace
}
