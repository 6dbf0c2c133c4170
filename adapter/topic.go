package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// Metadata keys the adapter writes on the streams it creates.
const (
	metaProject  = "jetorder.project"
	metaTopic    = "jetorder.topic"
	metaCreation = "jetorder.creation"
	// metaLayout is the subject layout's version (keyrouter's doc). Version
	// 2 put the key's slot into keyed subjects; streams without it hold
	// version 1 subjects, which receivers cannot read.
	metaLayout    = "jetorder.layout"
	subjectLayout = "2"
	// metaLabels holds the topic's labels as a JSON object, and
	// metaSettings a layer above's settings (TopicConfig.ServiceSettings).
	metaLabels   = "jetorder.labels"
	metaSettings = "jetorder.settings"
	// metaKeyStreams, on a topic's stream, is how many key streams its
	// keyed messages are split over (none: 1, the topic's stream holds
	// them); metaKeyStream, on a key stream, is "i/n".
	metaKeyStreams = "jetorder.key-streams"
	metaKeyStream  = "jetorder.key-stream"
	// metaMoved, on a topic's stream, is when the topic moved onto key
	// streams (Topic.MoveToKeyStreams): the stream may hold keyed messages
	// from before.
	metaMoved = "jetorder.moved-onto-key-streams"
)

// TopicConfig is a topic's configuration.
type TopicConfig struct {
	// RetentionDuration bounds how long messages are kept; 0 keeps them
	// until MaxBytes is reached (or forever).
	RetentionDuration time.Duration
	// MaxBytes bounds the topic's storage; the oldest messages go first.
	// 0 means no limit.
	MaxBytes int64
	// Labels are the application's own key/value pairs.
	Labels map[string]string
	// ServiceSettings are a layer above's settings, kept with the topic
	// (the sidecar keeps the Pub/Sub settings the library does not act on,
	// such as a schema), at most 16 KiB.
	ServiceSettings string
	// KeyStreams splits the keyed messages over this many streams of
	// their own (a power of two up to 16; 0 or 1: one stream holds every
	// message), by the slots of their keys. Partition consumers then read
	// a stream each without a subject filter, which the server does
	// faster. Set at creation, or later on a topic of one stream by
	// Topic.MoveToKeyStreams; fixed once over 1. A key stream's messages
	// are numbered in a range of their own (keyrouter.KeyStreamSeqBits),
	// so a message's StreamSequence is still unique in the topic, but
	// only a key's messages, not the whole topic's, are in sequence
	// order. MaxBytes is shared out evenly over the topic's streams.
	KeyStreams int
}

// TopicUpdate lists the fields Topic.Update changes; nil fields stay.
type TopicUpdate struct {
	// RetentionDuration replaces the retention; 0 keeps messages until
	// MaxBytes is reached.
	RetentionDuration *time.Duration
	// Labels replace the labels; an empty, non-nil map removes them.
	Labels map[string]string
	// ServiceSettings replace the layer-above settings.
	ServiceSettings *string
}

const maxTopicSettings = 16 << 10

// topicMetadata returns the stream metadata that carries cfg's labels and
// settings, added to base.
func topicMetadata(base map[string]string, labels map[string]string, settings string) (map[string]string, error) {
	md := maps.Clone(base)
	delete(md, metaLabels)
	delete(md, metaSettings)
	if len(labels) > 0 {
		b, err := json.Marshal(labels)
		if err != nil {
			return nil, err
		}
		md[metaLabels] = string(b)
	}
	if len(settings) > maxTopicSettings {
		return nil, fmt.Errorf("%w: topic settings of %d bytes, at most %d", ErrInvalidConfig, len(settings), maxTopicSettings)
	}
	if settings != "" {
		md[metaSettings] = settings
	}
	return md, nil
}

// Topic is a handle on a topic. Getting one does no I/O; use Exists to check
// it. A Topic is safe for concurrent use.
type Topic struct {
	c       *Client
	project string
	id      string
	stream  string

	// PublishSettings tune this handle's publishing; set them before the
	// first Publish.
	PublishSettings PublishSettings

	pubOnce sync.Once
	pub     *publisher
}

// PublishSettings tune a Topic handle's publishing. Each handle is one RSB
// publisher: its messages carry its sender id and consecutive sequence
// numbers. Zero values mean the defaults.
type PublishSettings struct {
	// SenderID identifies the publisher; the zero UUID means a random one,
	// chosen at the first Publish.
	SenderID uuid.UUID
	// FirstSequence is the sequence number of the first message: 0 for a
	// new publisher, or where a restarted one left off. Numbers wrap to 0
	// after 4294967295.
	FirstSequence uint32

	// A key's messages are sent as a batch once CountThreshold messages or
	// ByteThreshold bytes are waiting, or DelayThreshold after the first
	// (defaults 100, 1 MiB, 10ms). Each key, and the unkeyed messages, have
	// their own batch.
	DelayThreshold time.Duration
	CountThreshold int
	ByteThreshold  int
	// Timeout bounds how long a message is retried after transient
	// failures before it fails for good (default 60s, at most 90s so that
	// retries stay inside the duplicate window).
	Timeout time.Duration
	// FlowControlSettings bound what is outstanding between Publish and
	// the results.
	FlowControlSettings FlowControlSettings
}

// FlowControlSettings bound a publisher's outstanding messages. A negative
// limit means none; zero means the default (10,000 messages, 64 MiB).
type FlowControlSettings struct {
	MaxOutstandingMessages int
	MaxOutstandingBytes    int
	LimitExceededBehavior  LimitExceededBehavior
}

func (t *Topic) publisher() *publisher {
	t.pubOnce.Do(func() {
		t.pub = newPublisher(t, t.PublishSettings)
		// Client.Close stops the handles it knows; one first used after
		// Close is stopped from the start.
		if !t.c.trackTopic(t) {
			t.pub.stop() // nothing is queued yet: it only refuses
		}
	})
	return t.pub
}

// Topic returns a handle on the topic id of the client's project.
func (c *Client) Topic(id string) *Topic { return c.TopicInProject(id, c.project) }

// TopicInProject returns a handle on a topic of another project, for
// subscriptions that receive across projects.
func (c *Client) TopicInProject(id, project string) *Topic {
	return &Topic{c: c, project: project, id: id, stream: keyrouter.StreamName(project, id)}
}

// ID is the topic id.
func (t *Topic) ID() string { return t.id }

// String is the topic's full name, projects/P/topics/T.
func (t *Topic) String() string { return "projects/" + t.project + "/topics/" + t.id }

// CreateTopic creates a topic with default configuration.
func (c *Client) CreateTopic(ctx context.Context, id string) (*Topic, error) {
	return c.CreateTopicWithConfig(ctx, id, nil)
}

// CreateTopicWithConfig creates a topic. It returns ErrTopicExists if the
// topic exists, and an ErrInvalidTopicID error for a bad id.
func (c *Client) CreateTopicWithConfig(ctx context.Context, id string, cfg *TopicConfig) (*Topic, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	if err := keyrouter.ValidateTopicID(id); err != nil {
		return nil, err
	}
	if err := c.ensureLayout(ctx); err != nil {
		return nil, err
	}
	if err := keyrouter.ValidateProjectID(c.project); err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &TopicConfig{}
	}
	if cfg.RetentionDuration < 0 || cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("%w: negative retention", ErrInvalidConfig)
	}
	keyStreams := max(cfg.KeyStreams, 1)
	if cfg.KeyStreams < 0 || !keyrouter.ValidKeyStreams(keyStreams) {
		return nil, fmt.Errorf("%w: key streams %d: a power of two up to %d", ErrInvalidConfig, cfg.KeyStreams, keyrouter.MaxKeyStreams)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	t := c.Topic(id)
	maxBytes := cfg.MaxBytes
	switch {
	case maxBytes == 0:
		maxBytes = -1
	case keyStreams > 1:
		maxBytes = max(maxBytes/int64(keyStreams+1), 1)
	}
	base := map[string]string{metaProject: c.project, metaTopic: id, metaCreation: uuid.NewString(), metaLayout: subjectLayout}
	subjects := []string{keyrouter.TopicSubjects(c.project, id)}
	if keyStreams > 1 {
		base[metaKeyStreams] = strconv.Itoa(keyStreams)
		subjects = []string{keyrouter.UnkeyedSubject(c.project, id)}
	}
	md, err := topicMetadata(base, cfg.Labels, cfg.ServiceSettings)
	if err != nil {
		return nil, err
	}
	scfg := jetstream.StreamConfig{
		Name:        t.stream,
		Description: t.String(),
		Subjects:    subjects,
		// Limits, never Interest or WorkQueue: per-key consumers are created
		// after their messages arrive, and their filters overlap the
		// subscription's other consumers.
		Retention:    jetstream.LimitsPolicy,
		Storage:      jetstream.FileStorage,
		Replicas:     c.cfg.replicas,
		MaxAge:       cfg.RetentionDuration,
		MaxBytes:     maxBytes,
		MaxConsumers: -1,
		Discard:      jetstream.DiscardOld,
		Duplicates:   2 * time.Minute,
		AllowDirect:  true,
		// A unique creation id makes the config differ from any existing
		// stream's, so JetStream refuses a second create instead of treating
		// it as an idempotent repeat.
		Metadata: md,
	}
	// In attempts until ctx ends (retryUntil): a cluster may drop the
	// request without an answer. A stream of the name that carries this
	// create's id after an attempt that went unanswered is its own.
	unanswered := false
	err = c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := c.js.CreateStream(ctx, scfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && unanswered {
			if st, ierr := c.js.Stream(ctx, t.stream); ierr == nil && st.CachedInfo().Config.Metadata[metaCreation] == md[metaCreation] {
				return nil
			}
		}
		unanswered = unanswered || transient(err)
		return err
	})
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return nil, fmt.Errorf("%w: %s", ErrTopicExists, t)
	case err != nil:
		return nil, fmt.Errorf("create topic %s: %w", t, err)
	}
	// The topic's stream claims the name; its key streams follow. Until
	// they exist, keyed publishes fail as to a topic that does not. Should
	// one fail, the topic's stream goes again (with a context of its own:
	// ctx may be the one that ended), so that the id is free for another
	// create instead of naming a topic without its key streams; key
	// streams left behind are replaced by the next create.
	if err := forEachParallel(ctx, keyStreamIndexes(keyStreams), 16, func(ctx context.Context, i int) error {
		return c.createKeyStream(ctx, t, scfg, i, keyStreams)
	}); err != nil {
		undo, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.apiTimeout)
		defer cancel()
		_ = c.js.DeleteStream(undo, t.stream)
		return nil, fmt.Errorf("create topic %s: %w", t, err)
	}
	return t, nil
}

// keyStreamIndexes lists the key streams of a topic split over n: none for
// a topic whose own stream holds its keyed messages.
func keyStreamIndexes(n int) []int {
	if n <= 1 {
		return nil
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// createKeyStream creates key stream i of n of topic t, whose own stream's
// configuration is primary. A stream of the name left by an earlier topic
// of the id (a delete that failed half-way) is replaced.
func (c *Client) createKeyStream(ctx context.Context, t *Topic, primary jetstream.StreamConfig, i, n int) error {
	cfg := primary
	cfg.Name = keyrouter.KeyStreamName(t.project, t.id, i)
	cfg.Description = fmt.Sprintf("%s, keyed messages, key stream %d of %d", t, i, n)
	cfg.Subjects = []string{keyrouter.PartitionFilter(t.project, t.id, n, i)}
	cfg.FirstSeq = keyrouter.KeyStreamFirstSeq(i)
	cfg.Metadata = map[string]string{metaCreation: primary.Metadata[metaCreation], metaLayout: subjectLayout, metaKeyStream: fmt.Sprintf("%d/%d", i, n)}
	return c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := c.js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, ierr := c.js.Stream(ctx, cfg.Name)
			switch {
			case ierr != nil:
				return ierr
			case st.CachedInfo().Config.Metadata[metaCreation] == cfg.Metadata[metaCreation]:
				return nil // an earlier attempt's, unanswered
			}
			if derr := c.js.DeleteStream(ctx, cfg.Name); derr != nil && !errors.Is(derr, jetstream.ErrStreamNotFound) {
				return derr
			}
			_, err = c.js.CreateStream(ctx, cfg)
		}
		return err
	})
}

// keyStreams is how many key streams the topic whose stream info is info
// has: 1 when its own stream holds its keyed messages.
func keyStreams(info *jetstream.StreamInfo) int {
	n, err := strconv.Atoi(info.Config.Metadata[metaKeyStreams])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// topicStreams names every stream of a topic split over n key streams: its
// own first.
func topicStreams(project, topic string, n int) []string {
	out := []string{keyrouter.StreamName(project, topic)}
	for _, i := range keyStreamIndexes(n) {
		out = append(out, keyrouter.KeyStreamName(project, topic, i))
	}
	return out
}

// Exists reports whether the topic exists.
func (t *Topic) Exists(ctx context.Context) (bool, error) {
	_, err := t.info(ctx)
	if errors.Is(err, ErrTopicNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Config returns the topic's configuration, or ErrTopicNotFound.
func (t *Topic) Config(ctx context.Context) (TopicConfig, error) {
	info, err := t.info(ctx)
	if err != nil {
		return TopicConfig{}, err
	}
	return topicConfig(info), nil
}

func topicConfig(info *jetstream.StreamInfo) TopicConfig {
	cfg := TopicConfig{RetentionDuration: info.Config.MaxAge, ServiceSettings: info.Config.Metadata[metaSettings], KeyStreams: keyStreams(info)}
	if info.Config.MaxBytes > 0 {
		cfg.MaxBytes = info.Config.MaxBytes
		if cfg.KeyStreams > 1 {
			cfg.MaxBytes *= int64(cfg.KeyStreams + 1)
		}
	}
	if v := info.Config.Metadata[metaLabels]; v != "" {
		_ = json.Unmarshal([]byte(v), &cfg.Labels) // written by topicMetadata
	}
	return cfg
}

// Update changes the fields of u that are set and returns the new
// configuration, or ErrTopicNotFound.
func (t *Topic) Update(ctx context.Context, u TopicUpdate) (TopicConfig, error) {
	if u.RetentionDuration != nil && *u.RetentionDuration < 0 {
		return TopicConfig{}, fmt.Errorf("%w: negative retention", ErrInvalidConfig)
	}
	ctx, cancel := t.c.withTimeout(ctx)
	defer cancel()
	if err := t.c.ensureLayout(ctx); err != nil {
		return TopicConfig{}, err
	}
	info, err := t.info(ctx)
	if err != nil {
		return TopicConfig{}, err
	}
	scfg := info.Config
	cur := topicConfig(info)
	labels, settings := cur.Labels, cur.ServiceSettings
	if u.Labels != nil {
		labels = u.Labels
	}
	if u.ServiceSettings != nil {
		settings = *u.ServiceSettings
	}
	if scfg.Metadata, err = topicMetadata(scfg.Metadata, labels, settings); err != nil {
		return TopicConfig{}, err
	}
	if u.RetentionDuration != nil {
		scfg.MaxAge = *u.RetentionDuration
	}
	// The key streams first: the topic's stream says the retention the
	// topic has once they all have it.
	if u.RetentionDuration != nil {
		err := forEachParallel(ctx, keyStreamIndexes(keyStreams(info)), 16, func(ctx context.Context, i int) error {
			st, err := t.c.js.Stream(ctx, keyrouter.KeyStreamName(t.project, t.id, i))
			if err != nil {
				return err
			}
			kcfg := st.CachedInfo().Config
			kcfg.MaxAge = *u.RetentionDuration
			_, err = t.c.js.UpdateStream(ctx, kcfg)
			return err
		})
		if err != nil {
			return TopicConfig{}, fmt.Errorf("update topic %s: %w", t, err)
		}
	}
	updated, err := t.c.js.UpdateStream(ctx, scfg)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return TopicConfig{}, fmt.Errorf("%w: %s", ErrTopicNotFound, t)
	}
	if err != nil {
		return TopicConfig{}, fmt.Errorf("update topic %s: %w", t, err)
	}
	return topicConfig(updated.CachedInfo()), nil
}

func (t *Topic) info(ctx context.Context) (*jetstream.StreamInfo, error) {
	if err := t.c.checkOpen(); err != nil {
		return nil, err
	}
	if err := keyrouter.ValidateProjectID(t.project); err != nil {
		return nil, err
	}
	if err := keyrouter.ValidateTopicID(t.id); err != nil {
		return nil, err
	}
	ctx, cancel := t.c.withTimeout(ctx)
	defer cancel()
	s, err := t.c.js.Stream(ctx, t.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, t)
	}
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", t, err)
	}
	return s.CachedInfo(), nil
}

// Delete deletes the topic and every message in it. Subscriptions attached
// to it stay, detached: Receive on them returns ErrTopicDeleted.
func (t *Topic) Delete(ctx context.Context) error {
	if err := t.c.checkOpen(); err != nil {
		return err
	}
	if err := keyrouter.ValidateTopicID(t.id); err != nil {
		return err
	}
	ctx, cancel := t.c.withTimeout(ctx)
	defer cancel()
	if err := t.c.ensureLayout(ctx); err != nil {
		return err
	}
	info, err := t.info(ctx)
	if err != nil {
		return err
	}
	// The topic's stream first: a topic half deleted is one that does not
	// exist, its key streams left for the next create of the id.
	err = t.c.js.DeleteStream(ctx, t.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: %s", ErrTopicNotFound, t)
	}
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", t, err)
	}
	err = forEachParallel(ctx, keyStreamIndexes(keyStreams(info)), 16, func(ctx context.Context, i int) error {
		err := t.c.js.DeleteStream(ctx, keyrouter.KeyStreamName(t.project, t.id, i))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("delete topic %s: key streams: %w", t, err)
	}
	return nil
}

// Topics lists the project's topics, sorted by id.
func (c *Client) Topics(ctx context.Context) ([]*Topic, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	lister := c.js.ListStreams(ctx, jetstream.WithStreamListSubject(keyrouter.ProjectSubjects(c.project)))
	var out []*Topic
	for info := range lister.Info() {
		if info.Config.Metadata[metaProject] != c.project {
			continue
		}
		out = append(out, c.Topic(info.Config.Metadata[metaTopic]))
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	sortByID(out, func(t *Topic) string { return t.id })
	return out, nil
}

// PublishResult is the outcome of a Publish. Get blocks until it is known.
type PublishResult struct {
	done chan struct{}
	id   string
	err  error
}

// Ready is closed when the result is known.
func (r *PublishResult) Ready() <-chan struct{} { return r.done }

// Get waits for the publish to finish and returns the message id, or the
// error; it returns ctx.Err() if ctx ends first.
func (r *PublishResult) Get(ctx context.Context) (string, error) {
	select {
	case <-r.done:
		return r.id, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Publish queues msg for the topic and returns at once; the result's Get
// yields the message id once the message is stored, or the error. Messages
// with the same OrderingKey are stored in the order of their Publish calls.
// An empty OrderingKey publishes without a key. ctx bounds only the wait
// for flow control. Publish does not modify msg.
//
// When a message with an ordering key fails, whether refused here (invalid
// attributes, too large, flow control, ctx ended) or by the server, its key
// is paused: the key's queued and later messages fail with
// ErrPublishingPaused until ResumePublish, so no later message of the key is
// stored in its place. Other keys carry on.
func (t *Topic) Publish(ctx context.Context, msg *Message) *PublishResult {
	if err := t.c.checkOpen(); err != nil {
		return resolved("", err)
	}
	m, err := t.encode(msg)
	if err != nil {
		if msg == nil {
			return resolved("", err)
		}
		return t.publisher().refuse(msg.OrderingKey, err)
	}
	return t.publisher().add(ctx, msg.OrderingKey, m)
}

// Validate checks msg as Publish does before queueing it (ordering key,
// attributes, headers, size), without publishing it: nil means Publish
// would not refuse it. A layer that takes several messages in one request
// can check them all first, so that a request with one bad message stores
// none. It does not modify msg, does not block, and is safe for concurrent
// use.
func (t *Topic) Validate(msg *Message) error {
	_, err := t.encode(msg)
	return err
}

// Refuse fails a message that a layer built on the topic could not turn
// into a Message (an event it could not encode, say), exactly as Publish
// fails one it refuses: the result holds err, and a valid orderingKey is
// paused as Publish pauses it, so that the key's later messages are not
// stored in the refused one's place (ResumePublish resumes it). An empty
// orderingKey pauses nothing. It does not block, and is safe for
// concurrent use.
func (t *Topic) Refuse(orderingKey string, err error) *PublishResult {
	return t.publisher().refuse(orderingKey, err)
}

// Flush sends every queued message now and waits until each is stored or
// has failed.
func (t *Topic) Flush() { t.publisher().flush() }

// Stop flushes and refuses later publishes with ErrTopicStopped.
// Client.Close stops every handle of the client that has published.
func (t *Topic) Stop() {
	t.publisher().stop()
	t.c.untrackTopic(weak.Make(t))
}

// ResumePublish resumes publishing for an ordering key paused by a failure.
func (t *Topic) ResumePublish(key string) { t.publisher().resume(key) }

func (t *Topic) publishError(err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("publish to %s: %w", t, ErrTopicNotFound)
	}
	return fmt.Errorf("publish to %s: %w", t, err)
}

// validate checks msg and returns its subject.
func (t *Topic) validate(msg *Message) (string, error) {
	if msg == nil {
		return "", fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if err := keyrouter.ValidateTopicID(t.id); err != nil {
		return "", err
	}
	if err := keyrouter.ValidateProjectID(t.project); err != nil {
		return "", err
	}
	var subject string
	if msg.OrderingKey == "" {
		subject = keyrouter.UnkeyedSubject(t.project, t.id)
	} else {
		if err := keyrouter.ValidateOrderingKey(msg.OrderingKey); err != nil {
			return "", err
		}
		subject = keyrouter.KeyedSubject(t.project, t.id, msg.OrderingKey)
	}
	if err := validateAttributes(msg.Attributes); err != nil {
		return "", err
	}
	if err := validateMetadata(msg); err != nil {
		return "", err
	}
	if err := validateHeader(msg.Header); err != nil {
		return "", err
	}
	return subject, nil
}

// identityReserve is room for the headers the publisher adds when it
// queues a message (message id, sender id, sequence number, send time):
// about 200 bytes.
const identityReserve = 512

// checkSize refuses a message the server would refuse: its data and
// headers, with room for the identity headers, over max_payload. Checked
// before queueing, a too-large message fails alone instead of at send
// time, where it would pause its key.
func (t *Topic) checkSize(m *nats.Msg) error {
	max := t.c.nc.MaxPayload()
	if max <= 0 {
		return nil
	}
	size := int64(len(m.Data) + headerSize(m.Header) + identityReserve)
	if size > max {
		return fmt.Errorf("%w: message of %d bytes (data %d, headers %d) exceeds the server's limit of %d bytes",
			ErrInvalidMessage, size-identityReserve, len(m.Data), size-identityReserve-int64(len(m.Data)), max-identityReserve)
	}
	return nil
}

// headerSize is the length of h in the NATS wire format.
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for name, vals := range h {
		for _, v := range vals {
			n += len(name) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// encode validates msg and turns it into a NATS message on the right
// subject; the publisher adds the identity headers when it queues it.
func (t *Topic) encode(msg *Message) (*nats.Msg, error) {
	subject, err := t.validate(msg)
	if err != nil {
		return nil, err
	}
	created := msg.CreateTime
	if created.IsZero() {
		created = time.Now()
	}
	// Sized for every header the message gets, the publisher's too: a
	// map that grows as they are added showed in allocation profiles.
	n := len(msg.Header) + len(msg.Attributes) + len(msg.UserTimes) + len(msg.UserInfos) + 7
	m := &nats.Msg{Subject: subject, Data: msg.Data, Header: make(nats.Header, n)}
	for name, vals := range msg.Header {
		m.Header[name] = slices.Clone(vals)
	}
	writeHeaders(m.Header, msg)
	writeMetadata(m.Header, msg, created)
	if err := t.checkSize(m); err != nil {
		return nil, err
	}
	return m, nil
}
