package httpapi_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/internal/httpapi"
)

// recordingIAM answers every IAMPolicy call and records which it got.
type recordingIAM struct {
	iampb.UnimplementedIAMPolicyServer
	mu    sync.Mutex
	calls []string
	done  []string
}

func (r *recordingIAM) record(method, resource string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, method+" "+resource)
}

func (r *recordingIAM) GetIamPolicy(_ context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	r.record("GetIamPolicy", req.GetResource())
	return &iampb.Policy{Etag: []byte("e")}, nil
}

func (r *recordingIAM) SetIamPolicy(_ context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	r.record("SetIamPolicy", req.GetResource())
	return req.GetPolicy(), nil
}

func (r *recordingIAM) TestIamPermissions(_ context.Context, req *iampb.TestIamPermissionsRequest) (*iampb.TestIamPermissionsResponse, error) {
	r.record("TestIamPermissions", req.GetResource())
	return &iampb.TestIamPermissionsResponse{Permissions: req.GetPermissions()}, nil
}

// Done records the requests of REST calls that succeeded, by type.
func (r *recordingIAM) Done(_ context.Context, req proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = append(r.done, string(req.ProtoReflect().Descriptor().Name()))
}

// The IAM service is told of the REST calls that succeeded, deletions
// included (it drops a deleted resource's policy), and not of those that
// failed.
func TestRESTIAMDone(t *testing.T) {
	rec := &recordingIAM{}
	e := newRESTEnv(t, httpapi.Config{IAM: rec})
	e.ok(t, http.MethodPut, "topics/doomed", `{}`, &pb.Topic{})
	e.ok(t, http.MethodDelete, "topics/doomed", "", &emptypb.Empty{})
	e.fails(t, http.MethodDelete, "topics/doomed", "", http.StatusNotFound, "NOT_FOUND")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []string{"Topic", "DeleteTopicRequest"}; !slices.Equal(rec.done, want) {
		t.Errorf("Done of %q, want %q", rec.done, want)
	}
}

// The IAMPolicy verbs are routed on every kind of resource, topics too
// (whose {topic}:{verb} segment is shared with :publish), in the methods
// and bodies gcloud sends: getIamPolicy as GET with no body (and POST),
// setIamPolicy and testIamPermissions as POST.
func TestRESTIAMRoutes(t *testing.T) {
	rec := &recordingIAM{}
	e := newRESTEnv(t, httpapi.Config{IAM: rec})
	var want []string
	for _, kind := range []string{"topics", "subscriptions", "snapshots", "schemas"} {
		res := kind + "/iam-res"
		name := "projects/" + restProject + "/" + res
		e.ok(t, http.MethodGet, res+":getIamPolicy", "", &iampb.Policy{})
		e.ok(t, http.MethodPost, res+":getIamPolicy", `{}`, &iampb.Policy{})
		e.ok(t, http.MethodPost, res+":setIamPolicy", `{"policy": {"bindings": [{"role": "roles/pubsub.viewer", "members": ["user:a@example.com"]}]}}`, &iampb.Policy{})
		e.ok(t, http.MethodPost, res+":testIamPermissions", `{"permissions": ["pubsub.topics.get"]}`, &iampb.TestIamPermissionsResponse{})
		want = append(want, "GetIamPolicy "+name, "GetIamPolicy "+name, "SetIamPolicy "+name, "TestIamPermissions "+name)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.calls) != len(want) {
		t.Fatalf("calls %q, want %q", rec.calls, want)
	}
	for i := range want {
		if rec.calls[i] != want[i] {
			t.Errorf("call %d: %q, want %q", i, rec.calls[i], want[i])
		}
	}
	// :publish stays the HTTP API's; an unknown verb is still refused.
	e.fails(t, http.MethodPost, "topics/iam-res:frobnicate", `{}`, http.StatusNotFound, "NOT_FOUND")
	e.fails(t, http.MethodPut, "topics/iam-res:setIamPolicy", `{}`, http.StatusMethodNotAllowed, "UNIMPLEMENTED")
}
