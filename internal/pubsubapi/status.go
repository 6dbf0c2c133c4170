package pubsubapi

import (
	"cmp"
	"context"
	"errors"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/jetorder/jetorder/adapter"
	jstatus "github.com/jetorder/jetorder/internal/status"
	"github.com/jetorder/jetorder/keyrouter"
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
	// maxOldestLookups bounds the messages read per subscription to find
	// its oldest unacked message.
	maxOldestLookups = 8
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
			subs[name] = r.status(name, now)
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
	subs    map[string]*subRead
}

// subRead is what one read found of a subscription.
type subRead struct {
	cfg        *adapter.SubscriptionConfig // nil: not known
	backlog    uint64                      // of its consumers of unkeyed messages
	keyed      uint64                      // the backlog of its consumers of keyed messages
	unacked    uint64
	consumers  int
	oldest     time.Time // stored time of the oldest unacked message; zero: none
	partitions []jstatus.Partition
}

func (r *subRead) status(name string, now time.Time) *jstatus.Subscription {
	sub := &jstatus.Subscription{Name: name, Backlog: r.backlog, Unacked: r.unacked, Consumers: r.consumers, JetStreamRead: true, Paused: []jstatus.PausedKey{}}
	describe(sub, r.cfg)
	if !r.oldest.IsZero() {
		t := r.oldest.UTC()
		sub.OldestUnacked = &t
		sub.OldestUnackedAgeSeconds = max(now.Sub(r.oldest).Seconds(), 0)
	}
	if len(r.partitions) > 0 {
		sub.Partitions = slices.Clone(r.partitions) // Status marks its own
	}
	return sub
}

// observer reads JetStream for Status, in its own goroutine, while Status
// is being called.
type observer struct {
	s      *Server
	js     jetstream.JetStream // nil without a connection: nothing is read
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
	streams map[string]jetstream.Stream            // handles, by stream name
	subsKV  jetstream.KeyValue                     // the subscription registry, for discovery floors
	floors  map[string]string                      // subscription name -> key of its discovery floor, as last found
}

func newObserver(s *Server) *observer {
	o := &observer{s: s, next: make(chan struct{}), configs: map[string]*adapter.SubscriptionConfig{},
		streams: map[string]jetstream.Stream{}, floors: map[string]string{}}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	if nc := s.b.Conn(); nc != nil {
		o.js, _ = jetstream.New(nc)
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

// read reads the account, its topics, and its subscriptions' consumers.
func (o *observer) read(ctx context.Context) *jsRead {
	r := &jsRead{start: time.Now(), topics: []jstatus.Topic{}, subs: make(map[string]*subRead)}
	defer func() { r.took = time.Since(r.start) }()
	if err := o.s.b.Conn().FlushWithContext(ctx); err == nil { // a round trip, as nc.RTT, but within ctx
		r.rtt = time.Since(r.start)
	}
	if r.account, r.err = o.js.AccountInfo(ctx); r.err != nil {
		return r
	}

	// Topics: the streams that jetorder's metadata names. Their projects,
	// and those of the subscriptions received here, are where the
	// subscriptions are listed (others, of topics of other projects, are
	// found by their consumers).
	projects := make(map[string]bool)
	dispatchers := o.s.dispatcherList()
	for _, d := range dispatchers {
		if p, _, err := parseSubscription(d.name); err == nil {
			projects[p] = true
		}
	}
	var withConsumers []string
	streams := make(map[string]string) // stream name -> topic name
	lastSeq := make(map[string]uint64) // stream name -> its last sequence
	list := o.js.ListStreams(ctx)
	for info := range list.Info() {
		p, t := info.Config.Metadata["jetorder.project"], info.Config.Metadata["jetorder.topic"]
		if p == "" || t == "" {
			continue
		}
		topic := jstatus.Topic{Name: "projects/" + p + "/topics/" + t, Messages: info.State.Msgs, Bytes: info.State.Bytes, Consumers: info.State.Consumers}
		if !info.State.LastTime.IsZero() && info.State.Msgs > 0 {
			last := info.State.LastTime.UTC()
			topic.LastStored = &last
		}
		r.topics = append(r.topics, topic)
		projects[p] = true
		streams[info.Config.Name] = topic.Name
		lastSeq[info.Config.Name] = info.State.LastSeq
		if info.State.Consumers > 0 {
			withConsumers = append(withConsumers, info.Config.Name)
		}
	}
	if err := list.Err(); err != nil {
		r.err = err
		return r
	}
	slices.SortFunc(r.topics, func(a, b jstatus.Topic) int { return strings.Compare(a.Name, b.Name) })
	for name := range o.streams {
		if _, ok := streams[name]; !ok {
			delete(o.streams, name)
		}
	}

	// Subscriptions: listed every listInterval; between lists, those found
	// by their consumers are added.
	if time.Since(o.listed) >= listInterval {
		if err := o.list(ctx, projects); err != nil {
			r.err = err
			return r
		}
	}
	for name, cfg := range o.configs {
		r.subs[name] = &subRead{cfg: cfg}
	}
	for _, d := range dispatchers {
		if sr := r.subs[d.name]; sr != nil {
			sr.cfg = d.cfg.Load() // the freshest
		}
	}

	// Consumers: backlogs and partitions.
	pending := make(map[string][]*jetstream.ConsumerInfo) // subscription -> consumers with unacked messages
	subStream := make(map[string]jetstream.Stream)
	gone := make(map[string]bool) // subscriptions of consumers left behind by a delete
	for _, name := range withConsumers {
		stream, err := o.stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			r.err = err
			return r
		}
		consumers := stream.ListConsumers(ctx)
		for info := range consumers.Info() {
			sub, partition, ok := consumerOf(info.Config.Description)
			if !ok {
				continue
			}
			sr := r.subs[sub]
			if sr == nil {
				if gone[sub] {
					continue
				}
				cfg := o.config(ctx, sub)
				if cfg == nil {
					gone[sub] = true
					continue
				}
				sr = &subRead{cfg: cfg}
				r.subs[sub] = sr
			}
			sr.consumers++
			if strings.HasPrefix(info.Config.FilterSubject, keyedPrefix(sr.cfg)) {
				sr.keyed += info.NumPending + uint64(info.NumAckPending)
			} else {
				sr.backlog += info.NumPending + uint64(info.NumAckPending)
			}
			sr.unacked += uint64(info.NumAckPending)
			if info.NumPending > 0 || info.NumAckPending > 0 {
				pending[sub] = append(pending[sub], info)
				subStream[sub] = stream
			}
			if partition >= 0 {
				sr.partitions = addPartition(sr.partitions, partition, info)
			}
		}
		if err := consumers.Err(); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			r.err = err
			return r
		}
	}
	for sub, infos := range pending {
		oldest, err := oldestUnacked(ctx, subStream[sub], infos)
		if err != nil {
			r.err = err
			return r
		}
		r.subs[sub].oldest = oldest
	}
	// Per-key delivery: keyed messages after the discovery floor may have
	// no consumer yet (nobody receives, so nobody discovers).
	for name, sr := range r.subs {
		if !perKey(sr.cfg) {
			sr.backlog += sr.keyed
			continue
		}
		n, first, err := o.undiscovered(ctx, name, sr.cfg, lastSeq)
		if err != nil {
			r.err = err
			return r
		}
		sr.backlog += max(sr.keyed, n)
		if first != nil && (sr.oldest.IsZero() || first.Time.Before(sr.oldest)) {
			sr.oldest = first.Time
		}
	}

	// Metrics of what is gone go (after two reads without it).
	topics := make(map[string]bool, len(r.topics))
	for _, t := range r.topics {
		topics[t.Name] = true
	}
	receiving := make(map[string]bool, len(dispatchers))
	for _, d := range o.s.dispatcherList() {
		receiving[d.name] = true
	}
	o.s.b.Metrics.Retain(func(name string) bool { return r.subs[name] != nil || receiving[name] },
		func(name string) bool { return topics[name] })
	o.s.recent.prune(time.Now())
	return r
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

// config reads the configuration of subscription name, found by its
// consumers since the last list; nil when it cannot (deleted, and its
// consumers not yet).
func (o *observer) config(ctx context.Context, name string) *adapter.SubscriptionConfig {
	if d := o.s.dispatcherOf(name); d != nil {
		return d.cfg.Load()
	}
	project, id, err := parseSubscription(name)
	if err != nil {
		return nil
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

func (o *observer) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s := o.streams[name]; s != nil {
		return s, nil
	}
	s, err := o.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	o.streams[name] = s
	return s, nil
}

// keyedPrefix is what the filters of a subscription's consumers of keyed
// messages begin with (docs/WIRE.md); "\x00" (nothing) when the
// configuration is not known.
func keyedPrefix(cfg *adapter.SubscriptionConfig) string {
	if cfg == nil || cfg.Topic == nil {
		return "\x00"
	}
	project, topic, err := parseTopic(cfg.Topic.String())
	if err != nil {
		return "\x00"
	}
	return strings.TrimSuffix(keyrouter.KeyedFilter(project, topic), ">")
}

func perKey(cfg *adapter.SubscriptionConfig) bool {
	return cfg != nil && cfg.EnableMessageOrdering && cfg.Delivery == adapter.DeliveryPerKey && !cfg.TopicDeleted && !cfg.Detached
}

// undiscovered counts the keyed messages of a per-key subscription after
// its discovery floor, and returns the first of them. Every keyed message
// at or below the floor has a consumer; those after it may not, until a
// receiver's discovery creates one (docs/WIRE.md). Some may have one: the
// caller takes the larger of this count and its key consumers' backlog,
// which is exact when the messages after the floor are all covered or all
// not, and low by the covered ones otherwise. The count is the pending
// count of a consumer made for it, and deleted at once.
func (o *observer) undiscovered(ctx context.Context, name string, cfg *adapter.SubscriptionConfig, lastSeq map[string]uint64) (uint64, *jetstream.RawStreamMsg, error) {
	project, id, err := parseSubscription(name)
	if err != nil {
		return 0, nil, nil
	}
	floor, ok, err := o.floor(ctx, name, keyrouter.KVKey(project, id))
	if err != nil || !ok {
		return 0, nil, err
	}
	tp, topic, err := parseTopic(cfg.Topic.String())
	if err != nil {
		return 0, nil, nil
	}
	streamName := keyrouter.StreamName(tp, topic)
	if floor >= lastSeq[streamName] {
		return 0, nil, nil // nothing stored after it (or no stream)
	}
	stream, err := o.stream(ctx, streamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	filter := keyrouter.KeyedFilter(tp, topic)
	c, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description: "jetorder status: messages after a discovery floor", FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: floor + 1, AckPolicy: jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return 0, nil, err
	}
	info := c.CachedInfo()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = stream.DeleteConsumer(dctx, info.Name) // else its inactivity removes it
	cancel()
	if info.NumPending == 0 {
		return 0, nil, nil
	}
	first, err := stream.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return info.NumPending, nil, nil
	}
	return info.NumPending, first, err
}

// floor reads a per-key subscription's discovery floor: the key kvKey.floor
// of the registry, or kvKey.floor.e<epoch> after a seek (the highest epoch
// wins). ok is false when there is none.
func (o *observer) floor(ctx context.Context, name, kvKey string) (floor uint64, ok bool, err error) {
	if o.subsKV == nil {
		kv, err := o.js.KeyValue(ctx, registryBucket)
		if err != nil {
			return 0, false, err
		}
		o.subsKV = kv
	}
	key := cmp.Or(o.floors[name], kvKey+".floor")
	e, err := o.subsKV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Sought since: find the epoch's floor.
		keys, lerr := o.subsKV.ListKeysFiltered(ctx, kvKey+".floor", kvKey+".floor.>")
		if lerr != nil {
			return 0, false, lerr
		}
		best, bestEpoch := "", int64(-1)
		for k := range keys.Keys() {
			epoch := int64(0)
			if rest, ok := strings.CutPrefix(k, kvKey+".floor.e"); ok {
				if epoch, err = strconv.ParseInt(rest, 10, 64); err != nil {
					continue
				}
			}
			if epoch > bestEpoch {
				best, bestEpoch = k, epoch
			}
		}
		if best == "" {
			delete(o.floors, name)
			return 0, false, nil
		}
		o.floors[name] = best
		e, err = o.subsKV.Get(ctx, best)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	floor, err = strconv.ParseUint(string(e.Value()), 10, 64)
	return floor, err == nil, nil
}

// registryBucket is the KV bucket of the subscription registry and the
// discovery floors (docs/WIRE.md).
const registryBucket = "JO_SUBSCRIPTIONS"

// consumerOf reads a jetorder consumer's description (docs/WIRE.md):
// "jetorder projects/P/subscriptions/S", followed by " partition N of M"
// for a partition consumer. partition is -1 for other consumers.
func consumerOf(desc string) (sub string, partition int, ok bool) {
	rest, ok := strings.CutPrefix(desc, "jetorder ")
	if !ok {
		return "", 0, false
	}
	sub, rest, _ = strings.Cut(rest, " ")
	if _, _, err := parseSubscription(sub); err != nil {
		return "", 0, false
	}
	partition = -1
	if p, ok := strings.CutPrefix(rest, "partition "); ok {
		n, _, _ := strings.Cut(p, " ")
		if i, err := strconv.Atoi(n); err == nil && i >= 0 && i < 64 {
			partition = i
		}
	}
	return sub, partition, true
}

// addPartition records partition i's consumer. A seek leaves the earlier
// epoch's consumers paused for a while: the one that is not paused wins.
func addPartition(ps []jstatus.Partition, i int, info *jetstream.ConsumerInfo) []jstatus.Partition {
	for len(ps) <= i {
		ps = append(ps, jstatus.Partition{Index: len(ps)})
	}
	if ps[i].Pending+ps[i].Unacked > 0 || ps[i].PinID != "" {
		if info.Paused {
			return ps
		}
	}
	p := jstatus.Partition{Index: i, Pending: info.NumPending, Unacked: uint64(info.NumAckPending)}
	for _, g := range info.PriorityGroups {
		if g.PinnedClientID != "" {
			p.Owner, p.PinID = "other", g.PinnedClientID
			if !g.PinnedTS.IsZero() {
				t := g.PinnedTS.UTC()
				p.PinnedSince = &t
			}
		}
	}
	ps[i] = p
	return ps
}

// oldestUnacked returns when the oldest message not acked by the given
// consumers was stored: for each, the first message of its filter after
// its ack floor. It reads at most maxOldestLookups messages, lowest floors
// first, and stops once no other consumer can hold an older one.
func oldestUnacked(ctx context.Context, stream jetstream.Stream, infos []*jetstream.ConsumerInfo) (time.Time, error) {
	slices.SortFunc(infos, func(a, b *jetstream.ConsumerInfo) int { return cmp.Compare(a.AckFloor.Stream, b.AckFloor.Stream) })
	var best *jetstream.RawStreamMsg
	for i, info := range infos {
		if i == maxOldestLookups || best != nil && info.AckFloor.Stream+1 >= best.Sequence {
			break
		}
		filter := info.Config.FilterSubject
		if filter == "" && len(info.Config.FilterSubjects) > 0 {
			filter = info.Config.FilterSubjects[0]
		}
		var opts []jetstream.GetMsgOpt
		if filter != "" {
			opts = append(opts, jetstream.WithGetMsgSubject(filter))
		}
		m, err := stream.GetMsg(ctx, info.AckFloor.Stream+1, opts...)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // acked or gone meanwhile
		}
		if err != nil {
			return time.Time{}, err
		}
		if best == nil || m.Sequence < best.Sequence {
			best = m
		}
	}
	if best == nil {
		return time.Time{}, nil
	}
	return best.Time, nil
}
