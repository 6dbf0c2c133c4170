package iam

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Every method of the services the sidecar serves has a rule: a method
// without one would be refused to everyone.
func TestEveryMethodHasARule(t *testing.T) {
	for _, fd := range []protoreflect.FileDescriptor{pb.File_google_pubsub_v1_pubsub_proto, pb.File_google_pubsub_v1_schema_proto, iampb.File_google_iam_v1_iam_policy_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				if _, ok := rules[md.Input().FullName()]; !ok {
					t.Errorf("%s: no rule for its request %s", md.FullName(), md.Input().FullName())
				}
			}
		}
	}
}

// The predefined roles hold what Google's docs say they hold: spot checks
// of each role's defining grants and refusals.
func TestRoles(t *testing.T) {
	has := func(role, perm string) bool { return slices.Contains(Roles[role], perm) }
	if got := Roles["roles/pubsub.publisher"]; !slices.Equal(got, []string{TopicsPublish}) {
		t.Errorf("publisher = %v, want only %s", got, TopicsPublish)
	}
	if got := slices.Sorted(slices.Values(Roles["roles/pubsub.subscriber"])); !slices.Equal(got, []string{SnapshotsSeek, SubscriptionsConsume, TopicsAttachSubscription}) {
		t.Errorf("subscriber = %v", got)
	}
	for _, p := range []string{TopicsPublish, SubscriptionsConsume, TopicsCreate, TopicsGetIamPolicy} {
		if has("roles/pubsub.viewer", p) {
			t.Errorf("viewer has %s", p)
		}
	}
	for _, p := range []string{TopicsGetIamPolicy, TopicsSetIamPolicy, SchemasSetIamPolicy} {
		if has("roles/pubsub.editor", p) {
			t.Errorf("editor has %s", p)
		}
	}
	for _, p := range Permissions() {
		if !has("roles/pubsub.admin", p) {
			t.Errorf("admin lacks %s", p)
		}
	}
	for _, role := range []string{"roles/pubsub.viewer", "roles/pubsub.editor", "roles/pubsub.publisher", "roles/pubsub.subscriber"} {
		for _, p := range Roles[role] {
			if !has("roles/pubsub.admin", p) {
				t.Errorf("%s has %s, which admin lacks", role, p)
			}
		}
	}
}

func TestParseProjectPolicy(t *testing.T) {
	p, err := ParseProjectPolicy([]byte(`{
		"bindings": [{"role": "roles/pubsub.viewer", "members": ["user:v@example.com", "allAuthenticatedUsers"]},
		             {"role": "roles/pubsub.publisher", "members": ["allUsers"]}],
		"projects": {"blue": {"bindings": [{"role": "roles/pubsub.admin", "members": ["serviceAccount:ops"]}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		project, perm, principal string
		want                     bool
	}{
		{"any", TopicsList, "user:someone", true}, // allAuthenticatedUsers
		{"any", TopicsList, "", false},            // not anonymous
		{"any", TopicsPublish, "", true},          // allUsers
		{"blue", TopicsDelete, "serviceAccount:ops", true},
		{"green", TopicsDelete, "serviceAccount:ops", false},
		{"blue", TopicsDelete, "user:v@example.com", false},
	} {
		if got := p.allows(c.project, c.perm, c.principal); got != c.want {
			t.Errorf("allows(%s, %s, %q) = %v, want %v", c.project, c.perm, c.principal, got, c.want)
		}
	}
	for _, bad := range []struct{ policy, want string }{
		{`{"bindings":[{"role":"roles/pubsub.superuser","members":["user:a"]}]}`, `role "roles/pubsub.superuser" is not supported`},
		{`{"bindings":[{"role":"roles/pubsub.viewer","members":["group:ops@example.com"]}]}`, `member "group:ops@example.com" is not supported`},
		{`{"bindings":[{"role":"roles/pubsub.viewer","members":[]}]}`, "has no members"},
		{`{"bindings":[{"role":"roles/pubsub.viewer","members":["user:a"],"condition":{"expression":"true"}}]}`, "conditions are not supported"},
		{`{"bindigns":[]}`, "not a Policy"},
		{`{"projects":{"blue":{"bindings":[{"role":"roles/nope","members":["user:a"]}]}}}`, "project blue"},
		{`[]`, "not a policy"},
	} {
		if _, err := ParseProjectPolicy([]byte(bad.policy)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseProjectPolicy(%s) = %v, want an error with %q", bad.policy, err, bad.want)
		}
	}
}

// A domain:DOMAIN member grants to every user and service account whose
// address is in DOMAIN, whatever its case, and to no one in another
// domain, a subdomain, or without an address.
func TestDomainMembers(t *testing.T) {
	p, err := ParseProjectPolicy([]byte(`{"bindings": [
		{"role": "roles/pubsub.viewer", "members": ["domain:Example.COM"]},
		{"role": "roles/pubsub.publisher", "members": ["domain:robots.example.org"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		perm, principal string
		want            bool
	}{
		{TopicsGet, "user:alice@example.com", true},
		{TopicsGet, "user:Alice@EXAMPLE.com", true},
		{TopicsGet, "serviceAccount:ci@example.com", true},
		{TopicsGet, "user:a@b@example.com", true}, // the domain follows the last @
		{TopicsPublish, "user:alice@example.com", false},
		{TopicsPublish, "serviceAccount:bot@robots.example.org", true},
		{TopicsGet, "serviceAccount:bot@robots.example.org", false},
		{TopicsGet, "user:mallory@example.org", false},
		{TopicsGet, "user:x@sub.example.com", false},
		{TopicsGet, "user:x@example.com.evil.net", false},
		{TopicsGet, "user:x@notexample.com", false},
		{TopicsGet, "user:example.com", false},
		{TopicsGet, "user:alice@", false},
		{TopicsGet, "serviceAccount:system:serviceaccount:ns:example.com", false},
		{TopicsGet, "", false},
	} {
		if got := p.allows("any", c.perm, c.principal); got != c.want {
			t.Errorf("allows(%s, %q) = %v, want %v", c.perm, c.principal, got, c.want)
		}
	}
}

// Members: domains are taken, groups and other kinds refused with what is
// supported; a credential names no domain.
func TestMembers(t *testing.T) {
	for _, m := range []string{"user:a@example.com", "serviceAccount:ci", "domain:example.com", "domain:Example.com", AllUsers, AllAuthenticatedUsers} {
		if err := validMember(m); err != nil {
			t.Errorf("validMember(%q) = %v", m, err)
		}
	}
	for _, c := range []struct{ member, want string }{
		{"group:ops@example.com", "no directory to resolve a group's members"},
		{"domain:", "is not supported: use user:ID, serviceAccount:ID, domain:DOMAIN"},
		{"domain:alice@example.com", "want domain:DOMAIN"},
		{"domain:example .com", "want domain:DOMAIN"},
		{"principalSet://iam.googleapis.com/x", "is not supported: use"},
		{"deleted:user:a@example.com?uid=1", "is not supported: use"},
		{"alice", "is not supported: use"},
	} {
		if err := validMember(c.member); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validMember(%q) = %v, want an error with %q", c.member, err, c.want)
		}
	}
	for _, p := range []string{"domain:example.com", AllUsers} {
		if err := validPrincipal(p); err == nil || !strings.Contains(err.Error(), "a credential names one") {
			t.Errorf("validPrincipal(%q) = %v", p, err)
		}
	}
}

func TestTokensFile(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		p := filepath.Join(dir, "tokens")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hash := sha256.Sum256([]byte("hashed-token-of-the-ci-job"))
	tokens, err := loadTokens(write("# comment\n\nuser:alice@example.com plain-token-of-alice\nserviceAccount:ci sha256:" + hex.EncodeToString(hash[:]) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{
		"plain-token-of-alice":                  "user:alice@example.com",
		"hashed-token-of-the-ci-job":            "serviceAccount:ci",
		"plain-token-of-alicE":                  "",
		"sha256:" + hex.EncodeToString(hash[:]): "", // the hash is not the token
		"":                                      "",
	} {
		if got := tokens.principal(token); got != want {
			t.Errorf("principal(%q) = %q, want %q", token, got, want)
		}
	}
	for _, bad := range []struct{ content, want string }{
		{"user:a short\n", "shorter than 16"},
		{"alice a-long-enough-token-here\n", `member "alice" is not supported`},
		{"allUsers a-long-enough-token-here\n", "a credential names one"},
		{"user:a sha256:abcd\n", "64 hex digits"},
		{"user:a one-token-two-principals\nuser:b one-token-two-principals\n", "the same token as line 1"},
		{"user:a a-long-enough-token-here extra\n", "want PRINCIPAL TOKEN"},
		{"# nothing\n", "no tokens"},
	} {
		if _, err := loadTokens(write(bad.content)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("loadTokens(%q) = %v, want an error with %q", bad.content, err, bad.want)
		}
	}
}

// Authorize refuses a caller without credentials with UNAUTHENTICATED
// and one without the permission with PERMISSION_DENIED, in Google's
// words; DetachSubscription's permission is on the subscription's topic.
func TestAuthorize(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("user:pub a-publisher-token-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	projects, err := ParseProjectPolicy([]byte(`{"projects":{"p1":{"bindings":[{"role":"roles/pubsub.publisher","members":["user:pub"]},{"role":"roles/pubsub.editor","members":["user:ed"]}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{TokensFile: tokens, Projects: projects,
		TopicOf: func(_ context.Context, sub string) (string, error) { return "projects/p2/topics/other", nil }})
	if err != nil {
		t.Fatal(err)
	}
	pub := WithCaller(context.Background(), Caller{Principal: "user:pub"})
	ed := WithCaller(context.Background(), Caller{Principal: "user:ed"})
	anon := context.Background()
	for _, c := range []struct {
		name string
		ctx  context.Context
		req  interface{ ProtoReflect() protoreflect.Message }
		want codes.Code
	}{
		{"publish in p1", pub, &pb.PublishRequest{Topic: "projects/p1/topics/t"}, codes.OK},
		{"publish in p2", pub, &pb.PublishRequest{Topic: "projects/p2/topics/t"}, codes.PermissionDenied},
		{"publish anonymously", anon, &pb.PublishRequest{Topic: "projects/p1/topics/t"}, codes.Unauthenticated},
		{"create topic as publisher", pub, &pb.Topic{Name: "projects/p1/topics/t"}, codes.PermissionDenied},
		{"create topic as editor", ed, &pb.Topic{Name: "projects/p1/topics/t"}, codes.OK},
		{"create subscription to a topic in p2", ed, &pb.Subscription{Name: "projects/p1/subscriptions/s", Topic: "projects/p2/topics/t"}, codes.PermissionDenied},
		{"detach from a topic in p2", ed, &pb.DetachSubscriptionRequest{Subscription: "projects/p1/subscriptions/s"}, codes.PermissionDenied},
		{"a malformed name", ed, &pb.PublishRequest{Topic: "topics/t"}, codes.PermissionDenied},
	} {
		err := g.Authorize(c.ctx, c.name, c.req)
		if got := status.Code(err); got != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
		if c.want == codes.PermissionDenied && status.Convert(err).Message() != deniedText {
			t.Errorf("%s: message %q, want Google's %q", c.name, status.Convert(err).Message(), deniedText)
		}
	}
	var none *Guard
	if err := none.Authorize(anon, "Publish", &pb.PublishRequest{}); err != nil {
		t.Errorf("a nil Guard refused: %v", err)
	}
}

func TestEtags(t *testing.T) {
	for _, rev := range []uint64{0, 1, 1 << 40} {
		got, ok := revisionOf(etagOf(rev))
		if !ok || got != rev {
			t.Errorf("revisionOf(etagOf(%d)) = %d, %v", rev, got, ok)
		}
	}
	if _, ok := revisionOf([]byte("BwXyz")); ok {
		t.Error("a foreign etag was read as one of ours")
	}
}
