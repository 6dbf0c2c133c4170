package access

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Resource-level policies: SetIamPolicy grants a role on one topic, with
// Google's etag semantics, to a user or to a domain's users; the grant
// holds on another sidecar of the same JetStream, and goes with the topic
// when it is deleted.
func TestResourcePolicy(t *testing.T) {
	a := itest.NewAccess(t)
	var logs testutil.LogBuffer
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0"}, itest.WithAccess(a), itest.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := ctxT(t)
	admin := sc.ConnAs(a.Token("admin"))
	adminPub, adminIAM := pb.NewPublisherClient(admin), iampb.NewIAMPolicyClient(admin)
	none := sc.ConnAs(a.Token("none"))
	nonePub, noneIAM := pb.NewPublisherClient(none), iampb.NewIAMPolicyClient(none)
	for _, id := range []string{"granted", "other"} {
		if _, err := adminPub.CreateTopic(ctx, &pb.Topic{Name: topicPath(id)}); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(pc pb.PublisherClient, id string) error {
		_, err := pc.Publish(ctx, &pb.PublishRequest{Topic: topicPath(id), Messages: []*pb.PubsubMessage{{Data: []byte("x")}}})
		return err
	}
	wantCode(t, "publish before the grant", publish(nonePub, "granted"), codes.PermissionDenied)

	empty, err := adminIAM.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topicPath("granted")})
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.GetBindings()) != 0 || !bytes.Equal(empty.GetEtag(), []byte{0x00, 0x20, 0x01}) {
		t.Errorf("policy of a topic without one = %v, want no bindings and etag ACAB", empty)
	}
	grant := &iampb.Policy{Etag: empty.GetEtag(), Bindings: []*iampb.Binding{{Role: "roles/pubsub.publisher", Members: []string{itest.AccessPrincipal("none")}}}}
	set, err := adminIAM.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("granted"), Policy: grant})
	if err != nil {
		t.Fatalf("SetIamPolicy: %v", err)
	}
	if bytes.Equal(set.GetEtag(), empty.GetEtag()) || len(set.GetBindings()) != 1 || set.GetVersion() != 1 {
		t.Errorf("SetIamPolicy = %v, want the binding, version 1 and a new etag", set)
	}
	if err := publish(nonePub, "granted"); err != nil {
		t.Errorf("publish after the grant: %v", err)
	}
	wantCode(t, "publish to another topic", publish(nonePub, "other"), codes.PermissionDenied)
	got, err := noneIAM.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topicPath("granted"), Permissions: []string{"pubsub.topics.publish", "pubsub.topics.get"}})
	if err != nil || !slices.Equal(got.GetPermissions(), []string{"pubsub.topics.publish"}) {
		t.Errorf("TestIamPermissions = %v, %v; want [pubsub.topics.publish]", got, err)
	}
	_, err = noneIAM.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topicPath("granted")})
	wantCode(t, "GetIamPolicy without pubsub.topics.getIamPolicy", err, codes.PermissionDenied)

	// The etag the grant was made from is stale now: a second
	// read-modify-write from it would lose the first.
	_, err = adminIAM.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("granted"), Policy: grant})
	wantCode(t, "SetIamPolicy with a stale etag", err, codes.Aborted)
	_, err = adminIAM.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("granted"),
		Policy: &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.publishr", Members: []string{"user:x"}}}}})
	wantCode(t, "SetIamPolicy with an unknown role", err, codes.InvalidArgument)
	_, err = adminIAM.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("missing"), Policy: grant})
	wantCode(t, "SetIamPolicy on a topic that does not exist", err, codes.NotFound)
	_, err = iampb.NewIAMPolicyClient(sc.ConnAs(a.Token("viewer"))).SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("missing"), Policy: grant})
	wantCode(t, "a viewer's SetIamPolicy on a topic that does not exist", err, codes.PermissionDenied)
	if !strings.Contains(logs.String(), "policy changed") || !strings.Contains(logs.String(), "roles/pubsub.publisher="+itest.AccessPrincipal("none")) {
		t.Errorf("no audit line for the policy change:\n%s", logs.String())
	}

	// A domain member grants to the users of that domain (whatever its
	// case), and only to them.
	setOther := func(member string) {
		t.Helper()
		cur, err := adminIAM.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topicPath("other")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := adminIAM.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topicPath("other"), Policy: &iampb.Policy{
			Etag: cur.GetEtag(), Bindings: []*iampb.Binding{{Role: "roles/pubsub.publisher", Members: []string{member}}}}}); err != nil {
			t.Fatalf("SetIamPolicy with %s: %v", member, err)
		}
	}
	setOther("domain:example.org")
	wantCode(t, "publish with a grant to another domain", publish(nonePub, "other"), codes.PermissionDenied)
	setOther("domain:EXAMPLE.com") // the principal is user:none@example.com
	if err := publish(nonePub, "other"); err != nil {
		t.Errorf("publish with a grant to the caller's domain: %v", err)
	}

	// Another sidecar on the same JetStream holds the grant.
	second := itest.Start(t, sidecar.Config{NATSURL: sc.NATS}, itest.WithAccess(a))
	secondPub := pb.NewPublisherClient(second.ConnAs(a.Token("none")))
	if err := publish(secondPub, "granted"); err != nil {
		t.Errorf("publish through a second sidecar: %v", err)
	}

	// A deleted topic's policy goes with it: a new topic of the same name
	// starts without one, on both sidecars.
	if _, err := adminPub.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topicPath("granted")}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminPub.CreateTopic(ctx, &pb.Topic{Name: topicPath("granted")}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "publish to the topic created again", publish(nonePub, "granted"), codes.PermissionDenied)
	deadline := time.Now().Add(10 * time.Second)
	for publish(secondPub, "granted") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the second sidecar still grants the deleted topic's policy after 10s")
		}
		time.Sleep(20 * time.Millisecond) // polling the watch, not synchronising
	}
}

// With per-project bindings, the status page shows each caller only the
// projects where it may list topics and subscriptions, and refuses a
// caller who may list nothing.
func TestStatusShowsWhatTheCallerMayList(t *testing.T) {
	a := itest.NewAccess(t)
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{
		"bindings": [{"role": "roles/pubsub.admin", "members": ["`+itest.AccessPrincipal("admin")+`"]}],
		"projects": {"blue": {"bindings": [{"role": "roles/pubsub.viewer", "members": ["`+itest.AccessPrincipal("viewer")+`"]}]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := itest.Start(t, sidecar.Config{IAMPolicy: policy}, itest.WithAccess(a))
	// WithAccess's own policy file is replaced by the one above.
	ctx := ctxT(t)
	adminPub := pb.NewPublisherClient(sc.ConnAs(a.Token("admin")))
	for _, name := range []string{"projects/blue/topics/blue-topic", topicPath("test-topic")} {
		if _, err := adminPub.CreateTopic(ctx, &pb.Topic{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	hc := sc.HTTPClient()
	topicsSeen := func(role string) (int, []string) {
		code, body := httpDo(t, hc, "GET", sc.HTTPURL()+"/v1/status", a.Token(role), "")
		if code != http.StatusOK {
			return code, nil
		}
		var st struct {
			Topics []struct{ Name string } `json:"topics"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("status of %s: %v", role, err)
		}
		var names []string
		for _, tp := range st.Topics {
			names = append(names, tp.Name)
		}
		slices.Sort(names)
		return code, names
	}
	// The status reads JetStream in the background: poll until the admin
	// sees both topics.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, names := topicsSeen("admin"); len(names) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the admin's status never listed both topics")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, names := topicsSeen("viewer"); code != http.StatusOK || !slices.Equal(names, []string{"projects/blue/topics/blue-topic"}) {
		t.Errorf("the blue viewer's status: %d %v, want only blue's topic", code, names)
	}
	if code, _ := topicsSeen("publisher"); code != http.StatusForbidden {
		t.Errorf("status for a caller who may list nothing: %d, want 403", code)
	}
	if code, _ := httpDo(t, hc, "GET", sc.HTTPURL()+"/v1/status", "", ""); code != http.StatusUnauthorized {
		t.Errorf("status without a token: %d, want 401", code)
	}
}
