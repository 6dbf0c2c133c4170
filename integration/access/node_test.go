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

// runNode runs script of the Node project with env added to this
// process's environment less the user's Google settings, and returns what
// it printed; a failure fails the test.
func runNode(t *testing.T, node, script string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = nodeProject
	for _, e := range os.Environ() {
		// None of the user's Google settings: the client must not look for
		// the emulator (unless env names it), other credentials or the
		// metadata server.
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains([]string{"PUBSUB_EMULATOR_HOST", "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB", "GOOGLE_APPLICATION_CREDENTIALS",
			"GOOGLE_CLOUD_UNIVERSE_DOMAIN", "GOOGLE_API_USE_CLIENT_CERTIFICATE", "PUBSUB_PROJECT_ID"}, name) {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(append(cmd.Env, "METADATA_SERVER_DETECTION=none"), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s%s", script, err, stdout.String(), stderr.String())
	}
	t.Logf("node %s took %v", script, time.Since(start).Round(time.Millisecond))
	return stdout.String()
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

	stdout := runNode(t, node, "access.mjs",
		"JETORDER_CA="+a.Certs.CA,
		"JETORDER_GRPC="+sc.GRPC,
		"JETORDER_PROJECT="+itest.Project,
		"JETORDER_TOPIC="+topic,
		"JETORDER_SUBSCRIPTION="+sub,
		"JETORDER_TOKEN_PUBLISHER="+a.Token("publisher"),
		"JETORDER_TOKEN_SUBSCRIBER="+a.Token("subscriber"),
		"JETORDER_TOKEN_VIEWER="+a.Token("viewer"),
	)
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
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("node access.mjs printed %q: %v", stdout, err)
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

// Google's Node.js client on one hot key, each message held 20 ms in its
// handler: under strict ordering (the default) the sidecar hands the key's
// next message out only after the previous one's ack, so the client, which
// emits every message as it arrives, never holds two of the key at once
// (AC-003), in both delivery modes. The key's rate is bounded by the
// client's ack batching (batching.maxMilliseconds, 100 ms by default);
// lowered to 5 ms it rises. Pipelined ordering, and Google's emulator,
// which send a key's messages ahead of their acks, put several of the key
// in the Node client's handlers at once: the negative control, why Node
// wants strict ordering.
func TestNodeClientHotKey(t *testing.T) {
	node := nodeClient(t)
	sc := itest.Start(t, sidecar.Config{})
	type result struct {
		Received     []int   `json:"received"`
		Seconds      float64 `json:"seconds"`
		MaxInHandler int     `json:"maxInHandler"`
	}
	run := func(t *testing.T, addr, project, id string, labels map[string]string, n int, env ...string) result {
		t.Helper()
		admin := itest.GoClientOf(t, addr, project)
		ctx := ctxT(t)
		topic := "projects/" + project + "/topics/" + id
		if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
			t.Fatalf("CreateTopic: %v", err)
		}
		if _, err := admin.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
			Name: "projects/" + project + "/subscriptions/" + id + "-sub", Topic: topic, EnableMessageOrdering: true, Labels: labels,
		}); err != nil {
			t.Fatalf("CreateSubscription: %v", err)
		}
		stdout := runNode(t, node, "hotkey.mjs", append([]string{"PUBSUB_EMULATOR_HOST=" + addr, "JETORDER_PROJECT=" + project,
			"JETORDER_TOPIC=" + id, "JETORDER_SUBSCRIPTION=" + id + "-sub", fmt.Sprintf("JETORDER_MESSAGES=%d", n), "JETORDER_HOLD_MS=20"}, env...)...)
		var r result
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("node hotkey.mjs printed %q: %v", stdout, err)
		}
		t.Logf("%d messages of one key in %.2f s: %.0f msgs/s, at most %d in handlers at once", n, r.Seconds, float64(n)/r.Seconds, r.MaxInHandler)
		return r
	}
	strict := func(t *testing.T, r result, n int) {
		t.Helper()
		if r.MaxInHandler != 1 {
			t.Errorf("%d of the key's messages in handlers at once, want 1 (AC-003)", r.MaxInHandler)
		}
		for i, got := range r.Received {
			if got != i {
				t.Fatalf("delivery %d is message %d, want %d (received %v)", i, got, i, r.Received)
			}
		}
		if len(r.Received) != n {
			t.Errorf("received %d messages, want %d", len(r.Received), n)
		}
	}
	for _, delivery := range []string{"partitioned", "per-key"} {
		labels := map[string]string{"jetorder-delivery": delivery}
		t.Run(delivery+"/strict", func(t *testing.T) {
			const n = 20
			strict(t, run(t, sc.GRPC, itest.Project, "hot-"+delivery, labels, n), n)
		})
		t.Run(delivery+"/strict/acks-every-5ms", func(t *testing.T) {
			const n = 100
			strict(t, run(t, sc.GRPC, itest.Project, "hot-fast-"+delivery, labels, n, "JETORDER_ACK_MAX_MS=5"), n)
		})
	}
	t.Run("pipelined", func(t *testing.T) {
		r := run(t, sc.GRPC, itest.Project, "hot-pipelined", map[string]string{"jetorder-ordering": "pipelined"}, 20)
		if r.MaxInHandler < 2 {
			t.Errorf("pipelined ordering put at most %d of the key's messages in the Node client's handlers at once: the test no longer shows why Node wants strict ordering", r.MaxInHandler)
		}
	})
	t.Run("emulator", func(t *testing.T) {
		addr, project := itest.Emulator(t)
		r := run(t, addr, project, "hot-emulator", nil, 20)
		t.Logf("Google's emulator: at most %d of the key's messages in the Node client's handlers at once", r.MaxInHandler)
	})
}
