package pubsubapi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/keyrouter"
)

// Push subscriptions.
//
// A subscription with a push_config.push_endpoint is delivered by the
// sidecars: each one runs a pusher for it, attached to the subscription's
// dispatcher as a stream would be, which POSTs every message it takes to
// the endpoint (internal/push builds and sends the request). Several
// sidecars on one NATS server share the subscription's messages as their
// Receive calls share them, so each one pushes to its own app when the
// endpoint is a loopback address.
//
// Order: the adapter hands a pusher the next message of an ordering key
// only once the previous one was acked, that is once the endpoint answered
// it with a success code, so one request per key is in flight. Keys go in
// parallel up to PushMaxOutstanding requests; unkeyed messages have a
// budget of their own, so they never wait behind keys.
//
// Failures (a status that is not an ack, a timeout, a refused connection)
// nack the message. With a retry policy the adapter delays its redelivery;
// without one the pusher holds it for Pub/Sub's push backoff (100 ms
// doubling to 60 s) before nacking, so a failing key pauses while others
// go on. The dead-letter policy applies as for pull.
//
// Which subscriptions push: the KV bucket JO_PUSH has an entry for every
// subscription that has had a push endpoint, written before the
// subscription's record; every sidecar watches it and keeps a watcher per
// entry that pushes while the record has an endpoint. The subscription's
// record stays the truth: an entry of a subscription that went back to
// pull costs its watcher one record read every pushIdlePoll, and the
// entry goes with the subscription.

const (
	pushBucket = "JO_PUSH"
	// pushIdlePoll is how often the watcher of a subscription that does
	// not push (yet, or any more) reads its record.
	pushIdlePoll = 2 * time.Second
	// pushIndexGrace is how long a JO_PUSH entry without a subscription
	// is taken for one being created (the entry is written first) before
	// it is removed.
	pushIndexGrace = time.Minute
	// pushLeaseSlack keeps a pushed message's lease a little beyond the
	// request's timeout, so that the request, not the lease, times out.
	pushLeaseSlack = 5 * time.Second
	// DefaultPushMaxOutstanding is Config.PushMaxOutstanding's default.
	DefaultPushMaxOutstanding = 100
)

// errPushSubscription is Pull's and StreamingPull's answer on a push
// subscription, as the service's.
var errPushSubscription = status.Error(codes.FailedPrecondition, "This method is not supported for push subscriptions.")

// pushTarget is where and how a dispatcher's messages are pushed; nil
// for a pull subscription.
type pushTarget struct {
	settings *pushSettings
	format   push.Format
}

func newPushTarget(cfg *adapter.SubscriptionConfig) *pushTarget {
	ps := decodeSubSettings(cfg.ServiceSettings).Push
	if ps == nil {
		return nil
	}
	// Checked when the config was set (checkPush); a format written by a
	// newer sidecar that this one does not know falls back to the wrapper.
	f, _ := push.ParseFormat(cfg.Labels[push.FormatLabel], ps.NoWrapper, ps.WriteMetadata)
	return &pushTarget{settings: ps, format: f}
}

// checkPush checks a push config of subscription name with the labels it
// will have: the endpoint against --push-allow, the attributes and the
// request format. An oidc_token is accepted with a warning: no token is
// sent.
func (s *Server) checkPush(name string, ps *pushSettings, labels map[string]string) error {
	if ps == nil {
		return nil
	}
	if s.pusher == nil {
		return invalid("subscription %s: push subscriptions are disabled in this sidecar (%s is off)", name, push.FlagName)
	}
	if err := s.pusher.allow.Check(ps.Endpoint); err != nil {
		return invalid("subscription %s: push_config.push_endpoint: %v", name, err)
	}
	if err := push.CheckPushAttributes(ps.Attributes); err != nil {
		return invalid("subscription %s: %v", name, err)
	}
	if _, err := push.ParseFormat(labels[push.FormatLabel], ps.NoWrapper, ps.WriteMetadata); err != nil {
		return invalid("subscription %s: %v", name, err)
	}
	if ps.OIDC {
		s.log.Warn("push_config.oidc_token is kept but ignored: the sidecar sends no token to the endpoint",
			"subscription", name, "service_account_email", ps.OIDCServiceAccount)
	}
	return nil
}

// ModifyPushConfig sets a subscription's push_config; an empty one (no
// endpoint) makes it a pull subscription again. It is UpdateSubscription
// of push_config.
func (s *Server) ModifyPushConfig(ctx context.Context, req *pb.ModifyPushConfigRequest) (*emptypb.Empty, error) {
	if req.GetPushConfig() == nil {
		return nil, invalid("push_config is required (an empty one makes %s a pull subscription)", req.GetSubscription())
	}
	_, err := s.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: req.GetSubscription(), PushConfig: req.GetPushConfig()},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"push_config"}},
	})
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// pushRunner runs the pushers of this sidecar.
type pushRunner struct {
	s      *Server
	allow  *push.AllowList
	client *push.Client
	max    int
	js     jetstream.JetStream
	index  grpcutil.LazyBucket

	ctx    context.Context // ends at Close: requests in flight are abandoned
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	watchers map[string]*pushWatcher // by subscription name
}

func newPushRunner(s *Server, js jetstream.JetStream, allow *push.AllowList, maxOutstanding int) (*pushRunner, error) {
	client, err := push.NewClient(allow)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &pushRunner{
		s: s, allow: allow, client: client, max: maxOutstanding, js: js, ctx: ctx, cancel: cancel,
		index: grpcutil.LazyBucket{Config: jetstream.KeyValueConfig{
			Bucket:      pushBucket,
			Description: "jetorder: subscriptions that push, one entry each (the subscription's record has the push config)",
			Storage:     jetstream.FileStorage,
			Replicas:    max(s.cfg.Replicas, 1),
		}},
		watchers: make(map[string]*pushWatcher),
	}, nil
}

// start watches JO_PUSH until Close.
func (r *pushRunner) start() {
	r.wg.Go(r.watchIndex)
}

// close abandons requests in flight (their messages go back) and waits
// for the watchers to end.
func (r *pushRunner) close() {
	r.cancel()
	r.wg.Wait()
	_ = r.client.Close()
}

func pushIndexKey(project, id string) string { return keyrouter.KVKey(project, id) }

// indexPush records that subscription name pushes, before its record says
// so: a watcher that finds the entry reads the record.
func (s *Server) indexPush(ctx context.Context, name string) error {
	if s.pusher == nil {
		return nil
	}
	project, id, err := parseSubscription(name)
	if err != nil {
		return err
	}
	kv, err := s.pusher.index.Open(ctx, s.pusher.js)
	if err != nil {
		return err
	}
	if _, err := kv.PutString(ctx, pushIndexKey(project, id), name); err != nil {
		return toStatus(err)
	}
	return nil
}

// unindexPush removes the entry of a deleted subscription. rev, when not
// 0, is the entry's revision the caller saw: an entry written since then
// (the subscription was created anew) stays.
func (s *Server) unindexPush(ctx context.Context, name string, rev uint64) {
	if s.pusher == nil {
		return
	}
	project, id, err := parseSubscription(name)
	if err != nil {
		return
	}
	kv, err := s.pusher.index.Open(ctx, s.pusher.js)
	if err != nil {
		return
	}
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	if err := kv.Delete(ctx, pushIndexKey(project, id), opts...); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Debug("push index entry kept", "subscription", name, "err", err)
	}
}

// watchIndex keeps a watcher for every entry of JO_PUSH.
func (r *pushRunner) watchIndex() {
	defer r.stopWatchersExcept(nil)
	for r.ctx.Err() == nil {
		kv, err := r.index.Open(r.ctx, r.js)
		if err == nil {
			var w jetstream.KeyWatcher
			if w, err = kv.WatchAll(r.ctx); err == nil {
				r.follow(w)
				_ = w.Stop()
			}
		}
		if r.ctx.Err() == nil {
			if err != nil {
				r.s.log.Warn("push subscriptions: cannot watch "+pushBucket+"; retrying", "err", err)
			}
			sleepCtx(r.ctx, pushIdlePoll)
		}
	}
}

// follow applies the watch's entries until it ends. A watch begins with
// the entries present then: watchers of entries deleted while no watch
// ran (it is begun anew after an error) stop there.
func (r *pushRunner) follow(w jetstream.KeyWatcher) {
	present := map[string]bool{} // until the end of the entries present
	names := map[string]string{} // key -> subscription name: a delete marker has no value
	for {
		select {
		case <-r.ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if present != nil {
					r.stopWatchersExcept(present)
					present = nil
				}
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				if name, ok := names[e.Key()]; ok {
					delete(names, e.Key())
					r.stopWatcher(name)
				}
				continue
			}
			name := string(e.Value())
			if _, _, err := parseSubscription(name); err != nil {
				continue // not written by a sidecar
			}
			names[e.Key()] = name
			if present != nil {
				present[name] = true
			}
			r.startWatcher(name, e.Revision(), e.Created())
		}
	}
}

func (r *pushRunner) startWatcher(name string, rev uint64, created time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.watchers[name]; w != nil {
		w.setEntry(rev, created)
		return
	}
	w := &pushWatcher{r: r, name: name, stop: make(chan struct{}), poked: make(chan struct{}, 1)}
	w.setEntry(rev, created)
	r.watchers[name] = w
	r.wg.Go(func() {
		w.run()
		r.mu.Lock()
		if r.watchers[name] == w {
			delete(r.watchers, name)
		}
		r.mu.Unlock()
	})
}

// poke has the watcher of subscription name read its record now: this
// sidecar has just changed it.
func (r *pushRunner) poke(name string) {
	r.mu.Lock()
	w := r.watchers[name]
	r.mu.Unlock()
	if w != nil {
		select {
		case w.poked <- struct{}{}:
		default:
		}
	}
}

// stopWatcher ends the watcher of a subscription whose entry is gone.
func (r *pushRunner) stopWatcher(name string) {
	r.mu.Lock()
	w := r.watchers[name]
	delete(r.watchers, name)
	r.mu.Unlock()
	if w != nil {
		close(w.stop)
	}
}

// stopWatchersExcept ends the watchers of subscriptions not in keep (all
// of them for nil).
func (r *pushRunner) stopWatchersExcept(keep map[string]bool) {
	r.mu.Lock()
	var gone []*pushWatcher
	for name, w := range r.watchers {
		if !keep[name] {
			gone = append(gone, w)
			delete(r.watchers, name)
		}
	}
	r.mu.Unlock()
	for _, w := range gone {
		close(w.stop)
	}
}

// pushWatcher pushes one subscription's messages while its record has a
// push endpoint.
type pushWatcher struct {
	r     *pushRunner
	name  string
	stop  chan struct{} // closed when its entry is gone, or at Close
	poked chan struct{} // the record was changed through this sidecar

	mu      sync.Mutex
	rev     uint64    // of its JO_PUSH entry
	created time.Time // of that revision

	failing atomic.Bool // the last request failed: logged once until one succeeds
}

func (w *pushWatcher) setEntry(rev uint64, created time.Time) {
	w.mu.Lock()
	w.rev, w.created = rev, created
	w.mu.Unlock()
}

func (w *pushWatcher) entry() (uint64, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev, w.created
}

func (w *pushWatcher) stopped() bool {
	select {
	case <-w.stop:
		return true
	case <-w.r.ctx.Done():
		return true
	default:
		return false
	}
}

// wait waits for d or a poke, or until the watcher stops; it reports
// false then.
func (w *pushWatcher) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.poked:
		return true
	case <-w.stop:
	case <-w.r.ctx.Done():
	}
	return false
}

func (w *pushWatcher) run() {
	s := w.r.s
	project, id, _ := parseSubscription(w.name) // checked by follow
	for !w.stopped() {
		sub, err := s.subscriptionOf(w.name)
		if err != nil {
			return
		}
		cfg, err := sub.Config(w.r.ctx)
		switch {
		case errors.Is(err, adapter.ErrSubscriptionNotFound):
			// Being created (the entry comes first), or deleted without
			// its entry (by the library, or a sidecar that stopped in
			// between): then the entry goes, unless written anew.
			poll := 100 * time.Millisecond
			if rev, created := w.entry(); time.Since(created) > pushIndexGrace {
				s.unindexPush(w.r.ctx, w.name, rev)
				poll = pushIdlePoll
			}
			if !w.wait(poll) {
				return
			}
			continue
		case err != nil || cfg.Detached || newPushTarget(&cfg) == nil:
			if !w.wait(pushIdlePoll) {
				return
			}
			continue
		}
		d, err := s.attach(w.r.ctx, project, id)
		if err != nil {
			if err == errShuttingDown {
				return
			}
			if !w.wait(pushIdlePoll) {
				return
			}
			continue
		}
		// A dispatcher already running (for pull clients) may not have
		// read the change yet.
		d.reload(w.r.ctx, sub)
		t := d.push.Load()
		if t == nil {
			d.detach()
			if !w.wait(pushIdlePoll) {
				return
			}
			continue
		}
		s.log.Info("pushing", "subscription", w.name, "endpoint", t.settings.Endpoint)
		ended := w.push(d)
		d.detach()
		s.log.Info("stopped pushing", "subscription", w.name, "why", ended)
		if ended == "receive ended" && !w.wait(time.Second) {
			return
		}
	}
}

// push takes d's messages and pushes each in a goroutine of its own until
// the subscription no longer pushes, d stops handing out, or the watcher
// stops; then it waits for the requests in flight. The goroutines are
// bounded by the adapter's MaxOutstandingMessages: a message is in d.ready
// only while its handler waits.
func (w *pushWatcher) push(d *dispatcher) string {
	budget := pushBudget{keyed: make(chan struct{}, w.r.max), unkeyed: make(chan struct{}, w.r.max)}
	var wg sync.WaitGroup
	defer wg.Wait()
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		select {
		case l := <-d.ready:
			if d.push.Load() == nil {
				d.refuse(l)
				return "push_config removed"
			}
			if w.stopped() {
				d.refuse(l)
				return "stopped"
			}
			wg.Go(func() { w.deliver(d, l, budget) })
		case <-check.C:
			if d.push.Load() == nil {
				return "push_config removed"
			}
		case <-d.draining:
			return "shutting down"
		case <-d.done:
			return "receive ended"
		case <-w.stop:
			return "subscription gone"
		case <-w.r.ctx.Done():
			return "shutting down"
		}
	}
}

// pushBudget bounds the requests in flight of one subscription: keyed
// and unkeyed messages have a budget each.
type pushBudget struct{ keyed, unkeyed chan struct{} }

// deliver pushes one message and settles its lease by the outcome.
func (w *pushWatcher) deliver(d *dispatcher, l *lease, budget pushBudget) {
	ctx := w.r.ctx
	sem := budget.unkeyed
	if l.msg.OrderingKey != "" {
		sem = budget.keyed
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		d.refuse(l)
		return
	}
	t := d.push.Load() // as it is now, after waiting for the budget
	if t == nil {
		<-sem
		d.refuse(l)
		return
	}
	held := true
	release := func() {
		if held {
			<-sem
			held = false
		}
	}
	defer release()

	cfg := d.cfg.Load()
	deadline := cfg.AckDeadline
	rm := d.lease(l, nil, nil, deadline+pushLeaseSlack)
	if rm == nil {
		return // handing out has stopped
	}
	id := l.id
	m := push.Message{
		Data: rm.Message.Data, Attributes: rm.Message.Attributes, ID: rm.Message.MessageId,
		OrderingKey: rm.Message.OrderingKey, PublishTime: l.msg.PublishTime,
		DeliveryAttempt: int(rm.DeliveryAttempt), Topic: subscriptionTopic(*cfg),
	}
	var res push.Result
	req, err := push.NewRequest(ctx, t.settings.Endpoint, t.format, d.name, m)
	if err != nil {
		// A message this format cannot carry: it keeps failing until the
		// format changes or the dead-letter policy takes it.
		res = push.Result{Reason: push.ReasonStatus, Err: err}
	} else {
		res = w.r.client.Deliver(ctx, req, deadline)
	}
	switch {
	case res.Acked:
		if w.failing.Swap(false) {
			w.r.s.log.Info("push endpoint answers again", "subscription", d.name, "endpoint", t.settings.Endpoint)
		}
		if cfg.ExactlyOnce {
			d.ackConfirmed(ctx, id)
		} else {
			d.settle(id, outAck)
		}
		return
	case res.Reason == push.ReasonCanceled:
		d.settle(id, outReturned) // shutting down: not the endpoint's failure
		return
	}
	w.r.s.b.Metrics.PushFailed(d.name)
	if !w.failing.Swap(true) {
		w.r.s.log.Warn("push failed; the message is nacked and retried", "subscription", d.name,
			"endpoint", t.settings.Endpoint, "reason", res.Reason.String(), "err", res.Err)
	} else {
		w.r.s.log.Debug("push failed", "subscription", d.name, "reason", res.Reason.String(), "err", res.Err)
	}
	if cfg.RetryPolicy == nil {
		// Pub/Sub's push backoff: the message, and so its key, waits here.
		// The budget is free meanwhile for other keys.
		pause := push.Backoff(max(l.msg.DeliveryAttempt, 1), push.DefaultMinBackoff, push.DefaultMaxBackoff)
		release()
		if !d.extend(id, pause+pushLeaseSlack) {
			return
		}
		timer := time.NewTimer(pause)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-d.draining: // shutting down: nack now, the pause is lost
		case <-ctx.Done():
		}
	}
	d.settle(id, outNack)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
