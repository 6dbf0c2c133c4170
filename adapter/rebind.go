package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// A push consumer delivers only while its leader believes someone
// listens on its deliver subject (nats-server's consumer.active, shown as
// push_bound in its info). The server learns that from notifications of
// interest, and a notification can be lost: a delivery that found no
// receiver sets the consumer inactive and then reads the interest again,
// and a receiver whose interest arrives between the two (a node that
// restarts, routes that come back) leaves it inactive for good; the
// notification channel also drops what does not fit
// (nats-server v2.15.2 consumer.go didNotDeliver, updateDeliveryInterest;
// sublist.go sendNotification). A key consumer left so delivers nothing
// more, although its receivers listen: its key stalls for good.
//
// watchBinding, run by the discovery lease's holder (a receiver, so the
// subscription has a listener), looks for key consumers that have
// messages to deliver and are not push bound, twice in a row without
// delivering anything between; it asks such a consumer's leader to step
// down, and the leader elected reads the interest afresh. A consumer of
// one replica has no other leader: it is logged.

// bindCheckInterval is how often the lease holder lists the stream's
// consumers for watchBinding, per bindCheckPage of them (a listing is a
// page of infos each): a consumer left unbound delivers again within
// about three intervals.
const (
	bindCheckInterval = 2 * time.Second
	bindCheckPage     = 256
	// restepAfter is how long a consumer whose leader was asked to step
	// down is left before it is asked again.
	restepAfter = 10 * time.Second
)

// bindWatch is what watchBinding remembers between two listings.
type bindWatch struct {
	// seen are the consumers found stalled unbound by the last listing,
	// at their delivered consumer sequence then.
	seen    map[string]uint64
	stepped map[string]time.Time // whose leader was asked to step down, when
	next    map[string]uint64
}

func newBindWatch() *bindWatch {
	return &bindWatch{seen: map[string]uint64{}, stepped: map[string]time.Time{}, next: map[string]uint64{}}
}

// observe takes in one consumer of a listing, and says whether its leader
// is to be asked to step down now: stalled unbound in this listing and the
// last, having delivered nothing between, and not asked lately.
func (w *bindWatch) observe(info *jetstream.ConsumerInfo, now time.Time) bool {
	if !stalledUnbound(info) {
		return false
	}
	was, ok := w.seen[info.Name]
	w.next[info.Name] = info.Delivered.Consumer
	if !ok || was != info.Delivered.Consumer {
		return false
	}
	if at, ok := w.stepped[info.Name]; ok && now.Sub(at) < restepAfter {
		return false
	}
	w.stepped[info.Name] = now
	return true
}

// listed ends a listing: what it found is what the next compares with.
func (w *bindWatch) listed(now time.Time) {
	w.seen, w.next = w.next, map[string]uint64{}
	for name, at := range w.stepped {
		if now.Sub(at) >= restepAfter {
			delete(w.stepped, name)
		}
	}
}

// watchBinding finds key consumers that stopped delivering for want of
// interest their receivers have, and has them elected again, while ctx
// lasts (the discovery lease is held).
func (o *discoverer) watchBinding(ctx context.Context) {
	prefix := keyrouter.KeyConsumerPrefix(o.rec.Project, o.rec.nameID())
	w := newBindWatch()
	interval := bindCheckInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		lctx, cancel := context.WithTimeout(ctx, o.c.cfg.apiTimeout)
		lister := o.stream.ListConsumers(lctx)
		n := 0 // every consumer of the stream is listed, other subscriptions' too
		for info := range lister.Info() {
			n++
			if !strings.HasPrefix(info.Name, prefix) {
				continue
			}
			if w.observe(info, time.Now()) {
				o.rebind(ctx, info)
			}
		}
		cancel()
		w.listed(time.Now())
		interval = bindCheckInterval * time.Duration(1+n/bindCheckPage)
	}
}

// stalledUnbound says whether a key consumer has messages to deliver, or
// to deliver again, and its leader believes nobody listens.
func stalledUnbound(info *jetstream.ConsumerInfo) bool {
	return !info.PushBound && !info.Paused && (info.NumPending > 0 || info.NumAckPending > 0)
}

// rebind asks the leader of a key consumer stalled unbound to step down.
func (o *discoverer) rebind(ctx context.Context, info *jetstream.ConsumerInfo) {
	log := o.c.cfg.logger.With("subscription", o.rec.ID, "consumer", info.Name,
		"pending", info.NumPending, "ack_pending", info.NumAckPending, "delivered", info.Delivered.Stream)
	if info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
		log.Warn("key consumer does not deliver: its server believes no receiver listens, and it has no other replica to lead it (restart the receivers to bind it again)")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, o.c.cfg.apiTimeout)
	defer cancel()
	err := o.stepDownConsumer(cctx, info.Name)
	if err != nil {
		log.Warn("key consumer does not deliver: its leader believes no receiver listens; asking it to step down failed, will try again", "err", err)
		return
	}
	log.Warn("key consumer did not deliver: its leader believed no receiver listens; it was asked to step down")
}

// stepDownConsumer asks a consumer's leader to step down, so that its
// replicas elect another.
func (o *discoverer) stepDownConsumer(ctx context.Context, name string) error {
	reply, err := o.c.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.LEADER.STEPDOWN."+o.streamName+"."+name, nil)
	if err != nil {
		return err
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return fmt.Errorf("consumer leader step-down: %w", err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}
