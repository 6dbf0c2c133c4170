// Package pubsubapi serves the Google Pub/Sub v1 gRPC services Publisher
// and Subscriber over the adapter, so Google's client libraries work
// unchanged against the sidecar through PUBSUB_EMULATOR_HOST. The
// SchemaService is internal/schemaapi's; Publish validates against it
// (Config.Schemas).
//
// Each subscription that has StreamingPull streams, Pull calls or a push
// endpoint attached runs one adapter Receive in this process (a
// dispatcher, dispatcher.go). Its handler hands each message to a stream,
// a Pull call or the pusher as a lease, held until the client acks, nacks
// (ModifyAckDeadline 0) or lets it expire. Ordered subscriptions are
// strict by default: a key's next message waits until the previous one is
// acked, so per-key order holds for every client. Pipelined ordering
// (Config.Ordering, label jetorder-ordering) sends a key's messages to one
// stream without waiting, as the service does.
//
// Also here: push subscriptions (pushsubs.go, over internal/push), snapshots
// and Seek (snapshots.go), DIDComm tracking on delivery (didcomm.go), and the
// status the sidecar reports on /v1/status and /metrics (status.go).
package pubsubapi

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/internal/schemaapi"
	"github.com/jetorder/jetorder/keyrouter"
)

// Config tunes a Server. Zero values mean the defaults.
type Config struct {
	// MaxOutstandingMessages bounds the messages one subscription holds in
	// this process: handed to clients or waiting for one. Default 1000.
	MaxOutstandingMessages int
	// MaxStreams bounds the open StreamingPull streams. Default 1000.
	MaxStreams int
	// IdleStop is how long a subscription's dispatcher keeps receiving with
	// no stream or Pull call attached and no lease outstanding. Default 30s.
	IdleStop time.Duration
	// PullWait bounds how long a Pull call waits for a first message.
	// Default 5s.
	PullWait time.Duration
	// Delivery is the delivery mode of ordered subscriptions created
	// without a jetorder-delivery label. Default adapter.DefaultDelivery.
	Delivery adapter.DeliveryMode
	// KeyStreams is the key stream count (adapter.TopicConfig.KeyStreams)
	// of topics created without a jetorder-key-streams label; 0 means 1.
	KeyStreams int
	// Ordering is when a key's next message goes to a client on ordered
	// subscriptions without a jetorder-ordering label. Default
	// StrictOrdering.
	Ordering Ordering
	Logger   *slog.Logger
	// Replicas of the buckets the server creates (JO_SNAPSHOTS). Default 1.
	Replicas int
	// Schemas is the SchemaService, which checks topics' schema settings and
	// validates the messages published to topics with them. Default: a
	// schemaapi.Server over the broker's connection.
	Schemas *schemaapi.Server
	// PushAllow says which push endpoints subscriptions may name
	// (--push-allow); nil disables push subscriptions.
	PushAllow *push.AllowList
	// PushMaxOutstanding bounds the push requests in flight per
	// subscription, for ordering keys and for unkeyed messages each.
	// Default DefaultPushMaxOutstanding.
	PushMaxOutstanding int
	// EmbeddedNATS says that the broker's connection is to a nats-server
	// in this process, for the status.
	EmbeddedNATS bool
	// Sync and SyncRisk are what the status says of the server's sync
	// policy (status.NATS).
	Sync     string
	SyncRisk bool
	// ExpirationCheck is how often the server looks for subscriptions
	// whose expiration policy has run out (expiration.go). Default
	// DefaultExpirationCheck.
	ExpirationCheck time.Duration
	// Now is the clock of subscription expiration; default time.Now.
	// Tests move it on to expire subscriptions without waiting a day.
	Now func() time.Time
}

// Server implements pb.PublisherServer and pb.SubscriberServer.
type Server struct {
	pb.UnimplementedPublisherServer
	pb.UnimplementedSubscriberServer

	b      *broker.Broker
	cfg    Config
	log    *slog.Logger
	ackKey []byte // authenticates ack ids; shared by the sidecars of a NATS server (ackid.go)
	// ackMACs pools HMACs keyed with ackKey, which is set before the
	// server serves and never changes.
	ackMACs sync.Pool

	epoch uint64 // this process's, in its ack ids
	stale staleAcks

	topicSchemas topicSchemaCache // for Publish

	partitions receiveGauges // of every subscription's Receive
	snapshots  snapshotStore
	pusher     *pushRunner // nil: push subscriptions are disabled
	activity   *activity   // nil without a connection: nothing expires

	// For the status page and the metrics (status.go).
	started  time.Time
	observer *observer
	recent   recentCounts

	mu          sync.Mutex
	dispatchers map[string]*dispatcher // projects/P/subscriptions/S
	streams     int
	closed      bool
	wg          sync.WaitGroup // dispatchers' Receive calls
}

// New returns a server over b.
func New(b *broker.Broker, cfg Config) *Server {
	if cfg.MaxOutstandingMessages <= 0 {
		cfg.MaxOutstandingMessages = 1000
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 1000
	}
	if cfg.IdleStop <= 0 {
		cfg.IdleStop = 30 * time.Second
	}
	if cfg.PullWait <= 0 {
		cfg.PullWait = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PushMaxOutstanding <= 0 {
		cfg.PushMaxOutstanding = DefaultPushMaxOutstanding
	}
	if cfg.Schemas == nil {
		cfg.Schemas = schemaapi.New(b.Conn(), 1, cfg.Logger)
	}
	if cfg.ExpirationCheck <= 0 {
		cfg.ExpirationCheck = DefaultExpirationCheck
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{b: b, cfg: cfg, log: cfg.Logger, epoch: newEpoch(), started: time.Now(), dispatchers: make(map[string]*dispatcher)}
	s.partitions.deadLettered = func(sub string) {
		b.Metrics.Subscription(sub).DeadLettered.Inc()
		s.recent.add(sub, recentDeadLettered)
	}
	s.observer = newObserver(s)
	var js jetstream.JetStream // nil without a connection: the snapshot RPCs fail
	if nc := b.Conn(); nc != nil {
		js, _ = jetstream.New(nc)
	}
	if js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		key, err := loadAckKey(ctx, js, cfg.Replicas)
		cancel()
		if err != nil {
			s.log.Warn("ack ids: no shared key; ack ids of this process will not be recognised after a restart", "err", err)
		}
		s.ackKey = key
	}
	if s.ackKey == nil {
		s.ackKey = make([]byte, 32)
		_, _ = rand.Read(s.ackKey)
	}
	s.snapshots = newSnapshotStore(js, cfg.Replicas)
	if js != nil {
		s.activity = newActivity(s, js, cfg.Replicas, cfg.Now)
		s.activity.start(cfg.ExpirationCheck)
	}
	if js != nil && cfg.PushAllow != nil {
		if r, err := newPushRunner(s, js, cfg.PushAllow, cfg.PushMaxOutstanding); err != nil {
			s.log.Error("push subscriptions disabled", "err", err)
		} else {
			s.pusher = r
			r.start()
		}
	}
	return s
}

// Register adds the Publisher and Subscriber services to g.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterPublisherServer(g, s)
	pb.RegisterSubscriberServer(g, s)
}

// Close stops every dispatcher: messages waiting for a client are handed
// back at once, leases still out are handed back too (they are redelivered
// to whoever receives next), and Close waits for the Receive calls to end.
func (s *Server) Close() {
	ds := s.shut()
	s.observer.close()
	if s.activity != nil {
		s.activity.close()
	}
	if s.pusher != nil {
		s.pusher.close() // requests in flight are abandoned: their messages go back
	}
	for _, d := range ds {
		d.stop()
	}
	s.wg.Wait()
}

// shut refuses new attachments and returns the running dispatchers.
func (s *Server) shut() []*dispatcher {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.dispatcherList()
}

// dispatcherList returns the dispatchers running now.
func (s *Server) dispatcherList() []*dispatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	ds := make([]*dispatcher, 0, len(s.dispatchers))
	for _, d := range s.dispatchers {
		ds = append(ds, d)
	}
	return ds
}

// clientOf, topicOf and subscriptionOf resolve a resource name (of a
// project, topic or subscription) to a handle of its project's client;
// errors are statuses.
func (s *Server) clientOf(projectName string) (*adapter.Client, error) {
	project, err := grpcutil.ParseProject(projectName)
	if err != nil {
		return nil, err
	}
	return s.client(project)
}

func (s *Server) topicOf(name string) (*adapter.Topic, error) {
	project, id, err := parseTopic(name)
	if err != nil {
		return nil, err
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	return c.Topic(id), nil
}

func (s *Server) subscriptionOf(name string) (*adapter.Subscription, error) {
	project, id, err := parseSubscription(name)
	if err != nil {
		return nil, err
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	return c.Subscription(id), nil
}

// client is the broker's adapter client of project, errors as statuses.
func (s *Server) client(project string) (*adapter.Client, error) {
	c, err := s.b.Client(project)
	return c, toStatus(err)
}

// Resource names.

// parseName splits projects/{project}/{kind}/{id}.
func parseName(name, kind string) (project, id string, err error) {
	parts := strings.Split(name, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[2] != kind || parts[1] == "" || parts[3] == "" {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: want projects/{project}/%s/{id}", strings.TrimSuffix(kind, "s"), name, kind)
	}
	if err := keyrouter.ValidateProjectID(parts[1]); err != nil {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: %v", strings.TrimSuffix(kind, "s"), name, err)
	}
	validate := keyrouter.ValidateTopicID
	if kind == "subscriptions" {
		validate = keyrouter.ValidateSubscriptionID
	}
	if err := validate(parts[3]); err != nil {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: %v", strings.TrimSuffix(kind, "s"), name, err)
	}
	return parts[1], parts[3], nil
}

func parseTopic(name string) (project, topic string, err error) { return parseName(name, "topics") }

func parseSubscription(name string) (project, sub string, err error) {
	return parseName(name, "subscriptions")
}

func subscriptionName(project, sub string) string {
	return "projects/" + project + "/subscriptions/" + sub
}

// toStatus maps an error to the status code that steers Pub/Sub clients:
// bad input INVALID_ARGUMENT, missing NOT_FOUND, existing ALREADY_EXISTS,
// and transient trouble UNAVAILABLE, which clients retry; the cases of
// NATS and context errors are grpcutil.Code's.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, adapter.ErrTopicNotFound), errors.Is(err, adapter.ErrSubscriptionNotFound),
		errors.Is(err, adapter.ErrTopicDeleted):
		code = codes.NotFound
	case errors.Is(err, adapter.ErrTopicExists), errors.Is(err, adapter.ErrSubscriptionExists):
		code = codes.AlreadyExists
	case errors.Is(err, adapter.ErrInvalidConfig), errors.Is(err, adapter.ErrInvalidMessage),
		errors.Is(err, keyrouter.ErrEmptyOrderingKey), errors.Is(err, keyrouter.ErrOrderingKeyTooLong),
		errors.Is(err, keyrouter.ErrOrderingKeyNotUTF8), errors.Is(err, keyrouter.ErrInvalidProjectID),
		errors.Is(err, keyrouter.ErrInvalidTopicID), errors.Is(err, keyrouter.ErrInvalidSubscriptionID),
		errors.Is(err, nats.ErrMaxPayload): // data and headers together over the server's max_payload
		code = codes.InvalidArgument
	case errors.Is(err, adapter.ErrDetached):
		code = codes.FailedPrecondition
	case errors.Is(err, errors.ErrUnsupported): // seeking a subscription of a topic with key streams
		code = codes.Unimplemented
	case errors.Is(err, broker.ErrTooManyProjects):
		code = codes.ResourceExhausted
	case errors.Is(err, adapter.ErrNotDurable): // stored, but its sync failed or timed out: retry
		code = codes.Unavailable
	default:
		// A context's end first, then transient trouble: NATS's, or ours.
		code = grpcutil.Code(err)
		if code == codes.Internal && (errors.Is(err, adapter.ErrClosed) || errors.Is(err, adapter.ErrFlowControlLimit) ||
			errors.Is(err, adapter.ErrPublishingPaused) || errors.Is(err, adapter.ErrTopicStopped) ||
			errors.Is(err, didcomm.ErrStateConflict)) { // DIDComm stamping lost every compare-and-set: try again
			code = codes.Unavailable
		}
	}
	return status.Error(code, err.Error())
}

// checkLabels applies the service's rules to labels: at most 64; keys of
// 1..63 characters, starting with a lower-case letter, of lower-case
// letters, digits, '_' and '-' (international letters too); values of
// 0..63 such characters.
func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return invalid("%d labels, at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		first, _ := utf8.DecodeRuneInString(k)
		switch {
		case k == "" || utf8.RuneCountInString(k) > maxLabelChars:
			return invalid("label key %q: must be 1 to %d characters", k, maxLabelChars)
		case !unicode.IsLower(first) && (first < 0x80 || !unicode.IsLetter(first)):
			return invalid("label key %q: must start with a lower-case letter", k)
		case !labelText(k):
			return invalid("label key %q: only lower-case letters, digits, '_' and '-' are allowed", k)
		case utf8.RuneCountInString(v) > maxLabelChars:
			return invalid("label %q: value must be at most %d characters", k, maxLabelChars)
		case !labelText(v):
			return invalid("label %q: value %q: only lower-case letters, digits, '_' and '-' are allowed", k, v)
		}
	}
	return nil
}

const (
	maxLabels     = 64
	maxLabelChars = 63
)

func labelText(s string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' ||
			r >= 0x80 && (unicode.IsLower(r) || unicode.IsLetter(r) && !unicode.IsUpper(r) || unicode.IsDigit(r))
		if !ok {
			return false
		}
	}
	return true
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

var errShuttingDown = status.Error(codes.Unavailable, "the sidecar is shutting down")

// receiveGauges are the receive hooks of every subscription's Receive:
// the partitions this process owns and what they hold, per subscription,
// and dead letters.
type receiveGauges struct {
	deadLettered func(sub string)

	mu   sync.Mutex
	subs map[string]*partitionState // by subscription name
}

// partitionState is what this process holds of one partitioned
// subscription.
type partitionState struct {
	owned          map[int]bool // partition indexes
	buffered, full int
}

var _ adapter.Hooks = (*receiveGauges)(nil)

func (g *receiveGauges) DeadLettered(sub *adapter.Subscription, _ *adapter.Message) {
	g.deadLettered(sub.String())
}

func (g *receiveGauges) PartitionChanged(sub *adapter.Subscription, c adapter.PartitionChange) {
	name := sub.String()
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.subs[name]
	if p == nil {
		if g.subs == nil {
			g.subs = make(map[string]*partitionState)
		}
		p = &partitionState{owned: make(map[int]bool)}
		g.subs[name] = p
	}
	switch c.Owned {
	case 1:
		p.owned[c.Partition] = true
	case -1:
		delete(p.owned, c.Partition)
	}
	p.buffered += c.Buffered
	p.full += c.Full
	if len(p.owned) == 0 && p.buffered == 0 && p.full == 0 {
		delete(g.subs, name)
	}
}

// of returns what this process holds of subscription name's partitions:
// the indexes it owns (sorted), the messages they hold, and how many are
// full.
func (g *receiveGauges) of(name string) (owned []int, buffered, full int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.subs[name]
	if p == nil {
		return nil, 0, 0
	}
	for i := range p.owned {
		owned = append(owned, i)
	}
	slices.Sort(owned)
	return owned, p.buffered, p.full
}
