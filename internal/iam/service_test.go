package iam

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/testutil"
)

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v, want %s", what, err, want)
	}
}

// Without access control the service keeps and returns policies as with
// it (etags, version 1, NOT_FOUND for a resource that does not exist),
// and answers every Pub/Sub permission to TestIamPermissions. The bucket
// is created by the first policy set, not by reads; a deleted resource
// loses its policy.
func TestOpenService(t *testing.T) {
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, missing = "projects/p/topics/t", "projects/p/topics/missing"
	exists := func(_ context.Context, r string) error {
		if r == missing {
			return status.Error(codes.NotFound, "Resource not found (resource="+r+").")
		}
		return nil
	}
	open := func() *Service {
		l := NewLazyStore(js, 1, nil)
		t.Cleanup(l.Close)
		return OpenService(l, exists, nil)
	}
	svc := open()
	bucket := func() bool {
		_, err := js.KeyValue(ctx, PolicyBucket)
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	empty, err := svc.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.GetBindings()) != 0 || !bytes.Equal(empty.GetEtag(), emptyEtag) || empty.GetVersion() != 0 {
		t.Errorf("policy of a topic without one = %v, want no bindings and etag ACAB", empty)
	}
	svc.Done(ctx, &pb.DeleteTopicRequest{Topic: topic})
	if bucket() {
		t.Errorf("reading a policy and deleting a topic created bucket %s", PolicyBucket)
	}

	grant := &iampb.Policy{Etag: empty.GetEtag(), Bindings: []*iampb.Binding{
		{Role: "roles/viewer", Members: []string{"domain:example.com"}},
		{Role: "roles/pubsub.publisher", Members: []string{"user:b@example.com", "user:a@example.com"}},
	}}
	set, err := svc.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: grant})
	if err != nil {
		t.Fatalf("SetIamPolicy: %v", err)
	}
	if set.GetVersion() != 1 || bytes.Equal(set.GetEtag(), emptyEtag) || len(set.GetBindings()) != 2 ||
		set.GetBindings()[0].GetRole() != "roles/pubsub.publisher" || !slices.Equal(set.GetBindings()[0].GetMembers(), []string{"user:a@example.com", "user:b@example.com"}) {
		t.Errorf("SetIamPolicy = %v, want version 1, a new etag and the bindings sorted", set)
	}
	if !bucket() {
		t.Errorf("SetIamPolicy did not create bucket %s", PolicyBucket)
	}
	got, err := svc.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if err != nil || !bytes.Equal(got.GetEtag(), set.GetEtag()) || got.GetVersion() != 1 || len(got.GetBindings()) != 2 {
		t.Errorf("GetIamPolicy = %v, %v; want what SetIamPolicy returned", got, err)
	}
	// Another sidecar reads the bucket on its first call.
	if got, err := open().GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic}); err != nil || !bytes.Equal(got.GetEtag(), set.GetEtag()) {
		t.Errorf("GetIamPolicy through another service = %v, %v; want the policy set", got, err)
	}

	_, err = svc.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: grant})
	wantCode(t, "SetIamPolicy with a stale etag", err, codes.Aborted)
	_, err = svc.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: &iampb.Policy{
		Bindings: []*iampb.Binding{{Role: "roles/viewer", Members: []string{"group:ops@example.com"}}}}})
	wantCode(t, "SetIamPolicy with a group", err, codes.InvalidArgument)
	_, err = svc.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: missing, Policy: &iampb.Policy{}})
	wantCode(t, "SetIamPolicy of a topic that does not exist", err, codes.NotFound)
	_, err = svc.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: missing})
	wantCode(t, "GetIamPolicy of a topic that does not exist", err, codes.NotFound)
	_, err = svc.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: "projects/p"})
	wantCode(t, "GetIamPolicy of a project", err, codes.InvalidArgument)

	// A caller without credentials, whom the policy names nowhere, has
	// every permission it asks for: nothing is enforced.
	perms := []string{TopicsGet, TopicsPublish, TopicsSetIamPolicy, TopicsDelete}
	tested, err := svc.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topic, Permissions: perms})
	if err != nil || !slices.Equal(tested.GetPermissions(), perms) {
		t.Errorf("TestIamPermissions = %v, %v; want %v", tested, err, perms)
	}
	_, err = svc.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topic, Permissions: []string{"pubsub.topics.frobnicate"}})
	wantCode(t, "TestIamPermissions of an unknown permission", err, codes.InvalidArgument)

	// Emptied, the policy stays, with no bindings.
	cleared, err := svc.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: &iampb.Policy{Etag: got.GetEtag()}})
	if err != nil || len(cleared.GetBindings()) != 0 || cleared.GetVersion() != 1 {
		t.Errorf("SetIamPolicy without bindings = %v, %v", cleared, err)
	}

	svc.Done(ctx, &pb.DeleteTopicRequest{Topic: topic})
	after, err := svc.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if err != nil || len(after.GetBindings()) != 0 || !bytes.Equal(after.GetEtag(), emptyEtag) {
		t.Errorf("policy of a deleted topic = %v, %v; want none (etag ACAB)", after, err)
	}
}

// A closed LazyStore opens no more.
func TestLazyStoreClosed(t *testing.T) {
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	l := NewLazyStore(js, 1, nil)
	if _, err := l.Open(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if s, err := l.Open(context.Background(), true); err == nil {
		t.Errorf("Open after Close = %v, want an error", s)
	}
	_, err = OpenService(l, nil, nil).GetIamPolicy(context.Background(), &iampb.GetIamPolicyRequest{Resource: "projects/p/topics/t"})
	wantCode(t, "GetIamPolicy with the store closed", err, codes.Unavailable)
}
