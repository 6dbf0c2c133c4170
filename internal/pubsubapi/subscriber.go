package pubsubapi

import (
	"context"
	"maps"
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/adapter"
)

// CreateSubscription creates a pull subscription. It honours
// enable_message_ordering, ack_deadline_seconds (1..600, 0 means 10),
// dead_letter_policy and labels; message_retention_duration, retry_policy
// and expiration_policy are accepted and not applied (the topic's retention
// governs). Push, export, filters and exactly-once delivery are refused.
func (s *Server) CreateSubscription(ctx context.Context, sub *pb.Subscription) (*pb.Subscription, error) {
	project, id, err := parseSubscription(sub.GetName())
	if err != nil {
		return nil, err
	}
	topicProject, topicID, err := parseTopic(sub.GetTopic())
	if err != nil {
		return nil, err
	}
	switch {
	case sub.GetPushConfig().GetPushEndpoint() != "":
		return nil, invalid("subscription %s: push subscriptions are not supported", sub.GetName())
	case sub.GetBigqueryConfig() != nil || sub.GetCloudStorageConfig() != nil || sub.GetBigtableConfig() != nil:
		return nil, invalid("subscription %s: export subscriptions are not supported", sub.GetName())
	case sub.GetFilter() != "":
		return nil, invalid("subscription %s: filters are not supported", sub.GetName())
	case sub.GetEnableExactlyOnceDelivery():
		return nil, invalid("subscription %s: exactly-once delivery is not supported", sub.GetName())
	case len(sub.GetMessageTransforms()) > 0:
		return nil, invalid("subscription %s: message transforms are not supported", sub.GetName())
	}
	secs := sub.GetAckDeadlineSeconds()
	if secs < 0 || secs > 600 {
		return nil, invalid("subscription %s: ack_deadline_seconds %d not in 0..600", sub.GetName(), secs)
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	tc, err := s.client(topicProject)
	if err != nil {
		return nil, err
	}
	cfg := adapter.SubscriptionConfig{
		Topic:                 tc.Topic(topicID),
		AckDeadline:           time.Duration(secs) * time.Second,
		EnableMessageOrdering: sub.GetEnableMessageOrdering(),
		Labels:                sub.GetLabels(),
	}
	if err := s.delivery(&cfg); err != nil {
		return nil, err
	}
	if cfg.DeadLetterPolicy, err = s.deadLetterPolicy(sub.GetDeadLetterPolicy()); err != nil {
		return nil, err
	}
	created, err := c.CreateSubscription(ctx, id, cfg)
	if err != nil {
		return nil, toStatus(err)
	}
	return s.subscriptionProto(ctx, created)
}

// deadLetterPolicy turns the proto policy into the adapter's; nil or an
// empty topic means none.
func (s *Server) deadLetterPolicy(p *pb.DeadLetterPolicy) (*adapter.DeadLetterPolicy, error) {
	if p.GetDeadLetterTopic() == "" {
		return nil, nil
	}
	t, err := s.topicOf(p.GetDeadLetterTopic())
	if err != nil {
		return nil, err
	}
	return &adapter.DeadLetterPolicy{Topic: t, MaxDeliveryAttempts: int(p.GetMaxDeliveryAttempts())}, nil
}

func (s *Server) subscriptionProto(ctx context.Context, sub *adapter.Subscription) (*pb.Subscription, error) {
	cfg, err := sub.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.Subscription{
		Name:                  sub.String(),
		Topic:                 cfg.Topic.String(),
		AckDeadlineSeconds:    int32(cfg.AckDeadline / time.Second),
		EnableMessageOrdering: cfg.EnableMessageOrdering,
		Labels:                cfg.Labels,
		State:                 pb.Subscription_ACTIVE,
	}
	if p := cfg.DeadLetterPolicy; p != nil {
		out.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: p.Topic.String(), MaxDeliveryAttempts: int32(p.MaxDeliveryAttempts)}
	}
	return out, nil
}

// GetSubscription returns a subscription's configuration.
func (s *Server) GetSubscription(ctx context.Context, req *pb.GetSubscriptionRequest) (*pb.Subscription, error) {
	sub, err := s.subscriptionOf(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	return s.subscriptionProto(ctx, sub)
}

// UpdateSubscription changes labels and the dead-letter policy. Message
// ordering cannot change; other fields are not supported.
func (s *Server) UpdateSubscription(ctx context.Context, req *pb.UpdateSubscriptionRequest) (*pb.Subscription, error) {
	sub, err := s.subscriptionOf(req.GetSubscription().GetName())
	if err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalid("update %s: update_mask names no field", req.GetSubscription().GetName())
	}
	var u adapter.SubscriptionUpdate
	for _, p := range paths {
		switch p {
		case "labels":
			u.Labels = req.GetSubscription().GetLabels()
			if u.Labels == nil {
				u.Labels = map[string]string{}
			}
		case "dead_letter_policy":
			if u.DeadLetterPolicy, err = s.deadLetterPolicy(req.GetSubscription().GetDeadLetterPolicy()); err != nil {
				return nil, err
			}
			if u.DeadLetterPolicy == nil {
				u.DeadLetterPolicy = &adapter.DeadLetterPolicy{} // no topic: remove the policy
			}
		case "enable_message_ordering":
			return nil, invalid("update %s: enable_message_ordering cannot be changed after creation", req.GetSubscription().GetName())
		default:
			return nil, invalid("update %s: updating %q is not supported (labels and dead_letter_policy are)", req.GetSubscription().GetName(), p)
		}
	}
	if _, err := sub.Update(ctx, u); err != nil {
		return nil, toStatus(err)
	}
	return s.subscriptionProto(ctx, sub)
}

// ListSubscriptions lists a project's subscriptions, sorted by name.
func (s *Server) ListSubscriptions(ctx context.Context, req *pb.ListSubscriptionsRequest) (*pb.ListSubscriptionsResponse, error) {
	c, err := s.clientOf(req.GetProject())
	if err != nil {
		return nil, err
	}
	subs, err := c.Subscriptions(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	subs, next, err := page(subs, (*adapter.Subscription).ID, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pb.ListSubscriptionsResponse{NextPageToken: next}
	for _, sub := range subs {
		p, err := s.subscriptionProto(ctx, sub)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Subscriptions = append(resp.Subscriptions, p)
	}
	return resp, nil
}

// DeleteSubscription deletes a subscription; its unacked messages go with
// it and its streams end with NOT_FOUND.
func (s *Server) DeleteSubscription(ctx context.Context, req *pb.DeleteSubscriptionRequest) (*emptypb.Empty, error) {
	sub, err := s.subscriptionOf(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	if err := sub.Delete(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// Labels that choose an ordered subscription's delivery at creation; the
// created subscription carries the mode it got in labelDelivery.
const (
	labelDelivery        = "jetorder-delivery"
	labelPartitions      = "jetorder-partitions"
	labelPartitionBuffer = "jetorder-partition-buffer"
)

// delivery sets cfg's delivery mode from its labels, or the server's
// default, and records the mode in the labels.
func (s *Server) delivery(cfg *adapter.SubscriptionConfig) error {
	mode, ok := cfg.Labels[labelDelivery]
	_, hasParts := cfg.Labels[labelPartitions]
	_, hasBuffer := cfg.Labels[labelPartitionBuffer]
	if !cfg.EnableMessageOrdering {
		if ok || hasParts || hasBuffer {
			return invalid("labels %s, %s and %s apply to subscriptions with message ordering", labelDelivery, labelPartitions, labelPartitionBuffer)
		}
		return nil
	}
	if !ok {
		mode = string(s.cfg.Delivery)
		if mode == "" {
			mode = string(adapter.DefaultDelivery)
		}
	}
	cfg.Delivery = adapter.DeliveryMode(mode)
	number := func(label string) (int, error) {
		v, ok := cfg.Labels[label]
		if !ok {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, invalid("label %s %q: want a positive integer", label, v)
		}
		return n, nil
	}
	var err error
	if cfg.Partitions, err = number(labelPartitions); err != nil {
		return err
	}
	if cfg.PartitionBuffer, err = number(labelPartitionBuffer); err != nil {
		return err
	}
	if cfg.Delivery != adapter.DeliveryPartitioned && (hasParts || hasBuffer) {
		return invalid("labels %s and %s apply to %s=%s", labelPartitions, labelPartitionBuffer, labelDelivery, adapter.DeliveryPartitioned)
	}
	labels := maps.Clone(cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelDelivery] = mode
	cfg.Labels = labels
	return nil
}
