package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// keyedDelivery runs an ordered subscription's DeliveryMode within one
// Receive call: how its keyed messages reach the call, and when each may
// start (doc.go describes both modes).
//
// The receiver owns the handler pool, the push subscription that every
// subscription's shared consumer (and per-key delivery's key consumers)
// deliver to, the messages it delivers, ack-deadline extension and the
// shutdown protocol. A mode owns its consumers, goroutines and locks, and
// hands messages that may start to receiver.launch.
//
// The receiver calls start once, check from its periodic subscription
// check, eachHeld from its extension loop, and at the end stop, then (once
// every handler has returned) end. Only eachHeld may run concurrently with
// the others.
type keyedDelivery interface {
	// start opens the mode's consumers and starts its background work; ctx
	// bounds the opening only. An error ends Receive.
	start(ctx context.Context) error
	// check runs with the receiver's periodic subscription check (about
	// once a second); it may call the server, within ctx.
	check(ctx context.Context)
	// eachHeld calls f for every delivery the mode holds, under the mode's
	// lock: f must not block or call back into the mode.
	eachHeld(f func(*delivery))
	// stop stops taking messages: what arrives from now on is handed back
	// and nothing more starts. It returns once the mode's consumers are
	// drained and its goroutines have ended, or at deadline.
	stop(deadline time.Time)
	// end settles what the mode still holds (confirming acks, handing back
	// the rest) and gives up what this process owned, by deadline.
	end(deadline time.Time)
}

// newKeyedDelivery returns the delivery mode of the receiver's
// subscription: nil when every message comes through the push
// subscription alone (without ordering).
func newKeyedDelivery(r *receiver) keyedDelivery {
	switch {
	case r.rec.partitioned():
		return newPartitionedMode(r)
	case r.rec.Ordering:
		return &perKeyMode{r: r, peers: make(map[string]bool)}
	}
	return nil
}

// perKeyMode is per-key delivery (DeliveryPerKey): JetStream holds back a
// key's next message (a consumer per key with MaxAckPending 1), whose
// messages the receiver's push subscription takes. The mode records the
// receiver as a member of the subscription, and runs the subscription's
// key discovery, clean-up (discovery.go) and take-over from gone members
// (takeover_perkey.go) while this process holds its lease.
type perKeyMode struct {
	r       *receiver
	members jetstream.KeyValue // the state bucket, which holds member records
	cancel  context.CancelFunc
	done    sync.WaitGroup

	// peers are the subscription's other members, by presence id, as
	// watchPeers last read their records; peersKnown once it has read
	// them all.
	peersMu    sync.Mutex
	peers      map[string]bool
	peersKnown bool

	// elections are the subscriptions to the leader elections of the key
	// consumers' streams (receiver.newLeaderLately).
	elections []*nats.Subscription
}

var _ keyedDelivery = (*perKeyMode)(nil)

func (m *perKeyMode) start(ctx context.Context) error {
	if err := m.watchElections(); err != nil {
		return err
	}
	if err := m.join(ctx); err != nil {
		return err
	}
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	for _, o := range newDiscoverers(m.r) {
		o.members = m.members
		m.done.Go(func() { o.run(octx) })
	}
	// Started with Receive, so that it has read the records by the time
	// redeliveries come; until then they are listed when needed.
	m.done.Go(func() { m.watchPeers(octx) })
	return nil
}

func (m *perKeyMode) check(context.Context)    { m.r.forgetRevocations() }
func (m *perKeyMode) eachHeld(func(*delivery)) {}

func (m *perKeyMode) stop(time.Time) {
	if m.cancel != nil {
		m.cancel()
	}
	m.done.Wait()
	for _, sub := range m.elections {
		_ = sub.Unsubscribe()
	}
}

// watchElections subscribes to nats-server's advisories of consumer
// leaders elected on the streams of the subscription's key consumers. A
// user without the permission to subscribe gets none (NATS reports the
// violation as an asynchronous error), and its receivers check copies of
// deposed leaders only as they did before (keyDeliveryDue).
func (m *perKeyMode) watchElections() error {
	streams := []string{m.r.rec.stream()}
	if m.r.rec.split() {
		streams = streams[:0]
		for _, i := range keyStreamIndexes(m.r.rec.KeyStreams) {
			streams = append(streams, keyrouter.KeyStreamName(m.r.rec.TopicProject, m.r.rec.Topic, i))
		}
	}
	for _, stream := range streams {
		sub, err := m.r.c.nc.Subscribe(consumerElectedAdvisory+"."+stream+".*", func(msg *nats.Msg) {
			var adv struct {
				Time time.Time `json:"timestamp"` // the elected leader's clock
			}
			_ = json.Unmarshal(msg.Data, &adv)
			m.r.leaderElected(msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:], adv.Time)
		})
		if err != nil {
			return fmt.Errorf("watch consumer leader elections: %w", err)
		}
		m.elections = append(m.elections, sub)
	}
	return nil
}

// consumerElectedAdvisory is the subject prefix of nats-server's
// advisories of consumer leaders elected, followed by the stream and the
// consumer.
const consumerElectedAdvisory = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED"

func (m *perKeyMode) end(deadline time.Time) { m.leave(deadline) }
