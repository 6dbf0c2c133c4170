package pubsubapi

import (
	"context"
	"maps"
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/internal/push"
)

// CreateSubscription creates a pull subscription with the service's
// settings: enable_message_ordering, ack_deadline_seconds (10..600, 0
// means 10), dead_letter_policy, retry_policy, labels; and, kept and
// returned but governed by the topic's retention,
// message_retention_duration, retain_acked_messages and expiration_policy;
// filter (messages that do not match are acked unseen);
// enable_exactly_once_delivery (acks confirmed by JetStream before they
// are reported, see pull.go); push_config (pushsubs.go). Export is refused.
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
	case sub.GetBigqueryConfig() != nil || sub.GetCloudStorageConfig() != nil || sub.GetBigtableConfig() != nil:
		return nil, invalid("subscription %s: export subscriptions are not supported", sub.GetName())
	case len(sub.GetMessageTransforms()) > 0:
		return nil, invalid("subscription %s: message transforms are not supported", sub.GetName())
	case sub.GetDetached():
		return nil, invalid("subscription %s: detached is set by DetachSubscription, not at creation", sub.GetName())
	}
	deadline, err := ackDeadline(sub.GetName(), sub.GetAckDeadlineSeconds())
	if err != nil {
		return nil, err
	}
	if err := checkSubscriptionLabels(sub.GetLabels()); err != nil {
		return nil, err
	}
	settings, err := newSubSettings(sub)
	if err != nil {
		return nil, err
	}
	if err := s.checkPush(sub.GetName(), settings.Push, sub.GetLabels()); err != nil {
		return nil, err
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
		AckDeadline:           deadline,
		EnableMessageOrdering: sub.GetEnableMessageOrdering(),
		Labels:                sub.GetLabels(),
		RetryPolicy:           retryPolicy(sub.GetRetryPolicy()),
		Filter:                sub.GetFilter(),
		ServiceSettings:       settings.encode(),
		ExactlyOnce:           sub.GetEnableExactlyOnceDelivery(),
	}
	if err := s.delivery(&cfg); err != nil {
		return nil, err
	}
	if cfg.DeadLetterPolicy, err = s.deadLetterPolicy(sub.GetDeadLetterPolicy()); err != nil {
		return nil, err
	}
	if settings.Push != nil {
		if err := s.indexPush(ctx, sub.GetName()); err != nil {
			return nil, err
		}
	}
	created, err := c.CreateSubscription(ctx, id, cfg)
	if err != nil {
		return nil, toStatus(err)
	}
	if settings.Push != nil {
		s.pusher.poke(sub.GetName())
	}
	if err := s.activity.record(ctx, sub.GetName(), s.cfg.Now()); err != nil {
		// It expires once active and idle for its ttl.
		s.log.Warn("subscription activity not recorded", "subscription", sub.GetName(), "err", err)
	}
	return s.subscriptionProto(ctx, created)
}

// ackDeadline checks ack_deadline_seconds: 1..600, 0 means 10. The
// service's minimum is 10; shorter deadlines are kept for tests and for
// apps that want a lost message back quickly (docs/SIDECAR.md).
func ackDeadline(sub string, secs int32) (time.Duration, error) {
	if secs == 0 {
		secs = defaultAckDeadlineSeconds
	}
	if secs < 1 || secs > maxAckDeadlineSeconds {
		return 0, invalid("subscription %s: ack_deadline_seconds %d not in 0..%d", sub, secs, maxAckDeadlineSeconds)
	}
	return time.Duration(secs) * time.Second, nil
}

// retryPolicy is the adapter's form of p; unset backoffs mean the
// service's defaults, which the adapter applies.
func retryPolicy(p *pb.RetryPolicy) *adapter.RetryPolicy {
	if p == nil {
		return nil
	}
	return &adapter.RetryPolicy{MinimumBackoff: p.GetMinimumBackoff().AsDuration(), MaximumBackoff: p.GetMaximumBackoff().AsDuration()}
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

// deletedTopic is what a subscription whose topic was deleted names as its
// topic, as in the service.
const deletedTopic = "_deleted-topic_"

func (s *Server) subscriptionProto(ctx context.Context, sub *adapter.Subscription) (*pb.Subscription, error) {
	cfg, err := sub.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.Subscription{
		Name:                  sub.String(),
		Topic:                 subscriptionTopic(cfg),
		PushConfig:            &pb.PushConfig{},
		AckDeadlineSeconds:    int32(cfg.AckDeadline / time.Second),
		EnableMessageOrdering: cfg.EnableMessageOrdering,
		Labels:                cfg.Labels,
		Detached:              cfg.Detached,
		Filter:                cfg.Filter,
		State:                 pb.Subscription_ACTIVE,

		EnableExactlyOnceDelivery: cfg.ExactlyOnce,
	}
	if !cfg.TopicDeleted {
		if tcfg, err := cfg.Topic.Config(ctx); err == nil && tcfg.RetentionDuration > 0 {
			out.TopicMessageRetentionDuration = durationpb.New(tcfg.RetentionDuration)
		}
	}
	if p := cfg.DeadLetterPolicy; p != nil {
		out.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: p.Topic.String(), MaxDeliveryAttempts: int32(p.MaxDeliveryAttempts)}
	}
	if p := cfg.RetryPolicy; p != nil {
		out.RetryPolicy = &pb.RetryPolicy{MinimumBackoff: durationpb.New(p.MinimumBackoff), MaximumBackoff: durationpb.New(p.MaximumBackoff)}
	}
	decodeSubSettings(cfg.ServiceSettings).apply(out)
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

// UpdateSubscription changes the fields its update_mask names. The
// topic, message ordering and filter cannot change after creation, as in
// the service; enable_exactly_once_delivery can be turned on and off, as
// in the service; export is refused as at creation.
func (s *Server) UpdateSubscription(ctx context.Context, req *pb.UpdateSubscriptionRequest) (*pb.Subscription, error) {
	in := req.GetSubscription()
	name := in.GetName()
	sub, err := s.subscriptionOf(name)
	if err != nil {
		return nil, err
	}
	// A missing subscription is NOT_FOUND whatever the mask says.
	cur, err := sub.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalid("update %s: update_mask names no field", name)
	}
	settings := decodeSubSettings(cur.ServiceSettings)
	var u adapter.SubscriptionUpdate
	settingsChanged := false
	for _, p := range paths {
		switch p {
		case "labels":
			if err := checkSubscriptionLabels(in.GetLabels()); err != nil {
				return nil, err
			}
			u.Labels = in.GetLabels()
			if u.Labels == nil {
				u.Labels = map[string]string{}
			}
			if cur.Labels[labelDelivery] != "" && u.Labels[labelDelivery] != cur.Labels[labelDelivery] {
				return nil, invalid("update %s: label %s is set at creation and cannot change (it is %q)", name, labelDelivery, cur.Labels[labelDelivery])
			}
		case "dead_letter_policy":
			if u.DeadLetterPolicy, err = s.deadLetterPolicy(in.GetDeadLetterPolicy()); err != nil {
				return nil, err
			}
			if u.DeadLetterPolicy == nil {
				u.DeadLetterPolicy = &adapter.DeadLetterPolicy{} // no topic: remove the policy
			}
		case "ack_deadline_seconds":
			if u.AckDeadline, err = ackDeadline(name, in.GetAckDeadlineSeconds()); err != nil {
				return nil, err
			}
		case "retry_policy":
			u.SetRetryPolicy, u.RetryPolicy = true, retryPolicy(in.GetRetryPolicy())
		case "message_retention_duration", "retain_acked_messages", "expiration_policy", "push_config":
			if err := settings.update(p, in); err != nil {
				return nil, err
			}
			settingsChanged = true
		case "enable_exactly_once_delivery":
			// Streams see the change within a second (the dispatcher's
			// refresh, at once through this sidecar): acks from then on
			// are confirmed, or not.
			eod := in.GetEnableExactlyOnceDelivery()
			u.ExactlyOnce = &eod
		case "enable_message_ordering":
			return nil, invalid("update %s: enable_message_ordering cannot be changed after creation", name)
		case "filter":
			return nil, invalid("update %s: a subscription's filter cannot be changed after creation", name)
		case "topic", "name":
			return nil, invalid("update %s: a subscription's %s cannot be changed", name, p)
		case "detached":
			return nil, invalid("update %s: detached is set by DetachSubscription", name)
		case "bigquery_config", "cloud_storage_config", "bigtable_config":
			return nil, invalid("update %s: export subscriptions are not supported", name)
		case "message_transforms":
			return nil, invalid("update %s: message transforms are not supported", name)
		default:
			return nil, invalid("update %s: unknown field name %q in update_mask", name, p)
		}
	}
	if settingsChanged {
		if err := settings.check(); err != nil {
			return nil, err
		}
		u.ServiceSettings = settings.encode()
	}
	if settings.Push != nil && (settingsChanged || u.Labels != nil) {
		labels := cur.Labels
		if u.Labels != nil {
			labels = u.Labels
		}
		if err := s.checkPush(name, settings.Push, labels); err != nil {
			return nil, err
		}
		if err := s.indexPush(ctx, name); err != nil {
			return nil, err
		}
	}
	if _, err := sub.Update(ctx, u); err != nil {
		return nil, toStatus(err)
	}
	if d := s.dispatcherOf(name); d != nil {
		d.reload(ctx, sub) // this sidecar's streams see the change at once
	}
	if s.pusher != nil {
		s.pusher.poke(name)
	}
	s.activity.touch(name)
	return s.subscriptionProto(ctx, sub)
}

// DetachSubscription detaches a subscription from its topic: its unacked
// messages are dropped, it receives nothing more (Pull and StreamingPull
// answer FAILED_PRECONDITION), and it stays until deleted.
func (s *Server) DetachSubscription(ctx context.Context, req *pb.DetachSubscriptionRequest) (*pb.DetachSubscriptionResponse, error) {
	sub, err := s.subscriptionOf(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	if err := sub.Detach(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DetachSubscriptionResponse{}, nil
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
	subs, next, err := grpcutil.Page(subs, (*adapter.Subscription).ID, req.GetPageSize(), req.GetPageToken())
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
	s.unindexPush(ctx, req.GetSubscription(), 0)
	s.activity.forget(ctx, req.GetSubscription())
	return &emptypb.Empty{}, nil
}

// checkSubscriptionLabels checks labels as any resource's, and the values
// of the jetorder labels that are not checked with the delivery mode.
func checkSubscriptionLabels(labels map[string]string) error {
	if err := checkLabels(labels); err != nil {
		return err
	}
	if v, ok := labels[broker.LabelDIDComm]; ok && v != broker.DIDCommTrack {
		return invalid("label %s %q: the only value is %q (remove the label to stop tracking)", broker.LabelDIDComm, v, broker.DIDCommTrack)
	}
	if v, ok := labels[labelOrdering]; ok && v != string(StrictOrdering) && v != string(PipelinedOrdering) {
		return invalid("label %s %q: want %q or %q", labelOrdering, v, StrictOrdering, PipelinedOrdering)
	}
	if v, ok := labels[push.FormatLabel]; ok && v != push.FormatLabelCloudEvents {
		return invalid("label %s %q: the only value is %q", push.FormatLabel, v, push.FormatLabelCloudEvents)
	}
	return nil
}

// labelOrdering chooses when a key's next message goes to a client:
// StrictOrdering or PipelinedOrdering (Config.Ordering when absent).
const labelOrdering = "jetorder-ordering"

// Ordering is the value of labelOrdering and of Config.Ordering.
type Ordering string

const (
	// StrictOrdering sends a key's next message once the previous one is
	// acked (and JetStream has the ack).
	StrictOrdering Ordering = "strict"
	// PipelinedOrdering sends a key's messages to one stream without
	// waiting for acks, up to MaxOutstandingMessages of the key, as the
	// service does: for clients that run a key's handlers one at a time
	// (Go, Java, Python), not for Node's.
	PipelinedOrdering Ordering = "pipelined"
)

// pipelinedOrdering reports whether the subscription cfg is received with
// pipelined ordering: its label or the server's default asks for it, and
// the adapter pipelines it (an ordered, partitioned subscription without
// exactly-once delivery, adapter.PipelinedOrdering).
func (s *Server) pipelinedOrdering(cfg *adapter.SubscriptionConfig) bool {
	o, ok := cfg.Labels[labelOrdering]
	if !ok {
		o = string(s.cfg.Ordering)
	}
	return o == string(PipelinedOrdering) && cfg.EnableMessageOrdering &&
		cfg.Delivery == adapter.DeliveryPartitioned && !cfg.ExactlyOnce
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
	if _, has := cfg.Labels[labelOrdering]; has && !cfg.EnableMessageOrdering {
		return invalid("label %s applies to subscriptions with message ordering", labelOrdering)
	}
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
