package googleclient

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"cloud.google.com/go/iam"
	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v, want %s", what, err, want)
	}
}

// A sidecar without access control serves the IAMPolicy service as
// Google's clients use it: the IAM handle of the v1 client's Topic.IAM()
// and the v2 admin clients' IAM methods set and read policies with
// Google's etags, TestPermissions answers every permission asked, and the
// policies enforce nothing.
func TestIAMWithoutAccessControl(t *testing.T) {
	t.Parallel()
	sc := itest.Start(t, sidecar.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := sc.GoClient()
	topic, sub := itest.TopicPath("iam-open"), itest.SubPath("iam-open")
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: sub, Topic: topic}); err != nil {
		t.Fatal(err)
	}

	// The topic's handle, as the v1 client's Topic.IAM() makes it.
	h := iam.InternalNewHandleGRPCClient(iampb.NewIAMPolicyClient(sc.Conn()), topic)
	policy, err := h.Policy(ctx)
	if err != nil {
		t.Fatalf("Policy: %v", err)
	}
	if len(policy.Roles()) != 0 {
		t.Errorf("a new topic's roles: %v, want none", policy.Roles())
	}
	const publisher iam.RoleName = "roles/pubsub.publisher"
	policy.Add("domain:example.com", iam.Viewer)
	policy.Add("user:alice@example.com", publisher)
	if err := h.SetPolicy(ctx, policy); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	got, err := h.Policy(ctx)
	if err != nil {
		t.Fatalf("Policy: %v", err)
	}
	if !slices.Equal(got.Members(iam.Viewer), []string{"domain:example.com"}) || !slices.Equal(got.Members(publisher), []string{"user:alice@example.com"}) {
		t.Errorf("policy read back: %v", got.InternalProto)
	}
	// policy still has the etag of the policy it was read from, which is
	// no longer the topic's.
	wantCode(t, "SetPolicy from a stale read", h.SetPolicy(ctx, policy), codes.Aborted)
	got.Add("group:ops@example.com", iam.Viewer)
	wantCode(t, "SetPolicy with a group", h.SetPolicy(ctx, got), codes.InvalidArgument)

	perms := []string{"pubsub.topics.get", "pubsub.topics.publish", "pubsub.topics.setIamPolicy"}
	if got, err := h.TestPermissions(ctx, perms); err != nil || !slices.Equal(got, perms) {
		t.Errorf("TestPermissions = %v, %v; want %v", got, err, perms)
	}
	_, err = iam.InternalNewHandleGRPCClient(iampb.NewIAMPolicyClient(sc.Conn()), itest.TopicPath("iam-missing")).Policy(ctx)
	wantCode(t, "Policy of a topic that does not exist", err, codes.NotFound)

	// Nothing is enforced: the policy grants publishing to alice alone,
	// and a client without credentials publishes.
	p := client.Publisher(topic)
	if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("x")}).Get(ctx); err != nil {
		t.Errorf("publish beside a policy that does not name the caller: %v", err)
	}
	p.Stop()

	// The subscription, through the v2 admin client's IAM methods.
	empty, err := client.SubscriptionAdminClient.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: sub})
	if err != nil || len(empty.GetBindings()) != 0 || string(empty.GetEtag()) != "\x00\x20\x01" {
		t.Fatalf("GetIamPolicy of a new subscription = %v, %v; want no bindings and etag ACAB", empty, err)
	}
	set, err := client.SubscriptionAdminClient.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: sub, Policy: &iampb.Policy{
		Etag: empty.GetEtag(), Bindings: []*iampb.Binding{{Role: "roles/pubsub.subscriber", Members: []string{"domain:example.com"}}}}})
	if err != nil || set.GetVersion() != 1 || len(set.GetBindings()) != 1 {
		t.Errorf("SetIamPolicy of the subscription = %v, %v", set, err)
	}
	tested, err := client.SubscriptionAdminClient.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: sub, Permissions: []string{"pubsub.subscriptions.consume"}})
	if err != nil || !slices.Equal(tested.GetPermissions(), []string{"pubsub.subscriptions.consume"}) {
		t.Errorf("TestIamPermissions of the subscription = %v, %v", tested, err)
	}

	// The REST route returns the topic's policy too.
	resp, err := http.Get(sc.HTTPURL() + "/v1/" + topic + ":getIamPolicy")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rest struct {
		Version  int
		Etag     string
		Bindings []struct {
			Role    string
			Members []string
		}
	}
	if err := json.Unmarshal(body, &rest); err != nil || resp.StatusCode != http.StatusOK || rest.Version != 1 || len(rest.Bindings) != 2 || rest.Etag == "" {
		t.Errorf("GET :getIamPolicy = %d %s", resp.StatusCode, body)
	}

	// A topic deleted and created again starts without a policy.
	if err := client.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if again, err := h.Policy(ctx); err != nil || len(again.Roles()) != 0 {
		t.Errorf("policy of the topic created again = %v, %v; want none", again, err)
	}
}
