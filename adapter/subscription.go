package adapter

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/filter"
	"github.com/jetorder/jetorder/keyrouter"
)

const (
	// deliverGroup is the queue group every receiving process joins on a
	// subscription's delivery subject, so each pushed message reaches one.
	deliverGroup = "jetorder"
	// sharedMaxAckPending bounds unacked messages on a subscription's shared
	// consumer (unkeyed messages, or everything without ordering).
	sharedMaxAckPending = 2048

	defaultAckDeadline = 10 * time.Second
	minAckDeadline     = time.Second
	maxAckDeadline     = 600 * time.Second
)

// SubscriptionConfig is a subscription's configuration.
type SubscriptionConfig struct {
	// Topic the subscription receives from. Required on create.
	Topic *Topic
	// AckDeadline is how long a delivered message may stay unacked before it
	// is redelivered (Receive extends it while a handler runs). 1s..600s;
	// 0 means 10s.
	AckDeadline time.Duration
	// EnableMessageOrdering delivers messages with the same ordering key one
	// at a time, in publish order. It cannot be changed after creation.
	EnableMessageOrdering bool
	// Delivery chooses how an ordered subscription holds each key to one
	// message in flight: DeliveryPartitioned or DeliveryPerKey; ""
	// means DefaultDelivery. It cannot be changed after creation, and only
	// applies with EnableMessageOrdering.
	Delivery DeliveryMode
	// Partitions is a partitioned subscription's partition count: 1, 2, 4,
	// 8, 16, 32 or 64; 0 means 8. Each partition is owned by one receiving
	// process at a time. On a topic with key streams it is at least their
	// count (TopicConfig.KeyStreams): partition i reads key stream i mod
	// KeyStreams, all of it when the counts are equal.
	Partitions int
	// PartitionBuffer bounds the unacked messages of one partition, those
	// in handlers and those waiting behind an earlier message of their key:
	// 1..100000, 0 means 1000. A key that never acks holds back the rest of
	// its partition once the buffer is full.
	PartitionBuffer int
	// StartTime, when set, starts the subscription at the first message its
	// topic stored at or after that time (JetStream start-by-time), to
	// replay what was recorded since; zero starts with the next message
	// published. Messages the topic no longer retains cannot be replayed.
	StartTime time.Time
	// DeadLetterPolicy, when set, moves a message that has been delivered
	// MaxDeliveryAttempts times without an ack to another topic, so its
	// ordering key moves on. Without it a message is redelivered for ever.
	DeadLetterPolicy *DeadLetterPolicy
	// Labels are the application's own key/value pairs.
	Labels map[string]string
	// Filter, when set, delivers only the messages whose attributes match
	// it, in Pub/Sub's filter language (`attributes.kind = "order" AND
	// NOT attributes:test`); the others are acked without reaching a
	// handler, so they never hold their ordering key. Attributes here are
	// Message.PubSubAttributes. At most 256 bytes; it cannot be changed
	// after creation.
	Filter string
	// RetryPolicy, when set, delays the redelivery of a nacked message (or
	// one whose deadline passed) by an exponential backoff; the message's
	// ordering key waits meanwhile. Without it a message is redelivered at
	// once.
	RetryPolicy *RetryPolicy
	// Detached reports that the subscription was detached from its topic
	// (Detach): it receives nothing more (Config only).
	Detached bool
	// TopicDeleted reports that the subscription's topic was deleted (and
	// perhaps created again: a subscription never moves to the new topic),
	// so it receives nothing more (Config only).
	TopicDeleted bool
	// ServiceSettings are bytes a layer above keeps with the subscription
	// (the sidecar keeps the Pub/Sub settings the library does not act
	// on); the adapter stores and returns them, at most 64 KiB.
	ServiceSettings []byte
	// ExactlyOnce records that the subscription's acks are to be confirmed
	// by the server before their sender is told they succeeded (Pub/Sub's
	// exactly-once delivery): a receiver acks with Message.AckWithResult.
	// Receive itself does not act on it; the sidecar does. It can be
	// changed by Update.
	ExactlyOnce bool

	// epoch is the subscription's, as read: an Inspector finds the owner
	// records of its partitions by it.
	epoch uint64
}

// RetryPolicy is the backoff before a nacked or expired message is
// delivered again: MinimumBackoff after the first delivery, doubling with
// each further one, at most MaximumBackoff. Zero values mean Pub/Sub's
// defaults, 10s and 600s; both are 0..600s and the minimum is at most the
// maximum.
type RetryPolicy struct {
	MinimumBackoff time.Duration
	MaximumBackoff time.Duration
}

const (
	defaultMinBackoff  = 10 * time.Second
	defaultMaxBackoff  = 600 * time.Second
	maxServiceSettings = 64 << 10
)

// retryRecord checks p and returns what the registry stores: nil for none.
func retryRecord(p *RetryPolicy) (*retryPolicyRecord, error) {
	if p == nil {
		return nil, nil
	}
	lo, hi := cmp.Or(p.MinimumBackoff, defaultMinBackoff), cmp.Or(p.MaximumBackoff, defaultMaxBackoff)
	switch {
	case lo < 0 || lo > maxAckDeadline:
		return nil, fmt.Errorf("%w: retry policy minimum backoff %v not in 0s..%v", ErrInvalidConfig, p.MinimumBackoff, maxAckDeadline)
	case hi < 0 || hi > maxAckDeadline:
		return nil, fmt.Errorf("%w: retry policy maximum backoff %v not in 0s..%v", ErrInvalidConfig, p.MaximumBackoff, maxAckDeadline)
	case lo > hi:
		return nil, fmt.Errorf("%w: retry policy minimum backoff %v is above the maximum %v", ErrInvalidConfig, lo, hi)
	}
	return &retryPolicyRecord{MinMS: lo.Milliseconds(), MaxMS: hi.Milliseconds()}, nil
}

type retryPolicyRecord struct {
	MinMS int64 `json:"min_ms"`
	MaxMS int64 `json:"max_ms"`
}

func (r *retryPolicyRecord) policy() *RetryPolicy {
	if r == nil {
		return nil
	}
	return &RetryPolicy{MinimumBackoff: time.Duration(r.MinMS) * time.Millisecond, MaximumBackoff: time.Duration(r.MaxMS) * time.Millisecond}
}

// backoff is the delay before delivery attempt+1 of a message: the minimum
// doubled attempt-1 times, at most the maximum.
func (r *retryPolicyRecord) backoff(attempt int) time.Duration {
	lo, hi := time.Duration(r.MinMS)*time.Millisecond, time.Duration(r.MaxMS)*time.Millisecond
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// DeliveryMode is how an ordered subscription delivers keyed messages.
type DeliveryMode string

const (
	// DeliveryPerKey gives every active key its own JetStream consumer with
	// MaxAckPending 1, created when the key has messages and removed when
	// it is idle. JetStream itself holds each key to one message in flight,
	// for every receiving process, and a stuck key never holds up another.
	// Consumers are created at a few hundred per second: for tens to
	// hundreds of active keys.
	DeliveryPerKey DeliveryMode = "per-key"
	// DeliveryPartitioned spreads keys over a fixed number of partitions,
	// each one consumer pinned to one receiving process (a JetStream
	// priority group), which holds each key to one message in flight
	// itself. No consumer is created per key, so it suits many keys and a
	// high rate of new ones; a key that never acks can hold back its
	// partition once the partition's buffer is full.
	DeliveryPartitioned DeliveryMode = "partitioned"
)

// DefaultDelivery is the delivery mode of ordered subscriptions created
// without one: partitioned delivery won every benchmark, from one key to
// 100,000 (docs/BENCHMARKS.md, "Delivery modes").
const DefaultDelivery = DeliveryPartitioned

const (
	defaultPartitions      = 8
	defaultPartitionBuffer = 1000
	maxPartitionBuffer     = 100_000
)

// deliveryRecord checks the delivery settings of cfg and returns what the
// registry stores.
func deliveryRecord(cfg *SubscriptionConfig) (mode DeliveryMode, partitions, buffer int, err error) {
	mode = cmp.Or(cfg.Delivery, DefaultDelivery)
	partitionsSet := cfg.Partitions != 0 || cfg.PartitionBuffer != 0
	switch {
	case mode != DeliveryPerKey && mode != DeliveryPartitioned:
		return "", 0, 0, fmt.Errorf("%w: delivery %q; must be %q or %q", ErrInvalidConfig, cfg.Delivery, DeliveryPerKey, DeliveryPartitioned)
	case mode == DeliveryPerKey && partitionsSet:
		return "", 0, 0, fmt.Errorf("%w: partitions are set but delivery is not %q", ErrInvalidConfig, DeliveryPartitioned)
	case !cfg.EnableMessageOrdering && (cfg.Delivery == DeliveryPartitioned || partitionsSet):
		return "", 0, 0, fmt.Errorf("%w: %q delivery needs message ordering", ErrInvalidConfig, DeliveryPartitioned)
	case !cfg.EnableMessageOrdering:
		return "", 0, 0, nil // the default applies to ordered subscriptions only
	case mode == DeliveryPerKey:
		return DeliveryPerKey, 0, 0, nil
	}
	partitions, buffer = cfg.Partitions, cfg.PartitionBuffer
	if partitions == 0 {
		partitions = defaultPartitions
	}
	if partitions < 1 || partitions > keyrouter.Slots || keyrouter.Slots%partitions != 0 {
		return "", 0, 0, fmt.Errorf("%w: %d partitions; must be 1, 2, 4, 8, 16, 32 or 64", ErrInvalidConfig, partitions)
	}
	if buffer == 0 {
		buffer = defaultPartitionBuffer
	}
	if buffer < 1 || buffer > maxPartitionBuffer {
		return "", 0, 0, fmt.Errorf("%w: partition buffer %d not in 1..%d", ErrInvalidConfig, buffer, maxPartitionBuffer)
	}
	return DeliveryPartitioned, partitions, buffer, nil
}

// DeadLetterPolicy says where messages go that cannot be delivered.
type DeadLetterPolicy struct {
	// Topic receives the messages, with their data, attributes and
	// ordering key, plus the attributes in DeadLetter*Attribute.
	Topic *Topic
	// MaxDeliveryAttempts is how many deliveries a message gets before it
	// is moved: 5..100, 0 means 5.
	MaxDeliveryAttempts int
}

// SubscriptionUpdate lists the fields Update changes; nil and zero fields
// stay. Message ordering, delivery mode and topic cannot be changed.
type SubscriptionUpdate struct {
	// DeadLetterPolicy replaces the policy; a policy with a nil Topic
	// removes it.
	DeadLetterPolicy *DeadLetterPolicy
	// Labels replace the labels; an empty, non-nil map removes them.
	Labels map[string]string
	// AckDeadline, when not 0, replaces the ack deadline (1s..600s).
	AckDeadline time.Duration
	// SetRetryPolicy replaces the retry policy with RetryPolicy (nil
	// removes it).
	SetRetryPolicy bool
	RetryPolicy    *RetryPolicy
	// ServiceSettings, when not nil, replace the layer-above settings.
	ServiceSettings []byte
	// ExactlyOnce, when not nil, replaces the exactly-once setting.
	ExactlyOnce *bool
}

const (
	defaultMaxDeliveryAttempts = 5
	minMaxDeliveryAttempts     = 5
	maxMaxDeliveryAttempts     = 100
)

// Attributes added to a message moved to a dead-letter topic.
const (
	DeadLetterSourceSubscriptionAttribute  = "CloudPubSubDeadLetterSourceSubscription"
	DeadLetterSourceDeliveryCountAttribute = "CloudPubSubDeadLetterSourceDeliveryCount"
)

// subRecord is what the registry bucket stores for a subscription.
type subRecord struct {
	ID           string `json:"id"`
	Project      string `json:"project"`
	TopicProject string `json:"topic_project"`
	Topic        string `json:"topic"`
	Ordering     bool   `json:"ordering"`
	// Delivery is "per-key", "partitioned", or "" for per key (records
	// from before partitioned delivery).
	Delivery        DeliveryMode `json:"delivery,omitempty"`
	Partitions      int          `json:"partitions,omitempty"`
	PartitionBuffer int          `json:"partition_buffer,omitempty"`
	AckDeadlineMS   int64        `json:"ack_deadline_ms"`
	StartSeq        uint64       `json:"start_seq"`
	// KeyStreams is the topic's (TopicConfig.KeyStreams, 0 for one
	// stream), and KeyStartSeqs the first sequence of each key stream the
	// subscription receives: StartSeq is the topic's own stream's.
	KeyStreams    int       `json:"key_streams,omitempty"`
	KeyStartSeqs  []uint64  `json:"key_start_seqs,omitempty"`
	StartTime     time.Time `json:"start_time,omitzero"`
	StreamCreated time.Time `json:"stream_created"`
	Created       time.Time `json:"created"`

	DeadLetter *deadLetterRecord  `json:"dead_letter,omitempty"`
	Labels     map[string]string  `json:"labels,omitempty"`
	Retry      *retryPolicyRecord `json:"retry,omitempty"`
	Filter     string             `json:"filter,omitempty"`
	Detached   bool               `json:"detached,omitempty"`
	Service    []byte             `json:"service,omitempty"`
	// ExactlyOnce is SubscriptionConfig.ExactlyOnce.
	ExactlyOnce bool `json:"exactly_once,omitempty"`

	// Seeks (seek.go). Epoch counts them: the consumers of epoch e > 0 are
	// named after ID+"/e" (nameID). Settling is set from a seek until every
	// message the old epoch's consumers delivered is settled and the new
	// epoch's consumers, starting at SeekSeq, exist.
	Epoch    uint64 `json:"epoch,omitempty"`
	Settling bool   `json:"settling,omitempty"`
	SeekSeq  uint64 `json:"seek_seq,omitempty"`
	// SeekKeySeqs is SeekSeq for each key stream (Point.KeySeqs).
	SeekKeySeqs []uint64 `json:"seek_key_seqs,omitempty"`
}

type deadLetterRecord struct {
	TopicProject        string `json:"topic_project"`
	Topic               string `json:"topic"`
	MaxDeliveryAttempts int    `json:"max_delivery_attempts"`
}

// deadLetterRecord checks p and returns what the registry stores for it:
// nil for no policy.
func (c *Client) deadLetterRecord(p *DeadLetterPolicy) (*deadLetterRecord, error) {
	if p == nil || p.Topic == nil {
		return nil, nil
	}
	n := p.MaxDeliveryAttempts
	if n == 0 {
		n = defaultMaxDeliveryAttempts
	}
	if n < minMaxDeliveryAttempts || n > maxMaxDeliveryAttempts {
		return nil, fmt.Errorf("%w: max delivery attempts %d not in %d..%d", ErrInvalidConfig, n, minMaxDeliveryAttempts, maxMaxDeliveryAttempts)
	}
	return &deadLetterRecord{TopicProject: p.Topic.project, Topic: p.Topic.id, MaxDeliveryAttempts: n}, nil
}

func (c *Client) deadLetterPolicy(r *deadLetterRecord) *DeadLetterPolicy {
	if r == nil {
		return nil
	}
	return &DeadLetterPolicy{Topic: c.TopicInProject(r.Topic, r.TopicProject), MaxDeliveryAttempts: r.MaxDeliveryAttempts}
}

func (r *subRecord) ackDeadline() time.Duration {
	return time.Duration(r.AckDeadlineMS) * time.Millisecond
}

func (r *subRecord) stream() string { return keyrouter.StreamName(r.TopicProject, r.Topic) }

// streams names every stream of the subscription's topic, its own first.
func (r *subRecord) streams() []string { return topicStreams(r.TopicProject, r.Topic, r.KeyStreams) }

// split reports whether the topic's keyed messages are in key streams.
func (r *subRecord) split() bool { return r.KeyStreams > 1 }

// partitionStream is the stream partition i reads, with filter (""
// for the whole stream) and start: on a split topic key stream i mod
// KeyStreams, all of it with as many partitions as key streams, the
// partition's slots of it with more (never fewer: CreateSubscription
// raises them); otherwise the topic's one stream.
func (r *subRecord) partitionStream(i int) (stream, filter string, start uint64) {
	if !r.split() {
		return r.stream(), keyrouter.PartitionFilter(r.TopicProject, r.Topic, r.Partitions, i), r.StartSeq
	}
	k := i % r.KeyStreams
	if r.Partitions > r.KeyStreams {
		filter = keyrouter.PartitionFilter(r.TopicProject, r.Topic, r.Partitions, i)
	}
	return keyrouter.KeyStreamName(r.TopicProject, r.Topic, k), filter, r.KeyStartSeqs[k]
}

func (r *subRecord) partitioned() bool { return r.Ordering && r.Delivery == DeliveryPartitioned }

// deliveryMode is the mode Config reports: per key for every ordered
// subscription that is not partitioned, none without ordering.
func (r *subRecord) deliveryMode() DeliveryMode {
	switch {
	case r.partitioned():
		return DeliveryPartitioned
	case r.Ordering:
		return DeliveryPerKey
	}
	return ""
}

// consumerConfig is the push consumer every consumer of the subscription
// shares but for name, filter, start and MaxAckPending.
func (r *subRecord) consumerConfig(name, filter string, start uint64, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    r.consumerDescription(),
		DeliverSubject: keyrouter.DeliverSubject(r.Project, r.nameID()),
		DeliverGroup:   deliverGroup,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    start,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.ackDeadline(),
		MaxDeliver:     -1,
		FilterSubject:  filter,
		MaxAckPending:  maxAckPending,
	}
}

// consumerDescription is the description of every consumer of the
// subscription (partition consumers add to it): consumerInfos finds them
// by it, whatever their epoch.
func (r *subRecord) consumerDescription() string {
	return "jetorder projects/" + r.Project + "/subscriptions/" + r.ID
}

// nameID is what the consumer names and deliver subject of the record's
// epoch derive from: the id, and "/epoch" after a seek ("/" is not allowed
// in ids, so no other subscription's names can be the same).
func (r *subRecord) nameID() string {
	if r.Epoch == 0 {
		return r.ID
	}
	return r.ID + "/" + strconv.FormatUint(r.Epoch, 10)
}

// sharedConsumer is the consumer of unkeyed messages (ordering) or of every
// message (no ordering).
func (r *subRecord) sharedConsumer() (name, filter string) {
	if r.Ordering {
		return keyrouter.UnkeyedConsumer(r.Project, r.nameID()), keyrouter.UnkeyedSubject(r.TopicProject, r.Topic)
	}
	return keyrouter.AllConsumer(r.Project, r.nameID()), keyrouter.TopicSubjects(r.TopicProject, r.Topic)
}

// Subscription is a handle on a subscription. Getting one does no I/O.
type Subscription struct {
	c  *Client
	id string
	// ReceiveSettings tune Receive; set them before calling it.
	ReceiveSettings ReceiveSettings
}

// Subscription returns a handle on the subscription id of the project.
func (c *Client) Subscription(id string) *Subscription {
	return &Subscription{c: c, id: id, ReceiveSettings: DefaultReceiveSettings}
}

// ID is the subscription id.
func (s *Subscription) ID() string { return s.id }

// String is the subscription's full name.
func (s *Subscription) String() string {
	return "projects/" + s.c.project + "/subscriptions/" + s.id
}

func (s *Subscription) kvKey() string { return keyrouter.KVKey(s.c.project, s.id) }

// floorKey is where key discovery of the epoch's consumers keeps its floor.
func (s *Subscription) floorKey(epoch uint64) string { return floorKey(s.kvKey(), epoch) }

// floorKey is the registry key of the discovery floor of the epoch's
// consumers of the subscription whose registry key is kvKey.
func floorKey(kvKey string, epoch uint64) string {
	if epoch == 0 {
		return kvKey + ".floor"
	}
	return kvKey + ".floor.e" + strconv.FormatUint(epoch, 10)
}

// floorEpoch is the epoch whose floor key is key, of the subscription
// whose registry key is kvKey; ok is false for any other key.
func floorEpoch(kvKey, key string) (epoch uint64, ok bool) {
	rest, ok := strings.CutPrefix(key, floorKey(kvKey, 0))
	switch {
	case !ok:
		return 0, false
	case rest == "":
		return 0, true
	}
	n, ok := strings.CutPrefix(rest, ".e")
	if !ok {
		return 0, false
	}
	epoch, err := strconv.ParseUint(n, 10, 64)
	return epoch, err == nil && floorKey(kvKey, epoch) == key
}

// CreateSubscription creates a subscription that receives every message
// published to cfg.Topic from now on. It returns ErrSubscriptionExists,
// ErrTopicNotFound, or an ErrInvalidSubscriptionID / ErrInvalidConfig error.
func (c *Client) CreateSubscription(ctx context.Context, id string, cfg SubscriptionConfig) (*Subscription, error) {
	if err := keyrouter.ValidateSubscriptionID(id); err != nil {
		return nil, err
	}
	if cfg.Topic == nil {
		return nil, fmt.Errorf("%w: subscription %s needs a topic", ErrInvalidConfig, id)
	}
	if err := c.ensureLayout(ctx); err != nil {
		return nil, err
	}
	if cfg.AckDeadline == 0 {
		cfg.AckDeadline = defaultAckDeadline
	}
	if cfg.AckDeadline < minAckDeadline || cfg.AckDeadline > maxAckDeadline {
		return nil, fmt.Errorf("%w: ack deadline %v not in %v..%v", ErrInvalidConfig, cfg.AckDeadline, minAckDeadline, maxAckDeadline)
	}
	deadLetter, err := c.deadLetterRecord(cfg.DeadLetterPolicy)
	if err != nil {
		return nil, err
	}
	mode, partitions, buffer, err := deliveryRecord(&cfg)
	if err != nil {
		return nil, err
	}
	retry, err := retryRecord(cfg.RetryPolicy)
	if err != nil {
		return nil, err
	}
	if _, err := filter.Parse(cfg.Filter); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if len(cfg.ServiceSettings) > maxServiceSettings {
		return nil, fmt.Errorf("%w: service settings of %d bytes, at most %d", ErrInvalidConfig, len(cfg.ServiceSettings), maxServiceSettings)
	}
	// Each request below is made in short attempts until ctx ends
	// (retryUntil): a cluster may drop one without an answer.
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var info *jetstream.StreamInfo
	if err := c.retryUntil(ctx, func(ctx context.Context) (err error) {
		info, err = cfg.Topic.info(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	keyStarts, err := c.keyStartSeqs(ctx, cfg.Topic, keyStreams(info), cfg.StartTime)
	if err != nil {
		return nil, err
	}
	if n := len(keyStarts); n > 0 && mode == DeliveryPartitioned {
		// A partition reads one key stream, or a part of one: never
		// fewer partitions than key streams.
		partitions = max(partitions, n)
	}
	kv, err := c.buckets(ctx)
	if err != nil {
		return nil, err
	}
	s := c.Subscription(id)
	rec := &subRecord{
		ID:              id,
		Project:         c.project,
		TopicProject:    cfg.Topic.project,
		Topic:           cfg.Topic.id,
		Ordering:        cfg.EnableMessageOrdering,
		Delivery:        mode,
		Partitions:      partitions,
		PartitionBuffer: buffer,
		AckDeadlineMS:   cfg.AckDeadline.Milliseconds(),
		StartSeq:        info.State.LastSeq + 1,
		StreamCreated:   info.Created,
		Created:         time.Now().UTC(),
		DeadLetter:      deadLetter,
		Labels:          maps.Clone(cfg.Labels),
		Retry:           retry,
		Filter:          cfg.Filter,
		Service:         cfg.ServiceSettings,
		ExactlyOnce:     cfg.ExactlyOnce,
		KeyStartSeqs:    keyStarts,
	}
	if len(keyStarts) > 0 {
		rec.KeyStreams = len(keyStarts)
	}
	if !cfg.StartTime.IsZero() {
		rec.StartTime = cfg.StartTime.UTC()
		if rec.StartSeq, err = cfg.Topic.firstSequenceSince(ctx, cfg.Topic.stream, cfg.StartTime, rec.StartSeq); err != nil {
			return nil, err
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	// State left by an earlier subscription of this id (a Delete that
	// failed half-way, or a receiver that saved after it) goes now, while
	// no subscription of the id exists.
	err = c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := kv.Get(ctx, s.kvKey())
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return s.purgeState(ctx)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create subscription %s: clear old state: %w", s, err)
	}
	if err := s.claim(ctx, kv, data); err != nil {
		return nil, err
	}
	if err := s.createConsumers(ctx, kv, rec); err != nil {
		// Undone with a context of its own: ctx may be the one that ended.
		undo, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.apiTimeout)
		defer cancel()
		_ = c.deleteConsumers(undo, rec)
		_ = kv.Delete(undo, s.kvKey())
		return nil, fmt.Errorf("create subscription %s: %w", s, err)
	}
	return s, nil
}

// claim writes the subscription's registry entry, data, which claims the
// id before any consumer exists, so two creates of the same id cannot
// both succeed. An entry equal to data after an attempt that went
// unanswered is this create's own.
func (s *Subscription) claim(ctx context.Context, kv jetstream.KeyValue, data []byte) error {
	unanswered := false
	err := s.c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := kv.Create(ctx, s.kvKey(), data)
		if errors.Is(err, jetstream.ErrKeyExists) && unanswered {
			if e, gerr := kv.Get(ctx, s.kvKey()); gerr == nil && bytes.Equal(e.Value(), data) {
				return nil
			}
		}
		unanswered = unanswered || transient(err)
		return err
	})
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: %s", ErrSubscriptionExists, s)
	}
	if err != nil {
		return fmt.Errorf("create subscription %s: %w", s, err)
	}
	return nil
}

func (s *Subscription) createConsumers(ctx context.Context, kv jetstream.KeyValue, rec *subRecord) error {
	// Creating a consumer again with the same configuration is no
	// change, so each is created in attempts (retryUntil).
	name, filter := rec.sharedConsumer()
	if err := s.c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := s.c.js.CreatePushConsumer(ctx, rec.stream(), rec.consumerConfig(name, filter, rec.StartSeq, sharedMaxAckPending))
		return err
	}); err != nil {
		return err
	}
	if !rec.Ordering && rec.split() {
		// The key streams' consumers of the same name deliver to the same
		// subject: Receive reads them as one.
		if err := forEachParallel(ctx, keyStreamIndexes(rec.KeyStreams), 16, func(ctx context.Context, i int) error {
			return s.c.retryUntil(ctx, func(ctx context.Context) error {
				_, err := s.c.js.CreatePushConsumer(ctx, keyrouter.KeyStreamName(rec.TopicProject, rec.Topic, i),
					rec.consumerConfig(name, "", rec.KeyStartSeqs[i], sharedMaxAckPending))
				return err
			})
		}); err != nil {
			return err
		}
	}
	if rec.partitioned() {
		return forEachParallel(ctx, rec.partitionIndexes(), 16, func(ctx context.Context, i int) error {
			stream, _, _ := rec.partitionStream(i)
			return s.c.retryUntil(ctx, func(ctx context.Context) error {
				_, err := s.c.js.CreateConsumer(ctx, stream, rec.partitionConsumerConfig(max(s.c.cfg.leaseTTL, minPinTTL), i))
				return err
			})
		})
	}
	if rec.Ordering {
		// Key discovery starts right before the subscription's first message.
		if err := s.c.retryUntil(ctx, func(ctx context.Context) error {
			_, err := kv.Put(ctx, s.floorKey(rec.Epoch), []byte(strconv.FormatUint(rec.StartSeq-1, 10)))
			return err
		}); err != nil {
			return err
		}
		if !rec.partitioned() && rec.split() {
			// and in each key stream, right before its first.
			return forEachParallel(ctx, keyStreamIndexes(rec.KeyStreams), 16, func(ctx context.Context, i int) error {
				return s.c.retryUntil(ctx, func(ctx context.Context) error {
					_, err := kv.Put(ctx, keyStreamFloorKey(s.kvKey(), rec.Epoch, i), []byte(strconv.FormatUint(rec.KeyStartSeqs[i]-1, 10)))
					return err
				})
			})
		}
	}
	return nil
}

// load reads the subscription's record.
func (s *Subscription) load(ctx context.Context) (*subRecord, error) {
	if err := keyrouter.ValidateSubscriptionID(s.id); err != nil {
		return nil, err
	}
	kv, err := s.c.buckets(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, s.kvKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, s)
	}
	if err != nil {
		return nil, fmt.Errorf("subscription %s: %w", s, err)
	}
	var rec subRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("subscription %s: corrupt record: %w", s, err)
	}
	return &rec, nil
}

// Exists reports whether the subscription exists.
func (s *Subscription) Exists(ctx context.Context) (bool, error) {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	_, err := s.load(ctx)
	if errors.Is(err, ErrSubscriptionNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Config returns the subscription's configuration. It reads it in short
// attempts (retryAPI), for at most the client's API timeout: a request
// the cluster leaves unanswered (its leader killed while it was on its
// way) is asked again instead of waited for until ctx ends, which may be
// far off. (A Pub/Sub client's Acknowledge reaching a sidecar that does
// not receive the subscription reads its configuration with the call's
// deadline, a minute; Google's Go client sends no other ack meanwhile.)
func (s *Subscription) Config(ctx context.Context) (SubscriptionConfig, error) {
	var rec *subRecord
	topicDeleted := false
	err := s.c.retryAPI(ctx, func(ctx context.Context) (err error) {
		if rec, err = s.load(ctx); err != nil {
			return err
		}
		err = s.c.checkTopic(ctx, rec)
		topicDeleted = errors.Is(err, ErrTopicDeleted)
		if topicDeleted || errors.Is(err, ErrInvalidConfig) {
			return nil
		}
		return err
	})
	if err != nil {
		return SubscriptionConfig{}, err
	}
	return SubscriptionConfig{
		TopicDeleted:          topicDeleted,
		Topic:                 s.c.TopicInProject(rec.Topic, rec.TopicProject),
		AckDeadline:           rec.ackDeadline(),
		EnableMessageOrdering: rec.Ordering,
		Delivery:              rec.deliveryMode(),
		Partitions:            rec.Partitions,
		PartitionBuffer:       rec.PartitionBuffer,
		epoch:                 rec.Epoch,
		StartTime:             rec.StartTime,
		DeadLetterPolicy:      s.c.deadLetterPolicy(rec.DeadLetter),
		Labels:                rec.Labels,
		RetryPolicy:           rec.Retry.policy(),
		Filter:                rec.Filter,
		Detached:              rec.Detached,
		ServiceSettings:       rec.Service,
		ExactlyOnce:           rec.ExactlyOnce,
	}, nil
}

// Update changes the fields of u that are set and returns the new
// configuration. Running Receive calls apply a new dead-letter policy
// within about a second.
func (s *Subscription) Update(ctx context.Context, u SubscriptionUpdate) (SubscriptionConfig, error) {
	var deadLetter *deadLetterRecord
	if u.DeadLetterPolicy != nil {
		var err error
		if deadLetter, err = s.c.deadLetterRecord(u.DeadLetterPolicy); err != nil {
			return SubscriptionConfig{}, err
		}
	}
	retry, err := retryRecord(u.RetryPolicy)
	if err != nil {
		return SubscriptionConfig{}, err
	}
	if u.AckDeadline != 0 && (u.AckDeadline < minAckDeadline || u.AckDeadline > maxAckDeadline) {
		return SubscriptionConfig{}, fmt.Errorf("%w: ack deadline %v not in %v..%v", ErrInvalidConfig, u.AckDeadline, minAckDeadline, maxAckDeadline)
	}
	if len(u.ServiceSettings) > maxServiceSettings {
		return SubscriptionConfig{}, fmt.Errorf("%w: service settings of %d bytes, at most %d", ErrInvalidConfig, len(u.ServiceSettings), maxServiceSettings)
	}
	cctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	ackWaitChanged := false
	rec, err := s.modify(cctx, "update", func(rec *subRecord) bool {
		if u.DeadLetterPolicy != nil {
			rec.DeadLetter = deadLetter
		}
		if u.Labels != nil {
			rec.Labels = maps.Clone(u.Labels)
			if len(rec.Labels) == 0 {
				rec.Labels = nil
			}
		}
		if u.SetRetryPolicy {
			rec.Retry = retry
		}
		if u.ServiceSettings != nil {
			rec.Service = u.ServiceSettings
		}
		if u.ExactlyOnce != nil {
			rec.ExactlyOnce = *u.ExactlyOnce
		}
		ackWaitChanged = u.AckDeadline != 0 && u.AckDeadline.Milliseconds() != rec.AckDeadlineMS
		if u.AckDeadline != 0 {
			rec.AckDeadlineMS = u.AckDeadline.Milliseconds()
		}
		return true
	})
	if err != nil {
		return SubscriptionConfig{}, err
	}
	if ackWaitChanged {
		// Consumers created from now on read the record; those that exist
		// get the new AckWait here.
		if err := s.c.updateAckWait(cctx, rec); err != nil {
			return SubscriptionConfig{}, fmt.Errorf("update subscription %s: ack deadline of its consumers: %w", s, err)
		}
	}
	return s.Config(ctx)
}

// modify applies change to the subscription's record and stores it with a
// compare-and-set, again on the newer record when another writer got there
// first; change returns false when there is nothing to store. It returns
// the record as stored.
func (s *Subscription) modify(ctx context.Context, op string, change func(*subRecord) bool) (*subRecord, error) {
	kv, err := s.c.buckets(ctx)
	if err != nil {
		return nil, err
	}
	for {
		e, err := kv.Get(ctx, s.kvKey())
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, s)
		}
		if err != nil {
			return nil, fmt.Errorf("%s subscription %s: %w", op, s, err)
		}
		var rec subRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return nil, fmt.Errorf("subscription %s: corrupt record: %w", s, err)
		}
		if !change(&rec) {
			return &rec, nil
		}
		data, err := json.Marshal(&rec)
		if err != nil {
			return nil, err
		}
		_, err = kv.Update(ctx, s.kvKey(), data, e.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // changed meanwhile: change the newer record
		}
		if err != nil {
			return nil, fmt.Errorf("%s subscription %s: %w", op, s, err)
		}
		return &rec, nil
	}
}

// updateAckWait sets the AckWait of every consumer of the subscription to
// its ack deadline. A consumer removed meanwhile is skipped.
func (c *Client) updateAckWait(ctx context.Context, rec *subRecord) error {
	infos, err := c.topicConsumers(ctx, rec)
	if err != nil {
		return err
	}
	return forEachParallel(ctx, infos, 16, func(ctx context.Context, info *jetstream.ConsumerInfo) error {
		cfg := info.Config
		cfg.AckWait = rec.ackDeadline()
		var err error
		if cfg.DeliverSubject != "" {
			_, err = c.js.UpdatePushConsumer(ctx, info.Stream, cfg)
		} else {
			_, err = c.js.UpdateConsumer(ctx, info.Stream, cfg)
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDoesNotExist) {
			return nil
		}
		return err
	})
}

// Detach detaches the subscription from its topic, as Pub/Sub's
// DetachSubscription: its consumers and unacked messages are removed, it
// receives nothing more, and Receive on it returns ErrDetached. The
// subscription itself stays until it is deleted.
func (s *Subscription) Detach(ctx context.Context) error {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.modify(ctx, "detach", func(rec *subRecord) bool {
		if rec.Detached {
			return false
		}
		rec.Detached = true
		return true
	})
	if err != nil {
		return err
	}
	// Consumers go after the record says detached, so a receiver that
	// loses its consumer finds the reason.
	kv, err := s.c.buckets(ctx)
	if err != nil {
		return err
	}
	s.purgeFloors(ctx, kv, nil)
	if err := s.c.deleteConsumers(ctx, rec); err != nil {
		return fmt.Errorf("detach subscription %s: %w", s, err)
	}
	return nil
}

// keyStartSeqs returns where a subscription created now starts in each of
// the n key streams of t (none for a topic of one stream): after the last
// message, or at the first stored at or after since.
func (c *Client) keyStartSeqs(ctx context.Context, t *Topic, n int, since time.Time) ([]uint64, error) {
	indexes := keyStreamIndexes(n)
	if len(indexes) == 0 {
		return nil, nil
	}
	starts := make([]uint64, n)
	err := forEachParallel(ctx, indexes, 16, func(ctx context.Context, i int) error {
		name := keyrouter.KeyStreamName(t.project, t.id, i)
		return c.retryUntil(ctx, func(ctx context.Context) error {
			st, err := c.js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("%w: %s: key stream %d is missing", ErrTopicNotFound, t, i)
			}
			if err != nil {
				return err
			}
			starts[i] = st.CachedInfo().State.LastSeq + 1
			if !since.IsZero() {
				starts[i], err = t.firstSequenceSince(ctx, name, since, starts[i])
			}
			return err
		})
	})
	return starts, err
}

// firstSequenceSince returns the sequence of the first message of the
// topic's stream named stream stored at or after t, or next when there is
// none yet.
func (t *Topic) firstSequenceSince(ctx context.Context, name string, since time.Time, next uint64) (uint64, error) {
	stream, err := t.c.js.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("topic %s: %w", t, err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       true,
		InactiveThreshold: 10 * time.Second, // in case the delete below fails
	})
	if err != nil {
		return 0, fmt.Errorf("find the first message of %s since %v: %w", t, since, err)
	}
	defer func() { _ = stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return 0, fmt.Errorf("find the first message of %s since %v: %w", t, since, err)
	}
	for m := range batch.Messages() {
		if meta, err := m.Metadata(); err == nil {
			return min(meta.Sequence.Stream, next), nil
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return 0, fmt.Errorf("find the first message of %s since %v: %w", t, since, err)
	}
	return next, nil
}

// Subscriptions lists the project's subscriptions, sorted by id.
func (c *Client) Subscriptions(ctx context.Context) ([]*Subscription, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	kv, err := c.buckets(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, keyrouter.KVProjectFilter(c.project))
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	var out []*Subscription
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list subscriptions: %w", err)
		}
		var rec subRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Project != c.project {
			continue
		}
		out = append(out, c.Subscription(rec.ID))
	}
	sortByID(out, func(s *Subscription) string { return s.id })
	return out, nil
}

// Delete deletes the subscription and its consumers; unacked messages are
// dropped with it. Receive calls on it end with ErrSubscriptionNotFound.
func (s *Subscription) Delete(ctx context.Context) error {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.load(ctx)
	if err != nil {
		return err
	}
	kv, err := s.c.buckets(ctx)
	if err != nil {
		return err
	}
	// Registry first: a half-deleted subscription is one that no longer
	// exists, with consumers left to remove, never the other way round.
	if err := kv.Delete(ctx, s.kvKey()); err != nil {
		return fmt.Errorf("delete subscription %s: %w", s, err)
	}
	s.purgeFloors(ctx, kv, nil)
	if err := s.c.deleteConsumers(ctx, rec); err != nil {
		return fmt.Errorf("delete subscription %s: %w", s, err)
	}
	if err := s.purgeState(ctx); err != nil {
		return fmt.Errorf("delete subscription %s: state: %w", s, err)
	}
	return nil
}

// LayerState returns the key-value bucket where a layer built on the
// library keeps state of its own for the subscription (package didcomm
// keeps its gap tracking there), and the key prefix that belongs to it.
// Keys under prefix+"." are the caller's, to read and write as it likes;
// a layer should add a name of its own (prefix+".didcomm."...). Delete
// removes them with the subscription, and the prefix names this
// incarnation of the subscription, so a subscription deleted and created
// again with the same id starts with no state. It creates the bucket on
// first use. Without a deadline in ctx the client's API timeout applies;
// it returns ErrSubscriptionNotFound if the subscription does not exist.
func (s *Subscription) LayerState(ctx context.Context) (kv jetstream.KeyValue, prefix string, err error) {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.load(ctx)
	if err != nil {
		return nil, "", err
	}
	if kv, err = s.c.stateBucket(ctx); err != nil {
		return nil, "", err
	}
	return kv, s.kvKey() + "." + strconv.FormatInt(rec.Created.UnixNano(), 10), nil
}

// stateBucket opens the bucket of per-subscription state (JO_STATE),
// creating it on first use: the layers' state and the partitions' owner
// records.
func (c *Client) stateBucket(ctx context.Context) (jetstream.KeyValue, error) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.stateKV != nil {
		return c.stateKV, nil
	}
	kv, err := c.openBucket(ctx, jetstream.KeyValueConfig{
		Bucket:      stateBucket,
		Description: "jetorder per-subscription state: layers above the adapter, partition owners",
		Storage:     jetstream.FileStorage,
		Replicas:    c.cfg.replicas,
	})
	if err != nil {
		return nil, err
	}
	c.stateKV = kv
	return kv, nil
}

// purgeState removes every state key of the subscription, of every
// incarnation, in one purge of the state bucket's stream.
func (s *Subscription) purgeState(ctx context.Context) error {
	stream, err := s.c.js.Stream(ctx, "KV_"+stateBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // no layer ever kept state
	}
	if err != nil {
		return err
	}
	return stream.Purge(ctx, jetstream.WithPurgeSubject("$KV."+stateBucket+"."+s.kvKey()+".>"))
}

// deleteConsumers removes every consumer of the subscription from its
// topic's stream. A missing stream means there is nothing to remove.
func (c *Client) deleteConsumers(ctx context.Context, rec *subRecord) error {
	mine, err := c.topicConsumers(ctx, rec)
	if err != nil {
		return err
	}
	return forEachParallel(ctx, mine, 16, func(ctx context.Context, info *jetstream.ConsumerInfo) error {
		err := c.js.DeleteConsumer(ctx, info.Stream, info.Name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		return err
	})
}

// topicConsumers lists the consumers of the subscription on every stream
// of its topic, of every epoch. A missing stream has none.
func (c *Client) topicConsumers(ctx context.Context, rec *subRecord) ([]*jetstream.ConsumerInfo, error) {
	var all []*jetstream.ConsumerInfo
	for _, name := range rec.streams() {
		stream, err := c.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		infos, err := c.consumerInfos(ctx, stream, rec)
		if err != nil {
			return nil, err
		}
		all = append(all, infos...)
	}
	return all, nil
}

// consumerNames lists the consumers of the subscription on its stream, of
// every epoch: they are the consumers whose description names it.
func (c *Client) consumerNames(ctx context.Context, stream jetstream.Stream, rec *subRecord) ([]string, error) {
	infos, err := c.consumerInfos(ctx, stream, rec)
	names := make([]string, len(infos))
	for i, info := range infos {
		names[i] = info.Name
	}
	return names, err
}

func (c *Client) consumerInfos(ctx context.Context, stream jetstream.Stream, rec *subRecord) ([]*jetstream.ConsumerInfo, error) {
	desc := rec.consumerDescription()
	list := stream.ListConsumers(ctx)
	var mine []*jetstream.ConsumerInfo
	for info := range list.Info() {
		d := info.Config.Description
		if d == desc || strings.HasPrefix(d, desc+" ") {
			mine = append(mine, info)
		}
	}
	return mine, list.Err()
}
