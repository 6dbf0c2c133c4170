package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/keyrouter"
)

func TestTopicAndSubscriptionAdmin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.client.CreateTopicWithConfig(ctx, "topic-b", &adapter.TopicConfig{RetentionDuration: time.Hour}); err != nil {
		t.Fatal(err)
	}
	topicA := e.createTopic("topic-a")
	if ok, err := topicA.Exists(ctx); !ok || err != nil {
		t.Fatalf("Exists = %v, %v", ok, err)
	}
	if ok, err := e.client.Topic("missing").Exists(ctx); ok || err != nil {
		t.Fatalf("Exists(missing) = %v, %v", ok, err)
	}
	cfg, err := e.client.Topic("topic-b").Config(ctx)
	if err != nil || cfg.RetentionDuration != time.Hour {
		t.Fatalf("Config = %+v, %v", cfg, err)
	}
	// Another project's topics stay out of this project's list.
	_, other := e.connect()
	otherProject, err := adapter.NewClient(e.nc, "other-project")
	if err != nil || other == nil {
		t.Fatal(err)
	}
	if _, err := otherProject.CreateTopic(ctx, "topic-c"); err != nil {
		t.Fatal(err)
	}
	topics, err := e.client.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(topics, (*adapter.Topic).ID); got != "topic-a,topic-b" {
		t.Fatalf("Topics = %s", got)
	}

	subA := e.createSub("sub-a", adapter.SubscriptionConfig{Topic: topicA, EnableMessageOrdering: true, AckDeadline: 30 * time.Second})
	e.createSub("sub-b", adapter.SubscriptionConfig{Topic: topicA})
	scfg, err := subA.Config(ctx)
	if err != nil || !scfg.EnableMessageOrdering || scfg.AckDeadline != 30*time.Second || scfg.Topic.ID() != "topic-a" {
		t.Fatalf("sub Config = %+v, %v", scfg, err)
	}
	subs, err := e.client.Subscriptions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(subs, (*adapter.Subscription).ID); got != "sub-a,sub-b" {
		t.Fatalf("Subscriptions = %s", got)
	}
	if err := subA.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := subA.Exists(ctx); ok || err != nil {
		t.Fatalf("deleted subscription Exists = %v, %v", ok, err)
	}
	if err := topicA.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := topicA.Exists(ctx); ok {
		t.Fatal("deleted topic still exists")
	}
}

func ids[T any](items []T, id func(T) string) string {
	var s []string
	for _, it := range items {
		s = append(s, id(it))
	}
	return strings.Join(s, ",")
}

// Bad input gets an error matchable with errors.Is and changes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := e.createTopic("topic-1")
	e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic})
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"bad project", func() error { _, err := adapter.NewClient(e.nc, "bad project"); return err }, adapter.ErrInvalidProjectID},
		{"bad topic id", func() error { _, err := e.client.CreateTopic(ctx, "a*"); return err }, adapter.ErrInvalidTopicID},
		{"goog topic", func() error { _, err := e.client.CreateTopic(ctx, "goog-topic"); return err }, adapter.ErrInvalidTopicID},
		{"topic exists", func() error { _, err := e.client.CreateTopic(ctx, "topic-1"); return err }, adapter.ErrTopicExists},
		{"bad subscription id", func() error {
			_, err := e.client.CreateSubscription(ctx, "s>", adapter.SubscriptionConfig{Topic: topic})
			return err
		}, adapter.ErrInvalidSubscriptionID},
		{"subscription exists", func() error {
			_, err := e.client.CreateSubscription(ctx, "sub-1", adapter.SubscriptionConfig{Topic: topic})
			return err
		}, adapter.ErrSubscriptionExists},
		{"subscription to missing topic", func() error {
			_, err := e.client.CreateSubscription(ctx, "sub-2", adapter.SubscriptionConfig{Topic: e.client.Topic("nope")})
			return err
		}, adapter.ErrTopicNotFound},
		{"no topic", func() error {
			_, err := e.client.CreateSubscription(ctx, "sub-3", adapter.SubscriptionConfig{})
			return err
		}, adapter.ErrInvalidConfig},
		{"ack deadline too short", func() error {
			_, err := e.client.CreateSubscription(ctx, "sub-4", adapter.SubscriptionConfig{Topic: topic, AckDeadline: time.Millisecond})
			return err
		}, adapter.ErrInvalidConfig},
		{"ack deadline too long", func() error {
			_, err := e.client.CreateSubscription(ctx, "sub-5", adapter.SubscriptionConfig{Topic: topic, AckDeadline: time.Hour})
			return err
		}, adapter.ErrInvalidConfig},
		{"receive missing subscription", func() error {
			return e.client.Subscription("sub-404").Receive(ctx, func(context.Context, *adapter.Message) {})
		}, adapter.ErrSubscriptionNotFound},
		{"receive bad subscription id", func() error {
			return e.client.Subscription("x").Receive(ctx, func(context.Context, *adapter.Message) {})
		}, adapter.ErrInvalidSubscriptionID},
		{"publish to missing topic", func() error {
			_, err := e.client.Topic("nope").Publish(ctx, &adapter.Message{Data: []byte("x")}).Get(ctx)
			return err
		}, adapter.ErrTopicNotFound},
		{"too many attributes", func() error {
			attrs := map[string]string{}
			for i := range 101 {
				attrs[strings.Repeat("a", i+1)] = "v"
			}
			_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("x"), Attributes: attrs}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"reserved attribute", func() error {
			_, err := topic.Publish(ctx, &adapter.Message{Attributes: map[string]string{"googclient_x": "v"}}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"reserved header", func() error {
			_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("x"), Header: nats.Header{"Nats-Msg-Id": {"forged"}}}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"header with a line break", func() error {
			_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("x"), Header: nats.Header{"x-a": {"1\r\nNats-Msg-Id: forged"}}}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"nil message", func() error { _, err := topic.Publish(ctx, nil).Get(ctx); return err }, adapter.ErrInvalidMessage},
		{"oversized message", func() error {
			_, err := topic.Publish(ctx, &adapter.Message{Data: make([]byte, e.nc.MaxPayload()+1)}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"delete missing topic", func() error { return e.client.Topic("nope").Delete(ctx) }, adapter.ErrTopicNotFound},
		{"delete missing subscription", func() error { return e.client.Subscription("sub-404").Delete(ctx) }, adapter.ErrSubscriptionNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	// Nothing above stored a message or left a subscription behind.
	stream, err := jetstreamOf(t, e).Stream(ctx, keyrouter.StreamName(project, "topic-1"))
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("rejected input stored %d messages", n)
	}
	subs, err := e.client.Subscriptions(ctx)
	if err != nil || ids(subs, (*adapter.Subscription).ID) != "sub-1" {
		t.Fatalf("Subscriptions after bad input = %v, %v", ids(subs, (*adapter.Subscription).ID), err)
	}
}
