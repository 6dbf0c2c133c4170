package pubsubapi

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/jetorder/jetorder/adapter"
	jstatus "github.com/jetorder/jetorder/internal/status"
)

// The sidecar's status (GET /v1/status, the page at /, and the gauges of
// /metrics) comes from two sources:
//   - what this process holds: dispatchers, streams, partitions, recent
//     redeliveries and dead letters. Read at each Status call, in time
//     proportional to the subscriptions, streams and paused keys, never to
//     every key held, so it stays cheap with 100,000 keys in flight;
//   - what JetStream holds: topics, backlogs, the oldest unacked messages,
//     partitions and their owners. The observer reads it at most once a
//     second, in the background, while Status is being called, and Status
//     returns the last read; a read that takes long spaces the next out.
//     It reads through adapter.Inspector, which knows the storage layout
//     (docs/WIRE.md) and bounds its lookups; the observer supplies the
//     subscriptions' configurations, listed in full every listInterval.

const (
	// observeInterval is the least time between two JetStream reads.
	observeInterval = time.Second
	// observeSpacing spaces reads out: the next starts no sooner than this
	// many times the last one's duration after it.
	observeSpacing = 5
	// observeIdle stops the reads this long after the last Status call.
	observeIdle = 2 * time.Minute
	// observeTimeout bounds one read.
	observeTimeout = 10 * time.Second
	// listInterval is how often the subscriptions are listed in full;
	// between lists, a subscription found by its consumers has its
	// configuration read once.
	listInterval = 10 * time.Second
	// staleRead is how old the last read may be for Status to return it
	// without waiting for the next.
	staleRead = 5 * time.Second
	// metricsWait bounds a scrape's wait for a read.
	metricsWait = 5 * time.Second
)

// Status returns the sidecar's status. While the reads of JetStream run,
// it returns at once with the last one; before the first, or when they had
// stopped (no one asked for observeIdle) and the last began over staleRead
// ago, it waits for the next read, until ctx ends. It is safe for
// concurrent use.
func (s *Server) Status(ctx context.Context) *jstatus.Status {
	if next := s.observer.want(); next != nil {
		select {
		case <-next:
		case <-ctx.Done():
		}
	}
	return s.status(s.observer.current())
}

// StatusForMetrics is Status for the metrics gauges, which take no
// context: it waits at most metricsWait.
func (s *Server) StatusForMetrics() *jstatus.Status {
	ctx, cancel := context.WithTimeout(context.Background(), metricsWait)
	defer cancel()
	return s.Status(ctx)
}

func (s *Server) status(last, good *jsRead) *jstatus.Status {
	now := time.Now()
	st := &jstatus.Status{
		Time: now.UTC(),
		Sidecar: jstatus.Sidecar{
			Started: s.started.UTC(), UptimeSeconds: now.Sub(s.started).Seconds(),
			GoVersion: runtime.Version(), Goroutines: runtime.NumGoroutine(),
		},
		Topics: []jstatus.Topic{}, Subscriptions: []jstatus.Subscription{}, Clients: []jstatus.Client{},
	}
	if nc := s.b.Conn(); nc != nil {
		st.NATS = jstatus.NATS{
			Status: nc.Status().String(), Connected: nc.IsConnected(),
			URL: redactURL(nc.ConnectedUrlRedacted()), ServerName: nc.ConnectedServerName(), ServerVersion: nc.ConnectedServerVersion(),
			Reconnects: nc.Stats().Reconnects, Embedded: s.cfg.EmbeddedNATS,
			Sync: s.cfg.Sync, SyncRisk: s.cfg.SyncRisk,
		}
	} else {
		st.NATS.Status = "none"
	}
	if last != nil {
		st.JetStream.OK = last.err == nil
		if last.err != nil {
			st.JetStream.Error = last.err.Error()
		}
		st.NATS.RTTMillis = float64(last.rtt) / float64(time.Millisecond)
	}
	subs := make(map[string]*jstatus.Subscription)
	if good != nil {
		st.JetStream.AsOf = good.start.UTC()
		st.JetStream.ReadMillis = float64(good.took) / float64(time.Millisecond)
		st.JetStream.Streams = good.account.Streams
		st.JetStream.Consumers = good.account.Consumers
		st.JetStream.StorageBytes = good.account.Store
		st.JetStream.MemoryBytes = good.account.Memory
		st.Topics = good.topics
		for name, r := range good.subs {
			subs[name] = subscriptionStatus(r, now)
		}
	}

	// What this process holds.
	s.mu.Lock()
	st.Streams = s.streams
	s.mu.Unlock()
	for _, d := range s.dispatcherList() {
		sub := subs[d.name]
		if sub == nil {
			sub = &jstatus.Subscription{Name: d.name, Paused: []jstatus.PausedKey{}}
			describe(sub, d.cfg.Load())
			subs[d.name] = sub
		}
		d.local(sub, now)
		if t := d.didcomm.opened(); t != nil {
			gaps := int(t.OpenGaps())
			sub.DIDCommOpenGaps = &gaps
		}
		st.Clients = d.clients(st.Clients, now)
	}
	for name, sub := range subs {
		owned, buffered, full := s.partitions.of(name)
		sub.PartitionsOwned, sub.PartitionBuffered, sub.PartitionsFull = len(owned), buffered, full
		for _, i := range owned {
			if i < len(sub.Partitions) {
				sub.Partitions[i].Owner = "this sidecar"
			}
		}
		sub.RedeliveredRecent, sub.DeadLetteredRecent = s.recent.sums(name, now)
		st.Subscriptions = append(st.Subscriptions, *sub)
	}
	slices.SortFunc(st.Subscriptions, func(a, b jstatus.Subscription) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(st.Clients, func(a, b jstatus.Client) int { return a.Since.Compare(b.Since) })
	if len(st.Clients) > jstatus.MaxClients {
		st.ClientsOmitted = len(st.Clients) - jstatus.MaxClients
		st.Clients = st.Clients[:jstatus.MaxClients]
	}
	return st
}

// describe fills in what a subscription's configuration says.
func describe(sub *jstatus.Subscription, cfg *adapter.SubscriptionConfig) {
	if cfg == nil {
		return
	}
	sub.Topic = subscriptionTopic(*cfg)
	sub.Delivery = "unordered"
	if cfg.EnableMessageOrdering {
		sub.Delivery = string(cmp.Or(cfg.Delivery, adapter.DefaultDelivery))
	}
	sub.Detached = cfg.Detached
	if t := newPushTarget(cfg); t != nil {
		sub.PushEndpoint = withoutQuery(t.settings.Endpoint)
	}
}

// withoutQuery is an endpoint without its query and fragment, which may
// carry a token.
func withoutQuery(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return u.String()
}

// redactURL is nats.go's redacted URL without the user name it keeps.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}

// local fills in what d holds of its subscription.
func (d *dispatcher) local(sub *jstatus.Subscription, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sub.Receiving = true
	sub.Streams = len(d.streams)
	sub.Outstanding = len(d.leases)
	sub.KeysInFlight = len(d.keys)
	for a := len(d.byAttempt) - 1; a >= 0 && sub.MaxDeliveryAttempt == 0; a-- {
		if d.byAttempt[a] > 0 {
			sub.MaxDeliveryAttempt = a
		}
	}
	// Paused keys: the MaxPausedKeys with the most deliveries (then the
	// longest held), each with its most delivered message. One pass over
	// the paused messages, keeping the best few.
	sub.PausedKeys = len(d.pausedKeys)
	top := make([]jstatus.PausedKey, 0, jstatus.MaxPausedKeys)
	worse := func(a, b jstatus.PausedKey) int {
		return cmp.Or(cmp.Compare(b.DeliveryAttempt, a.DeliveryAttempt), cmp.Compare(b.HeldSeconds, a.HeldSeconds), strings.Compare(a.Key, b.Key))
	}
	for l := range d.paused {
		sub.MaxDeliveryAttempt = max(sub.MaxDeliveryAttempt, l.msg.DeliveryAttempt)
		if l.msg.OrderingKey == "" {
			continue
		}
		p := jstatus.PausedKey{Key: l.msg.OrderingKey, MessageID: l.msg.ID, DeliveryAttempt: l.msg.DeliveryAttempt, HeldSeconds: now.Sub(l.heldAt).Seconds()}
		if i := slices.IndexFunc(top, func(q jstatus.PausedKey) bool { return q.Key == p.Key }); i >= 0 {
			if worse(p, top[i]) < 0 {
				top[i] = p
				slices.SortFunc(top, worse)
			}
			continue
		}
		switch {
		case len(top) < cap(top):
			top = append(top, p)
		case worse(p, top[len(top)-1]) < 0:
			top[len(top)-1] = p
		default:
			continue
		}
		slices.SortFunc(top, worse)
	}
	sub.Paused = top
}

// clients appends d's streams to out.
func (d *dispatcher) clients(out []jstatus.Client, now time.Time) []jstatus.Client {
	d.mu.Lock()
	streams := make([]*pullStream, 0, len(d.streams))
	for st := range d.streams {
		streams = append(streams, st)
	}
	d.mu.Unlock()
	for _, st := range streams {
		st.flow.mu.Lock()
		n := st.flow.msgs
		st.flow.mu.Unlock()
		out = append(out, jstatus.Client{Peer: st.peer, UserAgent: st.userAgent, Subscription: d.name, Since: st.since.UTC(), Outstanding: int(n)})
	}
	return out
}

func (d *dispatcher) addStream(st *pullStream) {
	d.mu.Lock()
	d.streams[st] = struct{}{}
	d.mu.Unlock()
}

func (d *dispatcher) removeStream(st *pullStream) {
	d.mu.Lock()
	delete(d.streams, st)
	d.mu.Unlock()
}

// maxUserAgent bounds the user agent kept of a stream.
const maxUserAgent = 200

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func userAgent(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	ua := strings.Join(md.Get("user-agent"), " ")
	if len(ua) > maxUserAgent {
		ua = ua[:maxUserAgent]
	}
	return strings.ToValidUTF8(ua, "")
}

// Recent counts: redeliveries and dead letters per subscription over the
// last jstatus.RecentWindow, in buckets of recentBucket.

const (
	recentBucket  = 10 * time.Second
	recentBuckets = int(jstatus.RecentWindow / recentBucket)
)

type recentKind int

const (
	recentRedelivered recentKind = iota
	recentDeadLettered
)

type recentCounts struct {
	mu   sync.Mutex
	subs map[string]*recentWindow
}

// recentWindow counts per bucket; slot i holds bucket at[i] (a Unix time
// divided by recentBucket).
type recentWindow struct {
	at     [recentBuckets]int64
	counts [recentBuckets][2]int
	last   int64
}

func (r *recentCounts) add(sub string, k recentKind) {
	b := time.Now().UnixNano() / int64(recentBucket)
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.subs[sub]
	if w == nil {
		if r.subs == nil {
			r.subs = make(map[string]*recentWindow)
		}
		w = &recentWindow{}
		r.subs[sub] = w
	}
	i := int(b % int64(recentBuckets))
	if w.at[i] != b {
		w.at[i], w.counts[i] = b, [2]int{}
	}
	w.counts[i][k]++
	w.last = b
}

// sums returns sub's redeliveries and dead letters in the window; it
// forgets subscriptions with nothing in it.
func (r *recentCounts) sums(sub string, now time.Time) (redelivered, deadLettered int) {
	b := now.UnixNano() / int64(recentBucket)
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.subs[sub]
	if w == nil {
		return 0, 0
	}
	if b-w.last >= int64(recentBuckets) {
		delete(r.subs, sub)
		return 0, 0
	}
	for i := range w.at {
		if b-w.at[i] < int64(recentBuckets) {
			redelivered += w.counts[i][recentRedelivered]
			deadLettered += w.counts[i][recentDeadLettered]
		}
	}
	return redelivered, deadLettered
}

// prune drops the windows with nothing left in them.
func (r *recentCounts) prune(now time.Time) {
	b := now.UnixNano() / int64(recentBucket)
	r.mu.Lock()
	defer r.mu.Unlock()
	for sub, w := range r.subs {
		if b-w.last >= int64(recentBuckets) {
			delete(r.subs, sub)
		}
	}
}

// The observer: JetStream reads.

// jsRead is one read of JetStream.
type jsRead struct {
	start   time.Time
	took    time.Duration
	err     error
	rtt     time.Duration
	account *jetstream.AccountInfo
	topics  []jstatus.Topic
	subs    map[string]*adapter.SubscriptionState // by subscription name
}

// subscriptionStatus is what a read found of a subscription, as the status
// shows it.
func subscriptionStatus(r *adapter.SubscriptionState, now time.Time) *jstatus.Subscription {
	sub := &jstatus.Subscription{Name: r.Name, Backlog: r.Backlog, Unacked: r.Unacked, Consumers: r.Consumers, JetStreamRead: true, Paused: []jstatus.PausedKey{}}
	describe(sub, r.Config)
	if !r.OldestUnacked.IsZero() {
		t := r.OldestUnacked.UTC()
		sub.OldestUnacked = &t
		sub.OldestUnackedAgeSeconds = max(now.Sub(r.OldestUnacked).Seconds(), 0)
	}
	for _, p := range r.Partitions { // a new slice: Status marks its own
		sp := jstatus.Partition{Index: p.Index, Pending: p.Pending, Unacked: p.Unacked, Holder: p.Holder}
		if p.PinID != "" {
			sp.Owner, sp.PinID = "other", p.PinID
			if !p.PinnedSince.IsZero() {
				t := p.PinnedSince.UTC()
				sp.PinnedSince = &t
			}
		}
		sub.Partitions = append(sub.Partitions, sp)
	}
	return sub
}

// observer reads JetStream for Status, in its own goroutine, while Status
// is being called.
type observer struct {
	s      *Server
	js     jetstream.JetStream // nil without a connection: nothing is read
	in     *adapter.Inspector  // what jetorder keeps in JetStream; with js
	ctx    context.Context     // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	last    *jsRead // the last read; nil before the first
	good    *jsRead // the last read that succeeded
	asked   time.Time
	running bool
	closed  bool
	next    chan struct{} // closed when the read under way (or the next) ends

	// The reading goroutine's own.
	configs map[string]*adapter.SubscriptionConfig // subscription name -> configuration
	listed  time.Time                              // configs listed in full
}

func newObserver(s *Server) *observer {
	o := &observer{s: s, next: make(chan struct{}), configs: map[string]*adapter.SubscriptionConfig{}}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	if nc := s.b.Conn(); nc != nil {
		o.js, _ = jetstream.New(nc)
		if o.in, _ = adapter.NewInspector(nc); o.in == nil {
			o.js = nil
		}
	}
	return o
}

// want notes a Status call, starting the reads if they are not running.
// When there is no read yet, or the reads had stopped and the last is
// stale, it returns a channel closed when the next read ends; otherwise
// nil, as when there will be no read. A read under way that takes long
// (JetStream does not answer) is not waited for: the status says how old
// its figures are.
func (o *observer) want() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.asked = time.Now()
	if o.js == nil || o.closed {
		return nil
	}
	wasRunning := o.running
	if !o.running {
		o.running = true
		o.wg.Go(o.run)
	}
	if o.last != nil && (wasRunning || time.Since(o.last.start) < staleRead) {
		return nil
	}
	return o.next
}

func (o *observer) current() (last, good *jsRead) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last, o.good
}

// close stops the reads and waits for them.
func (o *observer) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}

func (o *observer) run() {
	for {
		ctx, cancel := context.WithTimeout(o.ctx, observeTimeout)
		r := o.read(ctx)
		cancel()
		if r.err == nil {
			o.s.forgetGone(r)
		}
		o.mu.Lock()
		o.last = r
		if r.err == nil {
			o.good = r
		}
		close(o.next)
		o.next = make(chan struct{})
		if o.closed || time.Since(o.asked) > observeIdle {
			o.running = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		t := time.NewTimer(max(observeInterval, observeSpacing*r.took))
		select {
		case <-o.ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// read reads the account, its topics, and its subscriptions' consumers,
// in that order; the first step that fails ends it, with r.err set.
func (o *observer) read(ctx context.Context) *jsRead {
	r := &jsRead{start: time.Now(), topics: []jstatus.Topic{}, subs: map[string]*adapter.SubscriptionState{}}
	defer func() { r.took = time.Since(r.start) }()
	if err := o.s.b.Conn().FlushWithContext(ctx); err == nil { // a round trip, as nc.RTT, but within ctx
		r.rtt = time.Since(r.start)
	}
	if r.account, r.err = o.js.AccountInfo(ctx); r.err != nil {
		return r
	}
	topics, err := o.in.Topics(ctx)
	if err != nil {
		r.err = err
		return r
	}
	r.topics = topicStatuses(topics)
	if time.Since(o.listed) >= listInterval {
		if err := o.list(ctx, o.projects(topics)); err != nil {
			r.err = err
			return r
		}
	}
	r.subs, r.err = o.in.Subscriptions(ctx, topics, o.known(), o.config)
	return r
}

// topicStatuses is the topics as the status shows them.
func topicStatuses(topics []adapter.TopicState) []jstatus.Topic {
	out := make([]jstatus.Topic, 0, len(topics))
	for _, t := range topics {
		topic := jstatus.Topic{Name: t.Name, Messages: t.Messages, Bytes: t.Bytes, Consumers: t.Consumers}
		if !t.LastStored.IsZero() {
			last := t.LastStored.UTC()
			topic.LastStored = &last
		}
		out = append(out, topic)
	}
	return out
}

// projects are where the subscriptions are listed: those of the topics,
// and of the subscriptions received here. (Others, of topics of other
// projects, are found by their consumers.)
func (o *observer) projects(topics []adapter.TopicState) map[string]bool {
	projects := make(map[string]bool)
	for _, d := range o.s.dispatcherList() {
		if p, _, err := parseSubscription(d.name); err == nil {
			projects[p] = true
		}
	}
	for _, t := range topics {
		projects[t.Project] = true
	}
	return projects
}

// known is the subscriptions the read reports whatever their consumers:
// those last listed, with the configuration of the ones received here as
// their dispatchers hold it (the freshest).
func (o *observer) known() map[string]*adapter.SubscriptionConfig {
	known := maps.Clone(o.configs)
	for _, d := range o.s.dispatcherList() {
		if _, ok := known[d.name]; ok {
			known[d.name] = d.cfg.Load()
		}
	}
	return known
}

// list reads the configurations of every subscription of projects.
func (o *observer) list(ctx context.Context, projects map[string]bool) error {
	configs := make(map[string]*adapter.SubscriptionConfig)
	for p := range projects {
		c, err := o.s.b.Client(p)
		if err != nil {
			continue // more projects than the broker keeps clients of
		}
		subs, err := c.Subscriptions(ctx)
		if err != nil {
			return err
		}
		for _, sub := range subs {
			cfg, err := sub.Config(ctx)
			if errors.Is(err, adapter.ErrSubscriptionNotFound) {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			configs[sub.String()] = &cfg
		}
	}
	o.configs, o.listed = configs, time.Now()
	return nil
}

// config reads the configuration of a subscription found by its consumers
// since the last list; nil when it cannot (deleted, and its consumers not
// yet).
func (o *observer) config(ctx context.Context, project, id string) *adapter.SubscriptionConfig {
	name := subscriptionName(project, id)
	if d := o.s.dispatcherOf(name); d != nil {
		return d.cfg.Load()
	}
	c, err := o.s.b.Client(project)
	if err != nil {
		return nil
	}
	cfg, err := c.Subscription(id).Config(ctx)
	if err != nil {
		return nil
	}
	o.configs[name] = &cfg
	return &cfg
}

// forgetGone drops what the sidecar keeps of subscriptions and topics that
// are gone, after read r succeeded: their metrics series (once two reads
// in a row lack them) and recent counts with nothing left in the window.
func (s *Server) forgetGone(r *jsRead) {
	topics := make(map[string]bool, len(r.topics))
	for _, t := range r.topics {
		topics[t.Name] = true
	}
	receiving := make(map[string]bool)
	for _, d := range s.dispatcherList() {
		receiving[d.name] = true
	}
	s.b.Metrics.Retain(func(name string) bool { return r.subs[name] != nil || receiving[name] },
		func(name string) bool { return topics[name] })
	s.recent.prune(time.Now())
}
