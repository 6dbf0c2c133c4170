package resources

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/internal/pubsubapi"
)

// plan sets what the file gives on the existing subscription and names
// the fields that then differ; what the API filled in and the file leaves
// out is kept; what cannot change is refused with its line.
func TestPlanSubscription(t *testing.T) {
	sec := func(n int) *durationpb.Duration { return durationpb.New(time.Duration(n) * time.Second) }
	existing := func() *pb.Subscription {
		return &pb.Subscription{
			Name: "projects/p/subscriptions/s", Topic: "projects/p/topics/t", EnableMessageOrdering: true, AckDeadlineSeconds: 10,
			Labels:           map[string]string{"a": "b", "jetorder-delivery": "partitioned"},
			RetryPolicy:      &pb.RetryPolicy{MinimumBackoff: sec(1), MaximumBackoff: sec(600)},
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: "projects/p/topics/dl", MaxDeliveryAttempts: 5},
			PushConfig:       &pb.PushConfig{PushEndpoint: "http://127.0.0.1:9/", Wrapper: &pb.PushConfig_PubsubWrapper_{PubsubWrapper: &pb.PushConfig_PubsubWrapper{}}},
		}
	}
	for _, tc := range []struct {
		name, decl string
		change     func(*pb.Subscription) // the existing one, when not the above
		mask       []string
		want       func(*pb.Subscription) // the planned one: existing changed so
		fixed      string                 // a refusal
	}{
		{name: "same", decl: "{topic: t, enableMessageOrdering: true, ackDeadlineSeconds: 10, labels: {a: b}}"},
		{name: "defaults the file leaves out", decl: "{topic: t, retryPolicy: {minimumBackoff: 1s}, deadLetterPolicy: {deadLetterTopic: dl}, pushConfig: {pushEndpoint: 'http://127.0.0.1:9/'}}"},
		{name: "part of a policy", decl: "{topic: t, retryPolicy: {maximumBackoff: 30s}}", mask: []string{"retry_policy"},
			want: func(s *pb.Subscription) { s.RetryPolicy.MaximumBackoff = sec(30) }},
		{name: "labels keep those of creation", decl: "{topic: t, labels: {a: c}, ackDeadlineSeconds: 20}", mask: []string{"labels", "ack_deadline_seconds"},
			want: func(s *pb.Subscription) { s.Labels["a"], s.AckDeadlineSeconds = "c", 20 }},
		{name: "no labels but those of creation", decl: "{topic: t, labels: null}", mask: []string{"labels"},
			want: func(s *pb.Subscription) { delete(s.Labels, "a") }},
		{name: "null removes", decl: "{topic: t, deadLetterPolicy: null, retryPolicy: ~}", mask: []string{"dead_letter_policy", "retry_policy"},
			want: func(s *pb.Subscription) { s.DeadLetterPolicy, s.RetryPolicy = nil, nil }},
		{name: "present but empty", decl: "{topic: t, expirationPolicy: {}}", mask: []string{"expiration_policy"},
			want: func(s *pb.Subscription) { s.ExpirationPolicy = &pb.ExpirationPolicy{} }},
		{name: "the other wrapper", decl: "{topic: t, pushConfig: {noWrapper: {writeMetadata: true}}}", mask: []string{"push_config"},
			want: func(s *pb.Subscription) {
				s.PushConfig.Wrapper = &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}}
			}},
		{name: "ordering", decl: "{topic: t, enableMessageOrdering: false}", fixed: `r.yaml:5: subscription "s": enableMessageOrdering cannot change after creation: the subscription has true, the file false`},
		{name: "topic", decl: "{topic: u}", fixed: `r.yaml:5: subscription "s": topic cannot change after creation: the subscription has "projects/p/topics/t", the file "projects/p/topics/u"`},
		{name: "filter", decl: "{topic: t, filter: 'attributes:x'}", fixed: `filter cannot change after creation: the subscription has "", the file "attributes:x"`},
		{name: "delivery label", decl: "{topic: t, labels: {jetorder-delivery: per-key}}", fixed: `label jetorder-delivery is read only at creation: the subscription has "partitioned", the file "per-key"`},
		{name: "partitions label it lacks", decl: "{topic: t, labels: {jetorder-partitions: '16'}}", fixed: `label jetorder-partitions is read only at creation: the subscription has none, the file "16"`},
		{name: "partitions label it has", decl: "{topic: t, labels: {a: b, jetorder-partitions: '16'}}",
			change: func(s *pb.Subscription) { s.Labels["jetorder-partitions"] = "16" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("r.yaml", []byte("projects:\n  p:\n    subscriptions:\n\n      s: "+tc.decl+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			cur := existing()
			if tc.change != nil {
				tc.change(cur)
			}
			d := f.Subscriptions[0]
			got, mask, err := plan(f, d.Decl, "subscription", cur, d.Subscription, pubsubapi.SubscriptionCreationLabels(), fixedSubscriptionFields)
			if tc.fixed != "" {
				if !errors.Is(err, ErrFixed) || !strings.Contains(err.Error(), tc.fixed) {
					t.Fatalf("plan: %v, want ErrFixed: %s", err, tc.fixed)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mask, tc.mask) {
				t.Errorf("mask %v, want %v", mask, tc.mask)
			}
			want := proto.CloneOf(cur)
			if tc.want != nil {
				tc.want(want)
			}
			if !proto.Equal(got, want) {
				t.Errorf("planned\n %v\nwant\n %v", got, want)
			}
			if !proto.Equal(cur, existing()) && tc.change == nil {
				t.Errorf("plan changed the existing subscription: %v", cur)
			}
		})
	}
}

// A topic without jetorder-key-streams has one key stream: the file may
// say so; it may not ask for more.
func TestPlanTopicKeyStreams(t *testing.T) {
	for _, tc := range []struct {
		label, has string // has "": the topic carries no label
		mask       []string
		fixed      bool
	}{
		{label: "1"},
		{label: "4", has: "4"},
		{label: "4", fixed: true},
		{label: "1", has: "4", fixed: true},
	} {
		f, err := Parse("r.yaml", []byte("projects: {p: {topics: {t: {labels: {jetorder-key-streams: '"+tc.label+"'}}}}}"))
		if err != nil {
			t.Fatal(err)
		}
		cur := &pb.Topic{Name: "projects/p/topics/t"}
		if tc.has != "" {
			cur.Labels = map[string]string{"jetorder-key-streams": tc.has}
		}
		d := f.Topics[0]
		_, mask, err := plan(f, d.Decl, "topic", cur, d.Topic, pubsubapi.TopicCreationLabels(), nil)
		if errors.Is(err, ErrFixed) != tc.fixed || len(mask) != 0 {
			t.Errorf("label %q on a topic with %q: mask %v, err %v; want refused: %v", tc.label, tc.has, mask, err, tc.fixed)
		}
	}
}
