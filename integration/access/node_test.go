package access

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// nodeProject is the Node.js project of Google's Node client; make test
// installs its node_modules (make node-deps).
const nodeProject = "node"

// nodeClient finds node and the installed client, or skips the test:
// unless JETORDER_REQUIRE_NODE=1 (CI), where a missing one fails it.
func nodeClient(t *testing.T) string {
	t.Helper()
	var msg string
	node, err := exec.LookPath("node")
	if err != nil {
		msg = "node is not installed"
	} else if _, err := os.Stat(filepath.Join(nodeProject, "node_modules", "@google-cloud", "pubsub", "package.json")); err != nil {
		msg = "Google's Node client is not installed: run make node-deps (npm ci in integration/access/node)"
	} else {
		return node
	}
	if os.Getenv("JETORDER_REQUIRE_NODE") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Google's Node.js client (@google-cloud/pubsub) over TLS with a token as
// gRPC call credentials: the publisher publishes with ordering keys, the
// subscriber receives every message in order on each key through a
// streaming pull, the viewer's publish is PERMISSION_DENIED, and one
// without a token UNAUTHENTICATED.
//
// It runs in both delivery modes (the subscription's jetorder-delivery
// label), under strict ordering, which the Node client relies on: it does
// not run a key's handlers one at a time itself.
func TestNodeClientTokenOverTLS(t *testing.T) {
	node := nodeClient(t)
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	for _, delivery := range []string{"partitioned", "per-key"} {
		t.Run(delivery, func(t *testing.T) { nodeTokenOverTLS(t, node, a, sc, delivery) })
	}
}

func nodeTokenOverTLS(t *testing.T, node string, a *itest.Access, sc *itest.Sidecar, delivery string) {
	ctx := ctxT(t)
	admin := sc.GoClientAs(a.Token("admin"))
	topic, sub := "node-orders-"+delivery, "node-orders-"+delivery+"-sub"
	if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath(topic)}); err != nil {
		t.Fatalf("admin CreateTopic: %v", err)
	}
	if _, err := admin.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: subPath(sub), Topic: topicPath(topic), EnableMessageOrdering: true,
		Labels: map[string]string{"jetorder-delivery": delivery},
	}); err != nil {
		t.Fatalf("admin CreateSubscription: %v", err)
	}

	rctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(rctx, node, "access.mjs")
	cmd.Dir = nodeProject
	for _, e := range os.Environ() {
		// None of the user's Google settings: the client must not look for
		// the emulator, other credentials or the metadata server.
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains([]string{"PUBSUB_EMULATOR_HOST", "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB", "GOOGLE_APPLICATION_CREDENTIALS",
			"GOOGLE_CLOUD_UNIVERSE_DOMAIN", "GOOGLE_API_USE_CLIENT_CERTIFICATE", "PUBSUB_PROJECT_ID"}, name) {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env,
		"METADATA_SERVER_DETECTION=none",
		"JETORDER_CA="+a.Certs.CA,
		"JETORDER_GRPC="+sc.GRPC,
		"JETORDER_PROJECT="+itest.Project,
		"JETORDER_TOPIC="+topic,
		"JETORDER_SUBSCRIPTION="+sub,
		"JETORDER_TOKEN_PUBLISHER="+a.Token("publisher"),
		"JETORDER_TOKEN_SUBSCRIBER="+a.Token("subscriber"),
		"JETORDER_TOKEN_VIEWER="+a.Token("viewer"),
	)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node access.mjs: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("node access.mjs took %v", time.Since(start).Round(time.Millisecond))
	type failed struct {
		Code    codes.Code `json:"code"`
		Details string     `json:"details"`
	}
	var out struct {
		Published int `json:"published"`
		Received  []struct {
			Key  string `json:"key"`
			Data string `json:"data"`
		} `json:"received"`
		Viewer, Anonymous failed
	}
	if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil {
		t.Fatalf("node access.mjs printed %q: %v\n%s", stdout.String(), err, stderr.String())
	}

	const keys, perKey = 3, 5
	if out.Published != keys*perKey {
		t.Errorf("published %d, want %d", out.Published, keys*perKey)
	}
	byKey := map[string][]string{}
	for _, m := range out.Received {
		byKey[m.Key] = append(byKey[m.Key], m.Data)
	}
	if len(byKey) != keys {
		t.Errorf("received on keys %v, want %d keys", slices.Sorted(maps.Keys(byKey)), keys)
	}
	for key, got := range byKey {
		var want []string
		for i := range perKey {
			want = append(want, fmt.Sprintf("%s-%d", key, i))
		}
		if !slices.Equal(got, want) {
			t.Errorf("key %s: received %q, want %q", key, got, want)
		}
	}
	if out.Viewer.Code != codes.PermissionDenied {
		t.Errorf("viewer's publish: %+v, want code %d (PERMISSION_DENIED)", out.Viewer, codes.PermissionDenied)
	}
	if out.Anonymous.Code != codes.Unauthenticated {
		t.Errorf("publish without a token: %+v, want code %d (UNAUTHENTICATED)", out.Anonymous, codes.Unauthenticated)
	}
}
