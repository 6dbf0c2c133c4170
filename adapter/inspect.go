package adapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// Inspection: what jetorder keeps in JetStream (docs/WIRE.md), read for
// monitoring by a reader that knows nothing of that layout (the sidecar's
// status page and metrics, or an application's own). This package writes
// the layout, so it is the one that reads it back: stream metadata,
// consumer descriptions, keyed subjects and discovery floors.

// MaxOldestLookups bounds the messages Inspector.Subscriptions reads per
// subscription to find its oldest unacked message.
const MaxOldestLookups = 8

// Inspector reads, for the connection's whole account, the topics jetorder
// keeps and, per subscription, what its consumers hold: backlog, unacked
// messages, partitions and their owners, the discovery floor of per-key
// delivery, and the oldest unacked message. It writes nothing but a
// short-lived consumer (see Subscriptions).
//
// It keeps stream handles, the registry bucket's handle and where each
// subscription's discovery floor was last found between calls, so that a
// reader polling it (once a second, say) repeats no lookup it needs only
// once. It is safe for concurrent use.
type Inspector struct {
	js jetstream.JetStream

	mu       sync.Mutex
	streams  map[string]jetstream.Stream // handles, by stream name
	registry jetstream.KeyValue          // the subscription registry; nil until needed
	state    jetstream.KeyValue          // the state bucket (owner and member records); nil until needed
	floors   map[string]string           // subscription name -> key of its discovery floor, as last found
}

// NewInspector returns an inspector over nc. It does no I/O. Its calls
// block until they have read what they return; they take the deadline of
// their ctx (without one, JetStream's default of 5s bounds each request),
// and cancelling ctx ends them with an error.
func NewInspector(nc *nats.Conn) (*Inspector, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil *nats.Conn", ErrInvalidConfig)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Inspector{js: js, streams: map[string]jetstream.Stream{}, floors: map[string]string{}}, nil
}

// TopicState is a topic's stream, as Inspector.Topics read it.
type TopicState struct {
	Name    string // projects/P/topics/T
	Project string
	ID      string
	// Messages and Bytes are what the stream holds (with its key streams,
	// TopicConfig.KeyStreams); Consumers counts their consumers, of every
	// subscription.
	Messages  uint64
	Bytes     uint64
	Consumers int
	// LastStored is when the newest message was stored; zero when the
	// stream holds none.
	LastStored time.Time
	// LastSequence is the stream sequence of the newest message stored.
	LastSequence uint64

	stream     string
	keyStreams []string // the names of its key streams, none when it has none
	keyLastSeq []uint64 // the key streams' LastSequence, as keyStreams
}

// Topics lists every topic of the account, sorted by name, with one
// listing of its streams. It forgets the handles of streams that are gone.
// Errors are JetStream's, as they are.
func (in *Inspector) Topics(ctx context.Context) ([]TopicState, error) {
	out := []TopicState{}
	seen := make(map[string]bool)
	keyStreamInfos := make(map[string]*jetstream.StreamInfo)
	list := in.js.ListStreams(ctx)
	for info := range list.Info() {
		if info.Config.Metadata[metaKeyStream] != "" {
			keyStreamInfos[info.Config.Name] = info
			seen[info.Config.Name] = true
			continue
		}
		p, t := info.Config.Metadata[metaProject], info.Config.Metadata[metaTopic]
		if p == "" || t == "" {
			continue // not a topic
		}
		ts := TopicState{
			Name: "projects/" + p + "/topics/" + t, Project: p, ID: t,
			Messages: info.State.Msgs, Bytes: info.State.Bytes, Consumers: info.State.Consumers,
			LastSequence: info.State.LastSeq, stream: info.Config.Name,
		}
		if info.State.Msgs > 0 {
			ts.LastStored = info.State.LastTime
		}
		ts.keyStreams = topicStreams(p, t, keyStreams(info))[1:]
		out = append(out, ts)
		seen[ts.stream] = true
	}
	if err := list.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		ts := &out[i]
		ts.keyLastSeq = make([]uint64, len(ts.keyStreams))
		for k, name := range ts.keyStreams {
			info := keyStreamInfos[name]
			if info == nil {
				continue // being created or deleted
			}
			ts.keyLastSeq[k] = info.State.LastSeq
			ts.Messages += info.State.Msgs
			ts.Bytes += info.State.Bytes
			ts.Consumers += info.State.Consumers
			if info.State.Msgs > 0 && info.State.LastTime.After(ts.LastStored) {
				ts.LastStored = info.State.LastTime
			}
		}
	}
	slices.SortFunc(out, func(a, b TopicState) int { return strings.Compare(a.Name, b.Name) })
	in.mu.Lock()
	for name := range in.streams {
		if !seen[name] {
			delete(in.streams, name)
		}
	}
	in.mu.Unlock()
	return out, nil
}

// SubscriptionState is what JetStream holds for one subscription, across
// every receiver, as Inspector.Subscriptions read it.
type SubscriptionState struct {
	Name string // projects/P/subscriptions/S
	// Config is the configuration it was read with: the caller's, from
	// known or lookup (nil when known gave none).
	Config *SubscriptionConfig
	// Consumers counts its JetStream consumers (of every seek epoch).
	Consumers int
	// Backlog is the messages not yet acked, delivered or not, as its
	// consumers count them; Unacked those of them delivered and waiting
	// for an ack (or redelivery). With per-key delivery the keyed part of
	// the backlog is the larger of the key consumers' count and
	// Undiscovered: exact unless some of those keys have a consumer and
	// others not.
	Backlog uint64
	Unacked uint64
	// OldestUnacked is when the oldest message not acked was stored; zero
	// when there is none (or it was not found within MaxOldestLookups).
	OldestUnacked time.Time
	// Partitions are a partitioned subscription's partitions, by index.
	Partitions []PartitionState

	// Per-key delivery (ordered, not detached, topic not deleted): the
	// discovery floor (HasFloor false: none found), every keyed message at
	// or below which has a key consumer, and the keyed messages stored
	// after it, which may have none yet (nobody receives, so nobody
	// discovers them).
	Floor        uint64
	HasFloor     bool
	Undiscovered uint64

	keyed   uint64            // the backlog of its consumers of keyed messages
	pending []pendingConsumer // its consumers with messages not acked
}

// pendingConsumer is a consumer with messages not acked, and its stream.
type pendingConsumer struct {
	info   *jetstream.ConsumerInfo
	stream jetstream.Stream
}

// PartitionState is one partition of a partitioned subscription.
type PartitionState struct {
	Index   int
	Pending uint64 // not yet delivered
	Unacked uint64 // delivered, not yet acked
	// PinID is the server's pin id of the receiver that owns the
	// partition; "" when none does (the next receiver to ask takes it).
	// PinnedSince is when it was pinned (zero if the server does not say).
	PinID       string
	PinnedSince time.Time
	// Holder names the process of the receiver that owns the partition,
	// as its client was named (WithName); "" when none does or it is not
	// known.
	Holder string
}

// Subscriptions reads the consumers on the streams of topics (as Topics
// returned them; those without consumers are skipped) and returns, by
// name, the state of every subscription in known and of every other
// subscription they belong to.
//
// known gives subscriptions to report whether or not they have consumers,
// with their configuration, which Subscriptions only reads (a nil one is
// allowed: the subscription is then read as one without per-key
// delivery). lookup is asked, at most once per call and subscription, for
// the configuration of a subscription found by its consumers and not in
// known; when it returns nil (or is nil) the subscription is left out, as
// one that was deleted and whose consumers are not yet. lookup is called
// on the calling goroutine, with ctx.
//
// Its cost: one consumer listing per stream with consumers; per
// subscription with messages not acked at most MaxOldestLookups message
// reads; per per-key subscription one registry read (a key listing only
// after a seek), and, when messages were stored after its discovery floor,
// one short-lived consumer (created to count them and deleted at once) and
// one message read. Errors are JetStream's, as they are; a stream deleted
// meanwhile is skipped.
func (in *Inspector) Subscriptions(ctx context.Context, topics []TopicState, known map[string]*SubscriptionConfig,
	lookup func(ctx context.Context, project, id string) *SubscriptionConfig) (map[string]*SubscriptionState, error) {
	subs := make(map[string]*SubscriptionState, len(known))
	for name, cfg := range known {
		subs[name] = &SubscriptionState{Name: name, Config: cfg}
	}
	if err := in.readConsumers(ctx, topics, subs, lookup); err != nil {
		return nil, err
	}
	for _, st := range subs {
		if err := in.readOldest(ctx, st); err != nil {
			return nil, err
		}
		if err := in.readHolders(ctx, st); err != nil {
			return nil, err
		}
	}
	lastSeq := make(map[string]uint64, len(topics))
	for _, t := range topics {
		lastSeq[t.stream] = t.LastSequence
		for k, name := range t.keyStreams {
			lastSeq[name] = t.keyLastSeq[k]
		}
	}
	for _, st := range subs {
		if err := in.readUndiscovered(ctx, st, lastSeq); err != nil {
			return nil, err
		}
		st.keyed, st.pending = 0, nil
	}
	return subs, nil
}

// readConsumers adds up, per subscription, the consumers of the topics'
// streams, adding the subscriptions found that lookup knows.
func (in *Inspector) readConsumers(ctx context.Context, topics []TopicState, subs map[string]*SubscriptionState,
	lookup func(ctx context.Context, project, id string) *SubscriptionConfig) error {
	gone := make(map[string]bool) // subscriptions of consumers left behind by a delete
	for _, t := range topics {
		if t.Consumers == 0 {
			continue
		}
		for _, name := range append([]string{t.stream}, t.keyStreams...) {
			if err := in.readStreamConsumers(ctx, name, subs, gone, lookup); err != nil {
				return err
			}
		}
	}
	return nil
}

// readStreamConsumers is readConsumers for one stream of a topic.
func (in *Inspector) readStreamConsumers(ctx context.Context, name string, subs map[string]*SubscriptionState, gone map[string]bool,
	lookup func(ctx context.Context, project, id string) *SubscriptionConfig) error {
	stream, err := in.stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	consumers := stream.ListConsumers(ctx)
	for info := range consumers.Info() {
		project, id, partition, ok := parseConsumerDescription(info.Config.Description)
		if !ok {
			continue
		}
		name := subscriptionName(project, id)
		st := subs[name]
		if st == nil {
			if gone[name] {
				continue
			}
			var cfg *SubscriptionConfig
			if lookup != nil {
				cfg = lookup(ctx, project, id)
			}
			if cfg == nil {
				gone[name] = true
				continue
			}
			st = &SubscriptionState{Name: name, Config: cfg}
			subs[name] = st
		}
		st.add(info, stream, partition)
	}
	if err := consumers.Err(); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return nil
}

// add counts one of the subscription's consumers, on stream; partition is
// its partition, -1 for a consumer of no partition.
func (st *SubscriptionState) add(info *jetstream.ConsumerInfo, stream jetstream.Stream, partition int) {
	st.Consumers++
	if strings.HasPrefix(info.Config.FilterSubject, keyedPrefix(st.Config)) {
		st.keyed += info.NumPending + uint64(info.NumAckPending)
	} else {
		st.Backlog += info.NumPending + uint64(info.NumAckPending)
	}
	st.Unacked += uint64(info.NumAckPending)
	if info.NumPending > 0 || info.NumAckPending > 0 {
		st.pending = append(st.pending, pendingConsumer{info, stream})
	}
	if partition >= 0 {
		st.addPartition(partition, info)
	}
}

// addPartition records partition i's consumer. A seek leaves the earlier
// epoch's consumers paused for a while: the one that is not paused wins.
func (st *SubscriptionState) addPartition(i int, info *jetstream.ConsumerInfo) {
	for len(st.Partitions) <= i {
		st.Partitions = append(st.Partitions, PartitionState{Index: len(st.Partitions)})
	}
	if p := st.Partitions[i]; (p.Pending+p.Unacked > 0 || p.PinID != "") && info.Paused {
		return
	}
	st.Partitions[i] = PartitionState{Index: i, Pending: info.NumPending, Unacked: uint64(info.NumAckPending),
		PinID: pinnedIn(info), PinnedSince: pinnedAt(info)}
}

// keyedPrefix is what the filters of a subscription's consumers of keyed
// messages begin with; "\x00" (nothing) when the configuration is not
// known.
func keyedPrefix(cfg *SubscriptionConfig) string {
	if cfg == nil || cfg.Topic == nil {
		return "\x00"
	}
	return strings.TrimSuffix(keyrouter.KeyedFilter(cfg.Topic.project, cfg.Topic.id), ">")
}

// readOldest finds when the oldest message that the subscription's
// consumers have not acked was stored: for each, the first message of its
// filter after its ack floor. It reads at most MaxOldestLookups messages,
// lowest floors first, and stops once no other consumer can hold an older
// one.
func (in *Inspector) readOldest(ctx context.Context, st *SubscriptionState) error {
	pending := st.pending
	slices.SortFunc(pending, func(a, b pendingConsumer) int { return cmp.Compare(a.info.AckFloor.Stream, b.info.AckFloor.Stream) })
	// Per stream, in sequence order; across the streams of a topic with
	// key streams (sequences in ranges of their own), by time.
	var best *jetstream.RawStreamMsg
	bestIn := map[string]uint64{} // per stream, the first unacked sequence found
	lookups := map[string]int{}
	for _, pc := range pending {
		info, stream := pc.info, pc.stream
		if first, ok := bestIn[info.Stream]; lookups[info.Stream] == MaxOldestLookups || ok && info.AckFloor.Stream+1 >= first {
			continue
		}
		lookups[info.Stream]++
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
			return err
		}
		if first, ok := bestIn[info.Stream]; !ok || m.Sequence < first {
			bestIn[info.Stream] = m.Sequence
		}
		if best == nil || m.Time.Before(best.Time) {
			best = m
		}
	}
	if best != nil {
		st.OldestUnacked = best.Time
	}
	return nil
}

// perKey reports whether a subscription with configuration cfg has keyed
// messages no consumer may cover yet: per-key delivery, receiving.
func perKey(cfg *SubscriptionConfig) bool {
	return cfg != nil && cfg.EnableMessageOrdering && cfg.Delivery == DeliveryPerKey && !cfg.TopicDeleted && !cfg.Detached
}

// readUndiscovered completes the backlog with the keyed messages: for
// per-key delivery, those after the discovery floor may have no consumer
// yet, so the keyed backlog is the larger of their count and the key
// consumers'. (The larger is exact when the messages after the floor are
// all covered or all not, and low by the covered ones otherwise.) The
// count is the pending count of a consumer made for it, and deleted at
// once; lastSeq holds each stream's last sequence, by stream name.
func (in *Inspector) readUndiscovered(ctx context.Context, st *SubscriptionState, lastSeq map[string]uint64) error {
	if !perKey(st.Config) {
		st.Backlog += st.keyed
		return nil
	}
	n, first, err := in.undiscovered(ctx, st, lastSeq)
	if err != nil {
		return err
	}
	st.Undiscovered = n
	st.Backlog += max(st.keyed, n)
	if first != nil && (st.OldestUnacked.IsZero() || first.Time.Before(st.OldestUnacked)) {
		st.OldestUnacked = first.Time
	}
	return nil
}

// undiscovered reads a per-key subscription's discovery floor, and counts
// the keyed messages after it and returns the first of them; on a topic
// with key streams, after each key stream's floor.
func (in *Inspector) undiscovered(ctx context.Context, st *SubscriptionState, lastSeq map[string]uint64) (uint64, *jetstream.RawStreamMsg, error) {
	project, id, ok := parseSubscriptionName(st.Name)
	if !ok {
		return 0, nil, nil
	}
	kvKey := keyrouter.KVKey(project, id)
	floor, ok, err := in.floor(ctx, st.Name, kvKey)
	if err != nil || !ok {
		return 0, nil, err
	}
	st.Floor, st.HasFloor = floor, true
	t := st.Config.Topic
	n, first, err := in.afterFloor(ctx, keyrouter.StreamName(t.project, t.id), floor, lastSeq, keyrouter.KeyedFilter(t.project, t.id))
	if err != nil {
		return 0, nil, err
	}
	in.mu.Lock()
	key := cmp.Or(in.floors[st.Name], floorKey(kvKey, 0)) // where floor found it
	in.mu.Unlock()
	keyStreams := 0 // the topic's, as Topics found them
	for {
		if _, ok := lastSeq[keyrouter.KeyStreamName(t.project, t.id, keyStreams)]; !ok {
			break
		}
		keyStreams++
	}
	if keyStreams == 0 {
		return n, first, nil
	}
	kv, err := in.registryBucket(ctx)
	if err != nil {
		return 0, nil, err
	}
	for i := range keyStreams {
		name := keyrouter.KeyStreamName(t.project, t.id, i)
		e, err := kv.Get(ctx, keyStreamFloorOf(key, i))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // a partitioned or unordered subscription's: none
		}
		if err != nil {
			return 0, nil, err
		}
		kfloor, err := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil {
			continue
		}
		kn, kfirst, err := in.afterFloor(ctx, name, kfloor, lastSeq, keyrouter.PartitionFilter(t.project, t.id, keyStreams, i))
		if err != nil {
			return 0, nil, err
		}
		n += kn
		if kfirst != nil && (first == nil || kfirst.Time.Before(first.Time)) {
			first = kfirst
		}
	}
	return n, first, nil
}

// afterFloor counts the messages of streamName matching filter after
// floor, and returns the first of them.
func (in *Inspector) afterFloor(ctx context.Context, streamName string, floor uint64, lastSeq map[string]uint64, filter string) (uint64, *jetstream.RawStreamMsg, error) {
	if floor >= lastSeq[streamName] {
		return 0, nil, nil // nothing stored after it (or no stream)
	}
	stream, err := in.stream(ctx, streamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
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

// floor reads the discovery floor of subscription name, whose registry key
// is kvKey: floorKey(kvKey, epoch) of the highest epoch there is. Where it
// was found is kept, so that a floor is listed for only after a seek. ok
// is false when there is none.
func (in *Inspector) floor(ctx context.Context, name, kvKey string) (floor uint64, ok bool, err error) {
	kv, err := in.registryBucket(ctx)
	if err != nil {
		return 0, false, err
	}
	in.mu.Lock()
	key := cmp.Or(in.floors[name], floorKey(kvKey, 0))
	in.mu.Unlock()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Sought since: find the epoch's floor.
		keys, lerr := kv.ListKeysFiltered(ctx, floorKey(kvKey, 0), floorKey(kvKey, 0)+".>")
		if lerr != nil {
			return 0, false, lerr
		}
		best, bestEpoch := "", uint64(0)
		for k := range keys.Keys() {
			if epoch, ok := floorEpoch(kvKey, k); ok && (best == "" || epoch > bestEpoch) {
				best, bestEpoch = k, epoch
			}
		}
		in.mu.Lock()
		if best == "" {
			delete(in.floors, name)
		} else {
			in.floors[name] = best
		}
		in.mu.Unlock()
		if best == "" {
			return 0, false, nil
		}
		e, err = kv.Get(ctx, best)
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

func (in *Inspector) registryBucket(ctx context.Context) (jetstream.KeyValue, error) {
	in.mu.Lock()
	kv := in.registry
	in.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := in.js.KeyValue(ctx, subscriptionsBucket)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.registry = kv
	in.mu.Unlock()
	return kv, nil
}

func (in *Inspector) stateBucket(ctx context.Context) (jetstream.KeyValue, error) {
	in.mu.Lock()
	kv := in.state
	in.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := in.js.KeyValue(ctx, stateBucket)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.state = kv
	in.mu.Unlock()
	return kv, nil
}

func (in *Inspector) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	in.mu.Lock()
	s := in.streams[name]
	in.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := in.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.streams[name] = s
	in.mu.Unlock()
	return s, nil
}

// parseConsumerDescription reads the description of a subscription's
// consumer, as consumerDescription and partitionConsumerConfig write it:
// "jetorder projects/P/subscriptions/S", followed by " partition N of M"
// for a partition consumer. partition is -1 for other consumers; ok is
// false for a consumer of no subscription.
func parseConsumerDescription(desc string) (project, id string, partition int, ok bool) {
	rest, ok := strings.CutPrefix(desc, "jetorder ")
	if !ok {
		return "", "", 0, false
	}
	name, rest, _ := strings.Cut(rest, " ")
	if project, id, ok = parseSubscriptionName(name); !ok {
		return "", "", 0, false
	}
	partition = -1
	if p, ok := strings.CutPrefix(rest, "partition "); ok {
		n, _, _ := strings.Cut(p, " ")
		if i, err := strconv.Atoi(n); err == nil && i >= 0 && i < keyrouter.Slots {
			partition = i
		}
	}
	return project, id, partition, true
}

// parseSubscriptionName splits a valid projects/P/subscriptions/S.
func parseSubscriptionName(name string) (project, id string, ok bool) {
	rest, ok := strings.CutPrefix(name, "projects/")
	if !ok {
		return "", "", false
	}
	project, id, ok = strings.Cut(rest, "/subscriptions/")
	if !ok || keyrouter.ValidateProjectID(project) != nil || keyrouter.ValidateSubscriptionID(id) != nil {
		return "", "", false
	}
	return project, id, true
}

func subscriptionName(project, id string) string {
	return "projects/" + project + "/subscriptions/" + id
}

// readHolders names the holders of a partitioned subscription's pinned
// partitions: the owner record of a partition with the server's pin names
// the receiver, whose member record names its process. At most a lookup
// per partition and one per receiver.
func (in *Inspector) readHolders(ctx context.Context, st *SubscriptionState) error {
	if st.Config == nil || len(st.Partitions) == 0 {
		return nil
	}
	project, id, ok := parseSubscriptionName(st.Name)
	if !ok {
		return nil
	}
	kv, err := in.stateBucket(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	kvKey := keyrouter.KVKey(project, id)
	names := map[string]string{}
	for i := range st.Partitions {
		p := &st.Partitions[i]
		if p.PinID == "" {
			continue
		}
		e, err := kv.Get(ctx, kvKey+".owners.e"+strconv.FormatUint(st.Config.epoch, 10)+"."+strconv.Itoa(p.Index))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		rec, ok := parseOwnerRecord(e.Value())
		if !ok || rec.pin != p.PinID {
			continue // another receiver holds it now and has not recorded itself yet
		}
		name, seen := names[rec.receiver]
		if !seen {
			if m, err := kv.Get(ctx, kvKey+".members."+rec.receiver); err == nil {
				name = string(m.Value())
			} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
				return err
			}
			names[rec.receiver] = name
		}
		p.Holder = name
	}
	return nil
}
