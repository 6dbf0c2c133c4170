package pubsubapi

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Subscription expiration (expiration_policy), as the service applies it:
// a subscription with no activity for its ttl is deleted. Activity is what
// the service counts, a subscriber consuming or operations on the
// subscription: a StreamingPull stream attached, Pull, Acknowledge,
// ModifyAckDeadline, UpdateSubscription, ModifyPushConfig, Seek, the
// sidecar pushing it, and its creation. Reading its configuration
// (GetSubscription, ListSubscriptions) is not.
//
// The time of a subscription's last activity is a record of the KV bucket
// JO_ACTIVITY (docs/WIRE.md), shared by the sidecars of a NATS server. A
// sidecar writes it at most once per activityGranularity per subscription
// (so the record may be up to that much older than the last activity), and
// every Config.ExpirationCheck it writes it for the subscriptions it has
// streams, Pull calls or pushes attached to, then deletes those whose
// record is older than their ttl and activityGranularity: never before
// the ttl has passed. A subscription without a record (created before
// this version, or by the library) starts counting at its next activity
// through a sidecar.

const (
	activityBucket      = "JO_ACTIVITY"
	activityGranularity = time.Hour
	// DefaultExpirationCheck is how often a sidecar looks for expired
	// subscriptions.
	DefaultExpirationCheck = 10 * time.Minute
	// activityWriteTimeout bounds one write of a subscription's activity.
	activityWriteTimeout = 10 * time.Second
)

// activityRecord is a subscription's JO_ACTIVITY record.
type activityRecord struct {
	Name string    `json:"name"` // projects/P/subscriptions/S
	At   time.Time `json:"at"`   // its last activity, to activityGranularity
}

// activity records subscriptions' activity and deletes the expired ones.
type activity struct {
	s   *Server
	js  jetstream.JetStream
	kv  grpcutil.LazyBucket
	now func() time.Time

	mu      sync.Mutex
	written map[string]time.Time // by subscription: the activity this process last wrote, or is writing
	closed  bool                 // no more writes start

	ctx    context.Context // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the check's goroutine and the writes touch started
}

func newActivity(s *Server, js jetstream.JetStream, replicas int, now func() time.Time) *activity {
	ctx, cancel := context.WithCancel(context.Background())
	return &activity{s: s, js: js, now: now, written: map[string]time.Time{}, ctx: ctx, cancel: cancel,
		kv: grpcutil.LazyBucket{Config: jetstream.KeyValueConfig{
			Bucket:      activityBucket,
			Description: "jetorder Pub/Sub subscriptions' last activity, for their expiration policies",
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		}}}
}

func activityKey(project, id string) string { return keyrouter.KVKey(project, id) }

// start runs the expiration check every period until close.
func (a *activity) start(period time.Duration) {
	a.wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-a.ctx.Done():
				return
			case <-t.C:
				a.check()
			}
		}
	})
}

// close stops the check and the writes under way, and waits for them to
// end.
func (a *activity) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
}

// touch records activity of subscription name now, unless this process
// wrote one less than activityGranularity ago: an RPC of the subscription
// pays for a write once an hour. The write goes on in the background,
// within activityWriteTimeout: no RPC waits for it (a cluster electing
// the bucket's leader held an Acknowledge, and the keys whose acks it
// carried, for the minute of its deadline). expire counts a write under
// way. A failure is logged; the next activity tries again.
func (a *activity) touch(name string) {
	if a == nil {
		return
	}
	now := a.now()
	a.mu.Lock()
	if last, ok := a.written[name]; a.closed || ok && now.Sub(last) < activityGranularity {
		a.mu.Unlock()
		return
	}
	a.written[name] = now
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(a.ctx, activityWriteTimeout)
		defer cancel()
		if err := a.record(ctx, name, now); err != nil {
			a.mu.Lock()
			if a.written[name].Equal(now) {
				delete(a.written, name)
			}
			a.mu.Unlock()
			if a.ctx.Err() == nil { // not the close
				a.s.log.Warn("subscription activity not recorded", "subscription", name, "err", err)
			}
		}
	}()
}

// lastTouched is the activity of subscription name this process wrote or
// is writing, if any.
func (a *activity) lastTouched(name string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.written[name]
	return at, ok
}

// record writes subscription name's activity at at.
func (a *activity) record(ctx context.Context, name string, at time.Time) error {
	if a == nil {
		return nil
	}
	project, id, err := parseSubscription(name)
	if err != nil {
		return err
	}
	kv, err := a.kv.Open(ctx, a.js)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(activityRecord{Name: name, At: at.UTC()})
	if _, err := kv.Put(ctx, activityKey(project, id), data); err != nil {
		return toStatus(err)
	}
	return nil
}

// forget removes a deleted subscription's record.
func (a *activity) forget(ctx context.Context, name string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	delete(a.written, name)
	a.mu.Unlock()
	project, id, err := parseSubscription(name)
	if err != nil {
		return
	}
	if kv, err := a.kv.Open(ctx, a.js); err == nil {
		_ = kv.Delete(ctx, activityKey(project, id))
	}
}

// check records the activity of the subscriptions attached here and
// deletes the expired ones.
func (a *activity) check() {
	ctx, cancel := context.WithTimeout(a.ctx, time.Minute)
	defer cancel()
	attached := map[string]bool{}
	for _, d := range a.s.dispatcherList() {
		attached[d.name] = true
		a.touch(d.name)
	}
	kv, err := a.kv.Open(ctx, a.js)
	if err != nil {
		a.s.log.Warn("subscription expiration: "+activityBucket+" unreadable", "err", err)
		return
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		a.s.log.Warn("subscription expiration: "+activityBucket+" unreadable", "err", err)
		return
	}
	for key := range keys.Keys() {
		if err := a.expire(ctx, kv, key, attached); err != nil {
			a.s.log.Warn("subscription expiration", "key", key, "err", err)
		}
	}
}

// expire deletes the subscription of record key if it has expired.
func (a *activity) expire(ctx context.Context, kv jetstream.KeyValue, key string, attached map[string]bool) error {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var rec activityRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || attached[rec.Name] {
		return err
	}
	sub, err := a.s.subscriptionOf(rec.Name)
	if err != nil {
		return err
	}
	cfg, err := sub.Config(ctx)
	if status.Code(toStatus(err)) == codes.NotFound {
		return kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
	}
	if err != nil {
		return err
	}
	ttl := decodeSubSettings(cfg.ServiceSettings).ExpirationMS
	if ttl == nil || *ttl <= 0 {
		return nil // never expires
	}
	if at, ok := a.lastTouched(rec.Name); ok && at.After(rec.At) {
		rec.At = at // written here lately, or being written
	}
	idle := a.now().Sub(rec.At)
	if idle < time.Duration(*ttl)*time.Millisecond+activityGranularity {
		return nil
	}
	// The record is still the one read: no activity since.
	if cur, err := kv.Get(ctx, key); err != nil || cur.Revision() != e.Revision() {
		return err
	}
	if _, err := a.s.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: rec.Name}); err != nil && status.Code(err) != codes.NotFound {
		return err
	}
	a.s.log.Info("subscription expired: deleted", "subscription", rec.Name, "idle", idle.Round(time.Second),
		"ttl", time.Duration(*ttl)*time.Millisecond)
	return nil
}
