package access

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// gcloudCLI runs Google's CLI against a sidecar with access control over
// HTTPS: the sidecar's REST API as gcloud's pubsub endpoint, its test CA
// as gcloud's CA file, and a role's token as its access token.
type gcloudCLI struct {
	t      *testing.T
	env    []string
	tokens string // directory of the token files, one per role
}

func newGcloud(t *testing.T, sc *itest.Sidecar, a *itest.Access) *gcloudCLI {
	t.Helper()
	if _, err := exec.LookPath("gcloud"); err != nil {
		t.Skip("gcloud is not installed")
	}
	g := &gcloudCLI{t: t, tokens: t.TempDir()}
	for _, role := range itest.AccessRoles {
		if err := os.WriteFile(filepath.Join(g.tokens, role), []byte(a.Token(role)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range os.Environ() {
		// Python's requests takes REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE
		// over gcloud's own CA file; no CLOUDSDK_ setting of the user's
		// applies.
		if !strings.HasPrefix(e, "CLOUDSDK_") && !strings.HasPrefix(e, "REQUESTS_CA_BUNDLE=") && !strings.HasPrefix(e, "CURL_CA_BUNDLE=") {
			g.env = append(g.env, e)
		}
	}
	g.env = append(g.env,
		"CLOUDSDK_CONFIG="+t.TempDir(), // no user's configuration, none written
		"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB="+sc.HTTPURL()+"/",
		"CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE="+a.Certs.CA,
		"CLOUDSDK_CORE_DISABLE_PROMPTS=1",
		"CLOUDSDK_CORE_DISABLE_USAGE_REPORTING=true",
		"CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK=true",
	)
	return g
}

// run runs gcloud pubsub args as role ("" without any credentials) and
// returns its stdout and stderr, failing the test unless it fails exactly
// when fail says.
func (g *gcloudCLI) run(role string, fail bool, args ...string) (stdout, stderr string) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append(append([]string{"pubsub"}, args...), "--project="+itest.Project, "--quiet", "--format=json")
	env := g.env
	if role == "" {
		env = append(slices.Clip(env), "CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true")
	} else {
		args = append(args, "--access-token-file="+filepath.Join(g.tokens, role))
	}
	cmd := exec.CommandContext(ctx, "gcloud", args...)
	cmd.Env = env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if (err != nil) != fail {
		g.t.Fatalf("gcloud %s as %q: %v (want failure: %v)\n%s%s", strings.Join(args, " "), role, err, fail, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

// ok runs a command that must succeed as role and decodes the JSON it
// printed into out, zeroed first.
func (g *gcloudCLI) ok(role string, out any, args ...string) {
	g.t.Helper()
	stdout, stderr := g.run(role, false, args...)
	if out == nil {
		return
	}
	reflect.ValueOf(out).Elem().SetZero()
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		g.t.Fatalf("gcloud pubsub %s: output %q: %v\n%s", strings.Join(args, " "), stdout, err, stderr)
	}
}

// fails runs a command that must fail as role, with --log-http: the
// response's status line is in what it returns, with gcloud's error.
func (g *gcloudCLI) fails(role string, args ...string) string {
	g.t.Helper()
	stdout, stderr := g.run(role, true, append(args, "--log-http")...)
	return stdout + stderr
}

type gcloudPolicy struct {
	Bindings []struct {
		Role    string   `json:"role"`
		Members []string `json:"members"`
	} `json:"bindings"`
	Etag string `json:"etag"`
}

func (p gcloudPolicy) has(role, member string) bool {
	for _, b := range p.Bindings {
		if b.Role == role && slices.Contains(b.Members, member) {
			return true
		}
	}
	return false
}

type gcloudReceived struct {
	AckStatus string `json:"ackStatus"`
	Message   struct {
		Data        string `json:"data"`
		OrderingKey string `json:"orderingKey"`
	} `json:"message"`
}

// named is what describe and list print of a resource, and what create
// prints of topics, subscriptions and schemas.
type named struct {
	Name                  string `json:"name"`
	Topic                 string `json:"topic"`
	EnableMessageOrdering bool   `json:"enableMessageOrdering"`
	Type                  string `json:"type"`
}

func names(list []named) []string {
	var out []string
	for _, n := range list {
		out = append(out, n.Name)
	}
	return out
}

// gcloud with tokens over TLS: the admin manages topics, subscriptions,
// snapshots, schemas and their policies; a policy on a topic lets a
// principal without any project role publish to it, and to it alone; the
// viewer may neither create nor read policies (403); no credentials is 401.
func TestGcloudWithAccess(t *testing.T) {
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	g := newGcloud(t, sc, a)
	start := time.Now()
	defer func() { t.Logf("gcloud commands took %v", time.Since(start).Round(time.Millisecond)) }()
	const admin, none = "admin", "none"
	topicA, topicB, sub, snap, schema := topicPath("gc-orders"), topicPath("gc-other"), subPath("gc-orders-sub"),
		"projects/"+itest.Project+"/snapshots/gc-snap", "projects/"+itest.Project+"/schemas/gc-schema"

	// Topics, subscriptions, schemas.
	var created []named
	g.ok(admin, &created, "topics", "create", "gc-orders", "gc-other")
	if got := names(created); !slices.Equal(got, []string{topicA, topicB}) {
		t.Errorf("topics create: %q", got)
	}
	var one named
	g.ok(admin, &one, "topics", "describe", "gc-orders")
	if one.Name != topicA {
		t.Errorf("topics describe: %+v", one)
	}
	var list []named
	g.ok(admin, &list, "topics", "list")
	if got := names(list); !slices.Contains(got, topicA) || !slices.Contains(got, topicB) {
		t.Errorf("topics list: %q", got)
	}
	g.ok(admin, &created, "subscriptions", "create", "gc-orders-sub", "--topic=gc-orders", "--enable-message-ordering")
	if len(created) != 1 || created[0].Name != sub || created[0].Topic != topicA || !created[0].EnableMessageOrdering {
		t.Errorf("subscriptions create: %+v", created)
	}
	g.ok(admin, &one, "subscriptions", "describe", "gc-orders-sub")
	if one.Name != sub || one.Topic != topicA {
		t.Errorf("subscriptions describe: %+v", one)
	}
	g.ok(admin, &list, "subscriptions", "list")
	if got := names(list); !slices.Equal(got, []string{sub}) {
		t.Errorf("subscriptions list: %q", got)
	}
	g.ok(admin, &one, "schemas", "create", "gc-schema", "--type=avro",
		`--definition={"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}`)
	if one.Name != schema || one.Type != "AVRO" {
		t.Errorf("schemas create: %+v", one)
	}
	g.ok(admin, &one, "schemas", "describe", "gc-schema")
	if one.Name != schema {
		t.Errorf("schemas describe: %+v", one)
	}
	g.ok(admin, &list, "schemas", "list")
	if got := names(list); !slices.Equal(got, []string{schema}) {
		t.Errorf("schemas list: %q", got)
	}

	// A topic's policy: none may publish to gc-orders once the admin
	// grants it the publisher role there, and not to gc-other.
	var pol gcloudPolicy
	g.ok(admin, &pol, "topics", "get-iam-policy", "gc-orders")
	if len(pol.Bindings) != 0 || pol.Etag == "" {
		t.Errorf("topics get-iam-policy of a new topic: %+v", pol)
	}
	member := itest.AccessPrincipal(none)
	g.ok(admin, &pol, "topics", "add-iam-policy-binding", "gc-orders", "--member="+member, "--role=roles/pubsub.publisher")
	if !pol.has("roles/pubsub.publisher", member) {
		t.Errorf("topics add-iam-policy-binding: %+v", pol)
	}
	g.ok(admin, &pol, "topics", "get-iam-policy", "gc-orders")
	if !pol.has("roles/pubsub.publisher", member) {
		t.Errorf("topics get-iam-policy after add-iam-policy-binding: %+v", pol)
	}
	before := time.Now().Add(-time.Second)
	var published struct {
		MessageIDs []string `json:"messageIds"`
	}
	g.ok(none, &published, "topics", "publish", "gc-orders", "--message=first", "--ordering-key=k1")
	if len(published.MessageIDs) != 1 {
		t.Errorf("topics publish as %s: %+v", none, published)
	}
	out := g.fails(none, "topics", "publish", "gc-other", "--message=no")
	mustContain(t, "publish as none to a topic without its binding", out, "status: 403")
	mustContain(t, "publish as none to a topic without its binding", out, "PERMISSION_DENIED")

	// Receiving, seeking, snapshots.
	pull := func(what string) {
		t.Helper()
		var got []gcloudReceived
		g.ok(admin, &got, "subscriptions", "pull", "gc-orders-sub", "--auto-ack", "--limit=10")
		if len(got) != 1 || got[0].Message.Data != base64.StdEncoding.EncodeToString([]byte("first")) ||
			got[0].Message.OrderingKey != "k1" || got[0].AckStatus != "SUCCESS" {
			t.Errorf("subscriptions pull %s: %+v", what, got)
		}
	}
	pull("")
	g.ok(admin, nil, "subscriptions", "seek", "gc-orders-sub", "--time="+before.UTC().Format(time.RFC3339))
	pull("after seek to before the publish")
	g.ok(admin, &created, "snapshots", "create", "gc-snap", "--subscription=gc-orders-sub")
	g.ok(admin, &one, "snapshots", "describe", "gc-snap")
	if one.Name != snap || one.Topic != topicA {
		t.Errorf("snapshots describe: %+v", one)
	}
	g.ok(admin, &list, "snapshots", "list")
	if len(list) != 1 {
		t.Errorf("snapshots list: %+v", list)
	}
	var seek struct {
		SnapshotID string `json:"snapshotId"`
	}
	g.ok(admin, &seek, "subscriptions", "seek", "gc-orders-sub", "--snapshot=gc-snap")
	if seek.SnapshotID != snap {
		t.Errorf("subscriptions seek --snapshot: %+v", seek)
	}

	// Removing the binding takes the permission back; set-iam-policy
	// replaces a policy; a subscription's policy.
	g.ok(admin, &pol, "topics", "remove-iam-policy-binding", "gc-orders", "--member="+member, "--role=roles/pubsub.publisher")
	if pol.has("roles/pubsub.publisher", member) {
		t.Errorf("topics remove-iam-policy-binding: %+v", pol)
	}
	mustContain(t, "publish as none after remove-iam-policy-binding", g.fails(none, "topics", "publish", "gc-orders", "--message=no"), "status: 403")
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"bindings": [{"role": "roles/pubsub.viewer", "members": ["user:auditor@example.com"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	g.ok(admin, &pol, "topics", "set-iam-policy", "gc-other", file)
	if len(pol.Bindings) != 1 || !pol.has("roles/pubsub.viewer", "user:auditor@example.com") {
		t.Errorf("topics set-iam-policy: %+v", pol)
	}
	g.ok(admin, &pol, "subscriptions", "get-iam-policy", "gc-orders-sub")
	if len(pol.Bindings) != 0 || pol.Etag == "" {
		t.Errorf("subscriptions get-iam-policy: %+v", pol)
	}
	g.ok(admin, &pol, "subscriptions", "add-iam-policy-binding", "gc-orders-sub", "--member="+member, "--role=roles/pubsub.subscriber")
	if !pol.has("roles/pubsub.subscriber", member) {
		t.Errorf("subscriptions add-iam-policy-binding: %+v", pol)
	}

	// The viewer, and no credentials at all.
	out = g.fails("viewer", "topics", "create", "gc-viewers")
	mustContain(t, "topics create as viewer", out, "status: 403")
	mustContain(t, "topics create as viewer", out, "User not authorized to perform this action")
	out = g.fails("viewer", "topics", "get-iam-policy", "gc-orders")
	mustContain(t, "topics get-iam-policy as viewer", out, "status: 403")
	mustContain(t, "topics get-iam-policy as viewer", out, "PERMISSION_DENIED")
	out = g.fails("", "topics", "list")
	mustContain(t, "topics list without credentials", out, "status: 401")
	mustContain(t, "topics list without credentials", out, "UNAUTHENTICATED")

	// Deleting.
	g.ok(admin, nil, "snapshots", "delete", "gc-snap")
	g.ok(admin, nil, "subscriptions", "delete", "gc-orders-sub")
	g.ok(admin, nil, "schemas", "delete", "gc-schema")
	g.ok(admin, nil, "topics", "delete", "gc-orders", "gc-other")
	g.ok(admin, &list, "topics", "list")
	if len(list) != 0 {
		t.Errorf("topics list after delete: %+v", list)
	}
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q, want it to contain %q", what, got, want)
	}
}
