package pubsubapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/internal/schemaapi"
	"github.com/jetorder/jetorder/keyrouter"
)

// Pub/Sub's limits on one Publish request.
const (
	maxPublishRequestBytes    = 10 << 20
	maxPublishRequestMessages = 1000
)

// CreateTopic creates a topic with its labels,
// message_retention_duration (10 minutes to 31 days, as the service; without
// it, messages are kept until the topic is deleted), schema_settings
// (checked by schemaapi.Server.CheckSettings; Publish validates against them)
// and message_storage_policy (kept and returned: storagepolicy.go).
func (s *Server) CreateTopic(ctx context.Context, t *pb.Topic) (*pb.Topic, error) {
	project, id, err := parseTopic(t.GetName())
	if err != nil {
		return nil, err
	}
	cfg := &adapter.TopicConfig{Labels: t.GetLabels()}
	if err := s.keyStreams(cfg); err != nil {
		return nil, err
	}
	if d := t.GetMessageRetentionDuration(); d != nil {
		if cfg.RetentionDuration, err = topicRetention(d); err != nil {
			return nil, err
		}
	}
	if err := checkLabels(t.GetLabels()); err != nil {
		return nil, err
	}
	if t.GetIngestionDataSourceSettings() != nil || len(t.GetMessageTransforms()) > 0 {
		return nil, invalid("topic %s: ingestion and message transforms are not supported", t.GetName())
	}
	sp, err := checkStoragePolicy(t.GetName(), t.GetMessageStoragePolicy())
	if err != nil {
		return nil, err
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	ts, err := s.cfg.Schemas.CheckSettings(ctx, t.GetSchemaSettings())
	if err != nil {
		return nil, err
	}
	if cfg.ServiceSettings, err = withTopicSchema("", ts); err != nil {
		return nil, err
	}
	if cfg.ServiceSettings, err = withStoragePolicy(cfg.ServiceSettings, sp); err != nil {
		return nil, err
	}
	created, err := c.CreateTopicWithConfig(ctx, id, cfg)
	if err != nil {
		return nil, toStatus(err)
	}
	s.topicSchemas.set(created.String(), ts)
	return s.topicProto(ctx, created, *cfg)
}

// labelKeyStreams chooses at creation how many key streams a topic's keyed
// messages are split over (adapter.TopicConfig.KeyStreams); the created
// topic carries the count it got when it has key streams.
const labelKeyStreams = "jetorder-key-streams"

// keyStreams sets cfg's key stream count from its labels, or the server's
// default, and records a count over 1 in the labels.
func (s *Server) keyStreams(cfg *adapter.TopicConfig) error {
	n := s.cfg.KeyStreams
	if v, ok := cfg.Labels[labelKeyStreams]; ok {
		var err error
		if n, err = strconv.Atoi(v); err != nil || !keyrouter.ValidKeyStreams(n) {
			return invalid("label %s %q: want 1, 2, 4, 8 or 16", labelKeyStreams, v)
		}
	}
	cfg.KeyStreams = n
	if n > 1 {
		labels := maps.Clone(cfg.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[labelKeyStreams] = strconv.Itoa(n)
		cfg.Labels = labels
	}
	return nil
}

// The service's bounds on a topic's message retention.
const (
	minTopicRetention = 10 * time.Minute
	maxTopicRetention = 31 * 24 * time.Hour
)

func topicRetention(d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil || d.AsDuration() < minTopicRetention || d.AsDuration() > maxTopicRetention {
		return 0, invalid("invalid message_retention_duration %s: must be between %v and %v", d.AsDuration(), minTopicRetention, maxTopicRetention)
	}
	return d.AsDuration(), nil
}

// topicProto is a topic as the API shows it; its schema settings name
// "_deleted-schema_" once their schema is deleted.
func (s *Server) topicProto(ctx context.Context, t *adapter.Topic, cfg adapter.TopicConfig) (*pb.Topic, error) {
	out := &pb.Topic{Name: t.String(), State: pb.Topic_ACTIVE, Labels: cfg.Labels}
	if cfg.RetentionDuration > 0 {
		out.MessageRetentionDuration = durationpb.New(cfg.RetentionDuration)
	}
	ts, err := topicSchemaOf(t.String(), cfg.ServiceSettings)
	if err != nil {
		return nil, err
	}
	if out.SchemaSettings, err = s.cfg.Schemas.SettingsOf(ctx, ts); err != nil {
		return nil, err
	}
	if out.MessageStoragePolicy, err = storagePolicyProto(t.String(), cfg.ServiceSettings); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateTopic changes a topic's labels, message_retention_duration
// (removed by an empty one: messages are then kept until the topic is
// deleted), message_storage_policy (removed by none) and
// schema_settings: the whole (removed by an empty one) or
// its fields schema_settings.schema, .encoding, .first_revision_id and
// .last_revision_id, as the service and its samples do; the result is
// checked as CreateTopic checks it. Other fields cannot be changed. A
// request with any bad field changes nothing.
func (s *Server) UpdateTopic(ctx context.Context, req *pb.UpdateTopicRequest) (*pb.Topic, error) {
	name := req.GetTopic().GetName()
	t, err := s.topicOf(name)
	if err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalid("update %s: update_mask names no field", name)
	}
	var u adapter.TopicUpdate
	moveTo := 1 // the key streams the topic moves onto (labelKeyStreams)
	var schemaPaths []string
	var storage **storagePolicy // set: the mask names message_storage_policy
	for _, p := range paths {
		switch p {
		case "schema_settings", "schema_settings.schema", "schema_settings.encoding",
			"schema_settings.first_revision_id", "schema_settings.last_revision_id":
			schemaPaths = append(schemaPaths, p)
		case "labels":
			if err := checkLabels(req.GetTopic().GetLabels()); err != nil {
				return nil, err
			}
			u.Labels = req.GetTopic().GetLabels()
			if u.Labels == nil {
				u.Labels = map[string]string{}
			}
			cur, err := t.Config(ctx)
			if err != nil {
				return nil, toStatus(err)
			}
			// Kept when the new labels leave it out; on a topic of one
			// stream, a count over 1 moves it onto key streams.
			nv, set := u.Labels[labelKeyStreams]
			switch v := cur.Labels[labelKeyStreams]; {
			case !set && v != "":
				u.Labels = maps.Clone(u.Labels)
				u.Labels[labelKeyStreams] = v
			case !set:
			case cur.KeyStreams > 1 && nv != strconv.Itoa(cur.KeyStreams):
				return nil, invalid("update %s: label %s: the topic's keyed messages are split over %d key streams, a count that cannot change", name, labelKeyStreams, cur.KeyStreams)
			case cur.KeyStreams <= 1:
				n, err := strconv.Atoi(nv)
				if err != nil || !keyrouter.ValidKeyStreams(n) {
					return nil, invalid("update %s: label %s %q: want 1, 2, 4, 8 or 16", name, labelKeyStreams, nv)
				}
				moveTo = n
			}
		case "message_retention_duration":
			var d time.Duration
			if r := req.GetTopic().GetMessageRetentionDuration(); r != nil {
				if d, err = topicRetention(r); err != nil {
					return nil, err
				}
			}
			u.RetentionDuration = &d
		case "name":
			return nil, invalid("update %s: a topic's name cannot be changed", name)
		case "message_storage_policy":
			sp, err := checkStoragePolicy(name, req.GetTopic().GetMessageStoragePolicy())
			if err != nil {
				return nil, err
			}
			storage = &sp
		case "kms_key_name", "ingestion_data_source_settings", "message_transforms", "satisfies_pzs", "state":
			return nil, invalid("update %s: %s is not supported by this server", name, p)
		default:
			return nil, invalid("update %s: unknown field name %q in update_mask", name, p)
		}
	}
	if len(schemaPaths) > 0 || storage != nil {
		settings, err := s.updatedTopicSettings(ctx, t, req.GetTopic().GetSchemaSettings(), schemaPaths, storage)
		if err != nil {
			return nil, err
		}
		u.ServiceSettings = &settings
	}
	if moveTo > 1 {
		// Before the labels are stored: a topic whose label names key
		// streams has them.
		move, err := t.MoveToKeyStreams(ctx, moveTo)
		if err != nil {
			return nil, toStatus(err)
		}
		s.log.Info("topic moved onto key streams", "topic", name, "key_streams", moveTo,
			"subscriptions_moved", len(move.Moved), "subscriptions_waiting", len(move.Waiting))
	}
	cfg, err := t.Update(ctx, u)
	if err != nil {
		s.topicSchemas.forget(name) // whether it changed is unknown
		return nil, toStatus(err)
	}
	ts, err := topicSchemaOf(name, cfg.ServiceSettings)
	if err != nil {
		return nil, err
	}
	s.topicSchemas.set(name, ts)
	return s.topicProto(ctx, t, cfg)
}

// updatedTopicSettings returns the service settings of topic t with the
// schema settings paths of in applied, checked, and the storage policy
// replaced by *storage when storage is not nil. Schema fields are applied
// to the settings as GetTopic shows them, so that changing one field of
// the settings of a deleted schema names "_deleted-schema_", which is
// refused.
func (s *Server) updatedTopicSettings(ctx context.Context, t *adapter.Topic, in *pb.SchemaSettings, paths []string, storage **storagePolicy) (string, error) {
	cfg, err := t.Config(ctx)
	if err != nil {
		return "", toStatus(err)
	}
	settings := cfg.ServiceSettings
	if storage != nil {
		if settings, err = withStoragePolicy(settings, *storage); err != nil {
			return "", err
		}
	}
	if len(paths) == 0 {
		return settings, nil
	}
	cur, err := topicSchemaOf(t.String(), cfg.ServiceSettings)
	if err != nil {
		return "", err
	}
	next, err := s.cfg.Schemas.SettingsOf(ctx, cur)
	if err != nil {
		return "", err
	}
	for _, p := range paths {
		if p == "schema_settings" {
			next = nil // removed, unless in has settings
			if in != nil {
				next = proto.CloneOf(in)
			}
			continue
		}
		if next == nil {
			next = &pb.SchemaSettings{}
		}
		switch p {
		case "schema_settings.schema":
			next.Schema = in.GetSchema()
		case "schema_settings.encoding":
			next.Encoding = in.GetEncoding()
		case "schema_settings.first_revision_id":
			next.FirstRevisionId = in.GetFirstRevisionId()
		case "schema_settings.last_revision_id":
			next.LastRevisionId = in.GetLastRevisionId()
		}
	}
	ts, err := s.cfg.Schemas.CheckSettings(ctx, next)
	if err != nil {
		return "", err
	}
	return withTopicSchema(settings, ts)
}

// GetTopic returns a topic's configuration.
func (s *Server) GetTopic(ctx context.Context, req *pb.GetTopicRequest) (*pb.Topic, error) {
	t, err := s.topicOf(req.GetTopic())
	if err != nil {
		return nil, err
	}
	cfg, err := t.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return s.topicProto(ctx, t, cfg)
}

// ListTopics lists a project's topics, sorted by name.
func (s *Server) ListTopics(ctx context.Context, req *pb.ListTopicsRequest) (*pb.ListTopicsResponse, error) {
	c, err := s.clientOf(req.GetProject())
	if err != nil {
		return nil, err
	}
	topics, err := c.Topics(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	topics, next, err := grpcutil.Page(topics, (*adapter.Topic).ID, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pb.ListTopicsResponse{NextPageToken: next}
	for _, t := range topics {
		cfg, err := t.Config(ctx)
		if err != nil {
			continue // deleted meanwhile
		}
		pt, err := s.topicProto(ctx, t, cfg)
		if err != nil {
			return nil, err
		}
		resp.Topics = append(resp.Topics, pt)
	}
	return resp, nil
}

// ListTopicSubscriptions lists the subscriptions of a topic, in any project
// this sidecar has served.
func (s *Server) ListTopicSubscriptions(ctx context.Context, req *pb.ListTopicSubscriptionsRequest) (*pb.ListTopicSubscriptionsResponse, error) {
	project, id, err := parseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	if ok, err := c.Topic(id).Exists(ctx); err != nil || !ok {
		if err == nil {
			err = adapter.ErrTopicNotFound
		}
		return nil, toStatus(err)
	}
	subs, err := c.Subscriptions(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	var names []string
	for _, sub := range subs {
		cfg, err := sub.Config(ctx)
		if err != nil || cfg.Topic.String() != req.GetTopic() {
			continue
		}
		names = append(names, sub.String())
	}
	names, next, err := grpcutil.Page(names, func(n string) string { return n }, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &pb.ListTopicSubscriptionsResponse{Subscriptions: names, NextPageToken: next}, nil
}

// DeleteTopic deletes a topic and its messages. Its subscriptions stay and
// name the topic "_deleted-topic_", as in the service; they receive
// nothing more.
func (s *Server) DeleteTopic(ctx context.Context, req *pb.DeleteTopicRequest) (*emptypb.Empty, error) {
	project, id, err := parseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	if err := c.Topic(id).Delete(ctx); err != nil {
		return nil, toStatus(err)
	}
	s.b.Forget(project, id)
	s.topicSchemas.forget(req.GetTopic())
	return &emptypb.Empty{}, nil
}

// Publish stores every message of the request, in order, and returns their
// ids. An invalid message fails the request before any is stored: on a
// topic with schema settings, that includes a message whose data the
// schema refuses (INVALID_ARGUMENT, schemaapi.Server.Validator), and every
// message is refused once the schema is deleted (NOT_FOUND). Validated
// messages carry the googclient_schema* attributes, as the service sets
// them. When a publish fails, the request fails (the client retries it,
// and the messages already stored are stored once, by their ids).
func (s *Server) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	project, id, err := parseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	if len(req.GetMessages()) == 0 {
		return nil, invalid("publish to %s: the request has no messages", req.GetTopic())
	}
	if n := len(req.GetMessages()); n > maxPublishRequestMessages {
		return nil, invalid("publish to %s: %d messages in one request, at most %d", req.GetTopic(), n, maxPublishRequestMessages)
	}
	ts, err := s.publishSchema(ctx, req.GetTopic(), project, id)
	if err != nil {
		return nil, err
	}
	v, err := s.cfg.Schemas.Validator(ctx, ts)
	if err != nil {
		return nil, err
	}
	total := 0
	msgs := make([]*adapter.Message, len(req.GetMessages()))
	for i, m := range req.GetMessages() {
		total += len(m.GetData())
		for k, v := range m.GetAttributes() {
			total += len(k) + len(v)
		}
		if total > maxPublishRequestBytes {
			return nil, invalid("publish to %s: the request is larger than %d bytes", req.GetTopic(), maxPublishRequestBytes)
		}
		if len(m.GetData()) == 0 && len(m.GetAttributes()) == 0 {
			return nil, invalid("publish to %s: message %d has neither data nor attributes", req.GetTopic(), i)
		}
		msgs[i] = &adapter.Message{Data: m.GetData(), Attributes: m.GetAttributes(), OrderingKey: m.GetOrderingKey()}
		cloudevents.FromPubSub(msgs[i]) // a CloudEvent is stored as every binding reads it
		if v != nil {
			rev, err := v.Validate(m.GetData(), fmt.Sprintf("messages[%d]", i))
			if err != nil {
				return nil, err
			}
			stampSchema(msgs[i], ts, rev)
		}
	}
	ids, err := s.b.Publish(ctx, project, id, msgs)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PublishResponse{MessageIds: ids}, nil
}

// Schema attributes the service sets on each message it validated.
const (
	attrSchemaName     = "googclient_schemaname"
	attrSchemaEncoding = "googclient_schemaencoding"
	attrSchemaRevision = "googclient_schemarevisionid"
)

// stampSchema adds the schema attributes to m, which passed the schema of
// ts at revision rev. They go in as headers, which clients see as
// attributes (adapter.Message.PubSubAttributes): the adapter refuses
// attributes named goog*, which only the service may set.
func stampSchema(m *adapter.Message, ts *schemaapi.TopicSchema, rev string) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[attrSchemaName] = []string{ts.Schema}
	m.Header[attrSchemaEncoding] = []string{ts.Encoding}
	m.Header[attrSchemaRevision] = []string{rev}
}

// A topic's service settings (adapter.TopicConfig.ServiceSettings) are a
// JSON object, one member per kind of setting the sidecar keeps and the
// library does not act on, so that others can join later:
// "schemaSettings" holds a schemaapi.TopicSchema, "messageStoragePolicy"
// a storagePolicy. Members this version does not know are kept as they
// are when it rewrites the object.
const (
	topicSchemaMember        = "schemaSettings"
	topicStoragePolicyMember = "messageStoragePolicy"
)

// topicMember reads member of topic name's service settings into v;
// false when there is none.
func topicMember(name, settings, member string, v any) (bool, error) {
	if settings == "" {
		return false, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(settings), &members); err != nil {
		return false, status.Errorf(codes.Internal, "topic %s: unreadable settings: %v", name, err)
	}
	raw, ok := members[member]
	if !ok || string(raw) == "null" {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, status.Errorf(codes.Internal, "topic %s: unreadable %s: %v", name, member, err)
	}
	return true, nil
}

// withTopicMember returns the service settings settings with member
// replaced by v (remove: removed), other members kept. Settings that are
// not a JSON object are replaced whole: nothing but this code writes them.
func withTopicMember(settings, member string, v any, remove bool) (string, error) {
	members := map[string]json.RawMessage{}
	if settings != "" && json.Unmarshal([]byte(settings), &members) != nil {
		members = map[string]json.RawMessage{}
	}
	delete(members, member)
	if !remove {
		raw, err := json.Marshal(v)
		if err != nil {
			return "", status.Errorf(codes.Internal, "encode %s: %v", member, err)
		}
		members[member] = raw
	}
	if len(members) == 0 {
		return "", nil
	}
	out, err := json.Marshal(members)
	if err != nil {
		return "", status.Errorf(codes.Internal, "encode topic settings: %v", err)
	}
	return string(out), nil
}

// topicSchemaOf reads the schema settings of topic name from its service
// settings; nil means none.
func topicSchemaOf(name, settings string) (*schemaapi.TopicSchema, error) {
	var ts schemaapi.TopicSchema
	if ok, err := topicMember(name, settings, topicSchemaMember, &ts); !ok || err != nil {
		return nil, err
	}
	return &ts, nil
}

// withTopicSchema returns the service settings settings with their schema
// settings replaced by ts (nil: removed), other members kept.
func withTopicSchema(settings string, ts *schemaapi.TopicSchema) (string, error) {
	return withTopicMember(settings, topicSchemaMember, ts, ts == nil)
}

// publishSchema returns the schema settings of the topic a Publish names,
// through s.topicSchemas: NOT_FOUND if there is no such topic.
func (s *Server) publishSchema(ctx context.Context, name, project, id string) (*schemaapi.TopicSchema, error) {
	return s.topicSchemas.get(ctx, name, func(ctx context.Context) (*schemaapi.TopicSchema, error) {
		c, err := s.client(project)
		if err != nil {
			return nil, err
		}
		cfg, err := c.Topic(id).Config(ctx)
		if err != nil {
			return nil, toStatus(err)
		}
		return topicSchemaOf(name, cfg.ServiceSettings)
	})
}

// topicSettingsTTL bounds how long Publish trusts the schema settings it
// read of a topic, so that publishing does not read the topic's stream
// info for every request. CreateTopic, UpdateTopic and DeleteTopic through
// this server take effect at once; through another sidecar, within the
// TTL (and the schema's own, which schemaapi caches for as long).
const topicSettingsTTL = time.Second

// maxCachedTopics bounds the topics topicSchemaCache holds; past it, the
// cache starts again empty.
const maxCachedTopics = 10000

// topicSchemaCache holds the schema settings of the topics published to,
// by topic name. When an entry is stale, the first Publish to see it
// reads the topic again while the others go on with the stale settings;
// only a topic not cached at all makes its publishers wait for the read.
// The zero value is ready for use; it is safe for concurrent use.
type topicSchemaCache struct {
	mu      sync.Mutex
	entries map[string]*topicSchemaEntry
}

type topicSchemaEntry struct {
	ts      *schemaapi.TopicSchema // nil: the topic has none
	at      time.Time
	filled  bool
	loading chan struct{} // closed when the running read ends; nil if none runs
}

// get returns the cached settings of topic name, reading them with load
// when they are missing or stale. It blocks while another call reads
// settings not cached yet, until that read ends or ctx does.
func (c *topicSchemaCache) get(ctx context.Context, name string, load func(context.Context) (*schemaapi.TopicSchema, error)) (*schemaapi.TopicSchema, error) {
	for {
		c.mu.Lock()
		e := c.entries[name]
		switch {
		case e != nil && e.filled && (e.loading != nil || time.Since(e.at) < topicSettingsTTL):
			ts := e.ts // a reload may replace it once the lock is released
			c.mu.Unlock()
			return ts, nil // fresh, or stale while another call reads it again
		case e != nil && e.loading != nil:
			wait := e.loading
			c.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, toStatus(ctx.Err())
			}
		}
		if e == nil {
			if c.entries == nil || len(c.entries) >= maxCachedTopics {
				c.entries = make(map[string]*topicSchemaEntry)
			}
			e = &topicSchemaEntry{}
			c.entries[name] = e
		}
		done := make(chan struct{})
		e.loading = done
		c.mu.Unlock()

		ts, err := load(ctx)

		c.mu.Lock()
		e.loading = nil
		switch current := c.entries[name] == e; {
		case !current: // set or forgotten meanwhile: what was read may be older
		case err == nil:
			e.ts, e.at, e.filled = ts, time.Now(), true
		case !e.filled || status.Code(err) == codes.NotFound:
			delete(c.entries, name)
		}
		close(done)
		c.mu.Unlock()
		return ts, err
	}
}

// set records the settings a topic was just given through this server.
func (c *topicSchemaCache) set(name string, ts *schemaapi.TopicSchema) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= maxCachedTopics {
		c.entries = make(map[string]*topicSchemaEntry)
	}
	c.entries[name] = &topicSchemaEntry{ts: ts, at: time.Now(), filled: true}
}

// forget drops what is cached of a topic.
func (c *topicSchemaCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, name)
}
