package pubsubapi

import (
	"context"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
)

// Pub/Sub's limits on one Publish request.
const (
	maxPublishRequestBytes    = 10 << 20
	maxPublishRequestMessages = 1000
)

// CreateTopic creates a topic with its labels and
// message_retention_duration (10 minutes to 31 days, as the service; without
// it, messages are kept until the topic is deleted).
func (s *Server) CreateTopic(ctx context.Context, t *pb.Topic) (*pb.Topic, error) {
	project, id, err := parseTopic(t.GetName())
	if err != nil {
		return nil, err
	}
	cfg := &adapter.TopicConfig{Labels: t.GetLabels()}
	if d := t.GetMessageRetentionDuration(); d != nil {
		if cfg.RetentionDuration, err = topicRetention(d); err != nil {
			return nil, err
		}
	}
	if err := checkLabels(t.GetLabels()); err != nil {
		return nil, err
	}
	if t.GetSchemaSettings() != nil || t.GetIngestionDataSourceSettings() != nil || len(t.GetMessageTransforms()) > 0 {
		return nil, invalid("topic %s: schemas, ingestion and message transforms are not supported", t.GetName())
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	created, err := c.CreateTopicWithConfig(ctx, id, cfg)
	if err != nil {
		return nil, toStatus(err)
	}
	return topicProto(created, *cfg), nil
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

func topicProto(t *adapter.Topic, cfg adapter.TopicConfig) *pb.Topic {
	out := &pb.Topic{Name: t.String(), State: pb.Topic_ACTIVE, Labels: cfg.Labels}
	if cfg.RetentionDuration > 0 {
		out.MessageRetentionDuration = durationpb.New(cfg.RetentionDuration)
	}
	return out
}

// UpdateTopic changes a topic's labels and message_retention_duration
// (removed by an empty one: messages are then kept until the topic is
// deleted). Other fields cannot be changed.
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
	for _, p := range paths {
		switch p {
		case "labels":
			if err := checkLabels(req.GetTopic().GetLabels()); err != nil {
				return nil, err
			}
			u.Labels = req.GetTopic().GetLabels()
			if u.Labels == nil {
				u.Labels = map[string]string{}
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
		case "message_storage_policy", "kms_key_name", "ingestion_data_source_settings", "message_transforms", "satisfies_pzs", "state":
			return nil, invalid("update %s: %s is not supported by this server", name, p)
		default:
			return nil, invalid("update %s: unknown field name %q in update_mask", name, p)
		}
	}
	cfg, err := t.Update(ctx, u)
	if err != nil {
		return nil, toStatus(err)
	}
	return topicProto(t, cfg), nil
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
	return topicProto(t, cfg), nil
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
	topics, next, err := page(topics, (*adapter.Topic).ID, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pb.ListTopicsResponse{NextPageToken: next}
	for _, t := range topics {
		cfg, err := t.Config(ctx)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Topics = append(resp.Topics, topicProto(t, cfg))
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
	names, next, err := page(names, func(n string) string { return n }, req.GetPageSize(), req.GetPageToken())
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
	return &emptypb.Empty{}, nil
}

// Publish stores every message of the request, in order, and returns their
// ids. An invalid message fails the request before any is stored; when a
// publish fails, the request fails (the client retries it, and the
// messages already stored are stored once, by their ids).
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
	}
	ids, err := s.b.Publish(ctx, project, id, msgs)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PublishResponse{MessageIds: ids}, nil
}
