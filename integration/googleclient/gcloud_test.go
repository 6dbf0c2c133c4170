package googleclient

import (
	"slices"
	"strings"
	"testing"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// A walk through gcloud's pubsub command group against the sidecar's REST
// API, as a user types it: topics, subscriptions, publish, pull, ack and
// deadlines, snapshots and seek, push config, detach, and errors as gcloud
// shows them (NOT_FOUND, ALREADY_EXISTS, INVALID_ARGUMENT,
// FAILED_PRECONDITION). Schemas are integration's TestGcloudSchemas'.
// Skipped where gcloud is not installed.
func TestGcloudWalk(t *testing.T) {
	t.Parallel() // beside TestGoogleClientIntegrationTests: both mostly wait for their clients
	sc := itest.Start(t, sidecar.Config{})
	ok := func(args ...string) string { t.Helper(); out, errOut := sc.Gcloud(false, args...); return out + errOut }
	fails := func(args ...string) string { t.Helper(); out, errOut := sc.Gcloud(true, args...); return out + errOut }
	value := func(args ...string) string {
		t.Helper()
		out, _ := sc.Gcloud(false, args...)
		return strings.TrimSpace(out)
	}

	// Topics.
	mustContain(t, "topics create", ok("topics", "create", "orders", "--labels=team=ops", "--message-retention-duration=1h",
		"--message-storage-policy-allowed-regions=us-east1,europe-west4"), "Created topic [projects/"+itest.Project+"/topics/orders]")
	ok("topics", "create", "dead")
	ok("topics", "update", "orders", "--update-labels=env=prod", "--message-retention-duration=2h")
	if got := value("topics", "describe", "orders", "--format=value(labels.team,labels.env,messageRetentionDuration,messageStoragePolicy.allowedPersistenceRegions)"); got != "ops\tprod\t7200s\tus-east1;europe-west4" {
		t.Errorf("topics describe: %q", got)
	}
	if got := value("topics", "list", "--format=value(name.basename())", "--sort-by=name"); got != "dead\norders" {
		t.Errorf("topics list: %q", got)
	}
	mustContain(t, "topics create of an existing topic", fails("topics", "create", "orders", "--log-http"), "ALREADY_EXISTS")
	mustContain(t, "topics describe of a missing topic", fails("topics", "describe", "missing"), "NOT_FOUND")
	mustContain(t, "topics create with a bad name", fails("topics", "create", "bad name!", "--log-http"), "INVALID_ARGUMENT")

	// Subscriptions.
	ok("subscriptions", "create", "orders-sub", "--topic=orders", "--ack-deadline=30", "--message-filter=attributes:kind",
		"--dead-letter-topic=dead", "--max-delivery-attempts=5", "--min-retry-delay=1s", "--max-retry-delay=10s",
		"--expiration-period=2d", "--message-retention-duration=1h", "--labels=a=b")
	ok("subscriptions", "update", "orders-sub", "--ack-deadline=60", "--update-labels=c=d")
	if got := value("subscriptions", "describe", "orders-sub", "--format=value(ackDeadlineSeconds,filter,deadLetterPolicy.maxDeliveryAttempts,retryPolicy.minimumBackoff,expirationPolicy.ttl,labels.a,labels.c)"); got != "60\tattributes:kind\t5\t1s\t172800s\tb\td" {
		t.Errorf("subscriptions describe: %q", got)
	}
	if got := value("topics", "list-subscriptions", "orders", "--format=value(.)"); got != "projects/"+itest.Project+"/subscriptions/orders-sub" {
		t.Errorf("topics list-subscriptions: %q", got)
	}
	mustContain(t, "subscriptions create of an existing one", fails("subscriptions", "create", "orders-sub", "--topic=orders", "--log-http"), "ALREADY_EXISTS")
	mustContain(t, "subscriptions create with a bad ack deadline", fails("subscriptions", "create", "bad-sub", "--topic=orders", "--ack-deadline=700", "--log-http"), "INVALID_ARGUMENT")
	mustContain(t, "subscriptions create with an expiration under a day", fails("subscriptions", "create", "bad-sub", "--topic=orders", "--expiration-period=1h", "--log-http"), "INVALID_ARGUMENT")
	mustContain(t, "a push endpoint --push-allow does not allow", fails("subscriptions", "create", "bad-sub", "--topic=orders", "--push-endpoint=https://example.com/push"), "not allowed by --push-allow")

	// Publish, pull, deadlines and acks. The filter drops the message without kind.
	ok("topics", "publish", "orders", "--message=one", "--attribute=kind=order")
	ok("topics", "publish", "orders", "--message=dropped")
	ok("topics", "publish", "orders", "--message=two", "--attribute=kind=order")
	mustContain(t, "topics publish to a missing topic", fails("topics", "publish", "missing", "--message=x"), "NOT_FOUND")
	first := value("subscriptions", "pull", "orders-sub", "--limit=1", "--format=value(ackId,message.data.decode(base64))")
	// Without an ordering key the two may come in either order.
	ackID, data, _ := strings.Cut(first, "\t")
	other := map[string]string{"one": "two", "two": "one"}[data]
	if ackID == "" || other == "" {
		t.Fatalf("subscriptions pull: %q", first)
	}
	ok("subscriptions", "modify-message-ack-deadline", "orders-sub", "--ack-ids="+ackID, "--ack-deadline=120")
	ok("subscriptions", "ack", "orders-sub", "--ack-ids="+ackID)
	mustContain(t, "subscriptions ack of a made-up ack id", fails("subscriptions", "ack", "orders-sub", "--ack-ids=bogus"), "INVALID_ARGUMENT")
	if got := value("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit=5", "--format=value(message.data.decode(base64))"); got != other {
		t.Errorf("subscriptions pull --auto-ack: %q, want %s", got, other)
	}
	mustContain(t, "subscriptions pull of a missing subscription", fails("subscriptions", "pull", "missing"), "NOT_FOUND")

	// Snapshots and seek: back to the snapshot, and to before everything.
	ok("snapshots", "create", "snap", "--subscription=orders-sub")
	if got := value("snapshots", "list", "--format=value(name.basename(),topic.basename())"); got != "snap\torders" {
		t.Errorf("snapshots list: %q", got)
	}
	mustContain(t, "snapshots create of an existing one", fails("snapshots", "create", "snap", "--subscription=orders-sub", "--log-http"), "ALREADY_EXISTS")
	ok("subscriptions", "seek", "orders-sub", "--time=2000-01-01T00:00:00Z")
	// A pull returns what is ready when the first message is, as the
	// service's may: the two can come in one pull or two.
	var pulled []string
	for range 5 {
		got := value("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit=5", "--format=value(message.data.decode(base64))")
		if got != "" {
			pulled = append(pulled, strings.Split(got, "\n")...)
		}
		if len(pulled) >= 2 {
			break
		}
	}
	if slices.Sort(pulled); !slices.Equal(pulled, []string{"one", "two"}) {
		t.Errorf("subscriptions pulls after seek --time: %q, want one and two", pulled)
	}
	ok("subscriptions", "seek", "orders-sub", "--snapshot=snap")
	if got := value("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit=5", "--format=value(message.data.decode(base64))"); got != "" {
		t.Errorf("subscriptions pull after seek --snapshot of everything acked: %q", got)
	}
	mustContain(t, "subscriptions seek to a missing snapshot", fails("subscriptions", "seek", "orders-sub", "--snapshot=missing"), "NOT_FOUND")

	// Push config: to push and back to pull.
	ok("subscriptions", "modify-push-config", "orders-sub", "--push-endpoint=http://127.0.0.1:9/push")
	if got := value("subscriptions", "describe", "orders-sub", "--format=value(pushConfig.pushEndpoint)"); got != "http://127.0.0.1:9/push" {
		t.Errorf("push endpoint after modify-push-config: %q", got)
	}
	ok("subscriptions", "modify-push-config", "orders-sub", "--push-endpoint=")

	// Detach: the subscription stays, detached, and cannot be pulled.
	ok("topics", "detach-subscription", "orders-sub")
	if got := value("subscriptions", "describe", "orders-sub", "--format=value(detached)"); got != "True" {
		t.Errorf("detached: %q", got)
	}
	mustContain(t, "subscriptions pull of a detached subscription", fails("subscriptions", "pull", "orders-sub"), "FAILED_PRECONDITION")

	// Deletes.
	ok("snapshots", "delete", "snap", "--quiet")
	ok("subscriptions", "delete", "orders-sub", "--quiet")
	ok("topics", "delete", "orders", "dead", "--quiet")
	mustContain(t, "subscriptions describe after delete", fails("subscriptions", "describe", "orders-sub"), "NOT_FOUND")
	if got := value("topics", "list", "--format=value(name)"); got != "" {
		t.Errorf("topics list after delete: %q", got)
	}
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q, want it to contain %q", what, got, want)
	}
}
